// GNMR_ISA_CLONES: compile a hot loop three times — for the x86-64 baseline (SSE2), x86-64-v3
// (AVX2) and x86-64-v4 (AVX-512) — and let the loader pick the copy this CPU runs (gcc's
// target_clones, an ifunc resolved once). The default build is portable (README "Build"): a
// binary built on a login node runs on any x86-64 node, and the few loops that matter still
// get wide vectors. Results do not depend on the copy: FMA contraction is off and no fast
// math is on, so every copy rounds every operation the same way. `flatten` inlines every call
// the loop makes into each copy: a helper left out of line would run its baseline build.
//
// An OpenMP region's body is compiled once, outside the clones, so a cloned function is called
// from inside the region (once per thread, on its share of the rows), never the other way.
// Empty with -DGNMR_NATIVE=ON (the whole binary is then built for the build machine) and off
// x86-64 or gcc.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(GNMR_NATIVE_BUILD)
#define GNMR_ISA_CLONES \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4"), flatten))
#else
#define GNMR_ISA_CLONES
#endif

#include <omp.h>

#include <cstdint>

namespace gnmr {
namespace cpu {

// Calls range(begin, end) once on each of `threads` OpenMP threads with its share of
// [0, count) (contiguous, in thread order): the way into a GNMR_ISA_CLONES function from a
// parallel region. For loops whose iterations are independent, so the split is invisible.
template <typename Range>
void for_each_thread_range(int64_t count, int threads, Range range) {
#pragma omp parallel num_threads(threads)
  {
    const int64_t thread = omp_get_thread_num(), team = omp_get_num_threads();
    range(count * thread / team, count * (thread + 1) / team);
  }
}

}  // namespace cpu
}  // namespace gnmr
