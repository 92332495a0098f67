// Which OpenBLAS kernel (its "core": OPENBLAS_CORETYPE) this CPU should run, as a pure
// function of plain data. OpenBLAS picks its kernel once, when the library loads, from a
// table of CPU models; a CPU newer than the library (Debian 12's 0.3.21 on Sapphire or
// Emerald Rapids) falls back to "Prescott", SSE3 kernels at a quarter of the AVX-512 speed.
// blas_autotune.h uses this decision to re-execute gnmr with the right kernel forced.
#pragma once

#include <string>

#include "backend/cpu/cpu_features.h"

namespace gnmr {

// An x86 OpenBLAS kernel family, by the vector instructions its GEMM kernels use.
struct BlasKernelClass {
  int rank = 0;  // 0 unknown name; 1 SSE; 2 AVX; 3 AVX2+FMA; 4 AVX-512; 5 AVX-512 BF16
  const char* isa = "unknown";
  int fp32_flops_per_cycle = 0;  // per core, two vector pipes (see nominal_sgemm_gflops)
};

// The class of an OpenBLAS core name as openblas_get_corename() spells it (case-insensitive);
// rank 0 for a name this table does not know.
BlasKernelClass blas_kernel_class(const std::string& core_name);

// The best kernel this CPU can run among those OpenBLAS 0.3.x's DYNAMIC_ARCH builds carry:
// Cooperlake (AVX-512 BF16), SkylakeX (AVX-512), Haswell or, on AMD, Zen (AVX2+FMA),
// Sandybridge (AVX); empty when the CPU has none of those.
std::string best_blas_kernel_for(const CpuFeatures& cpu);

struct BlasKernelDecision {
  std::string force;   // the OPENBLAS_CORETYPE to re-execute with; empty: keep the library's
  std::string reason;  // one sentence, for the log
};

// library_kernel: what the library chose by itself (openblas_get_corename()). A kernel is
// forced only when it is strictly stronger than the library's choice and the library's choice
// is a name this table knows (an unknown name may be a newer, better kernel).
BlasKernelDecision decide_blas_kernel(const CpuFeatures& cpu, const std::string& library_kernel);

// cores × clock × flops per cycle of the kernel's instruction set: what the kernel could reach
// at the clock /proc/cpuinfo reports, with two vector pipes per core (one-FMA-unit AVX-512 parts
// and turbo clocks make the real figure differ; it is a yardstick, not a measurement).
double nominal_sgemm_gflops(const BlasKernelClass& kernel, int cores, double clock_ghz);

}  // namespace gnmr
