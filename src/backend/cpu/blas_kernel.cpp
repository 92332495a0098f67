// OpenBLAS x86 core names from its driver/others/dynamic.c (0.3.21), grouped by the vector
// instructions of their sgemm kernels (kernel/x86_64/KERNEL.<core>).
#include "backend/cpu/blas_kernel.h"

#include <algorithm>
#include <cctype>

namespace gnmr {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

// fp32 flops per cycle per core with two vector pipes: SSE and AVX kernels issue a multiply and
// an add (4 or 8 lanes each), the FMA kernels two fused multiply-adds (8 or 16 lanes, 2 flops).
constexpr BlasKernelClass kSse{1, "SSE3", 8};
constexpr BlasKernelClass kAvx{2, "AVX", 16};
constexpr BlasKernelClass kAvx2{3, "AVX2+FMA", 32};
constexpr BlasKernelClass kAvx512{4, "AVX-512", 64};
constexpr BlasKernelClass kAvx512Bf16{5, "AVX-512 BF16", 64};

}  // namespace

BlasKernelClass blas_kernel_class(const std::string& core_name) {
  const std::string name = lower(core_name);
  for (const char* sse : {"katmai", "coppermine", "northwood", "prescott", "banias", "atom",
                          "core2", "penryn", "dunnington", "nehalem", "athlon", "opteron",
                          "opteron_sse3", "barcelona", "nano", "bobcat"}) {
    if (name == sse) return kSse;
  }
  for (const char* avx : {"sandybridge", "bulldozer", "piledriver"}) {
    if (name == avx) return kAvx;
  }
  for (const char* avx2 : {"haswell", "steamroller", "excavator", "zen"}) {
    if (name == avx2) return kAvx2;
  }
  if (name == "skylakex") return kAvx512;
  if (name == "cooperlake" || name == "sapphirerapids") return kAvx512Bf16;
  return BlasKernelClass{};
}

std::string best_blas_kernel_for(const CpuFeatures& cpu) {
  if (cpu.avx512_bf16) return "Cooperlake";
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2 && cpu.fma) return cpu.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
  if (cpu.avx) return "Sandybridge";
  return "";
}

BlasKernelDecision decide_blas_kernel(const CpuFeatures& cpu, const std::string& library_kernel) {
  const std::string best = best_blas_kernel_for(cpu);
  const BlasKernelClass chosen = blas_kernel_class(library_kernel);
  if (best.empty())
    return {"", "no AVX on this CPU: OpenBLAS's " + library_kernel + " kernel is kept"};
  if (chosen.rank == 0) {
    return {"", "OpenBLAS chose " + library_kernel + ", a kernel gnmr does not know; kept"};
  }
  const BlasKernelClass wanted = blas_kernel_class(best);
  if (chosen.rank >= wanted.rank) {
    return {"",
            "OpenBLAS chose " + library_kernel + " (" + chosen.isa + "), the best this CPU runs"};
  }
  return {best, "OpenBLAS chose " + library_kernel + " (" + chosen.isa + ") on a CPU with " +
                    widest_vector_isa(cpu) + "; " + best + " (" + wanted.isa + ") runs here"};
}

double nominal_sgemm_gflops(const BlasKernelClass& kernel, int cores, double clock_ghz) {
  return double(cores) * clock_ghz * double(kernel.fp32_flops_per_cycle);
}

}  // namespace gnmr
