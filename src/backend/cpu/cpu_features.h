// What this x86-64 CPU and its operating system let a program run: the vector instruction
// sets, each counted only when the OS also saves its registers (XCR0), as cpuid documents
// (Intel SDM vol. 1 §13.3 and §15.2). Plain data, so the BLAS kernel choice
// (blas_kernel.h) is a pure function that tests feed with feature sets of other CPUs.
#pragma once

#include <string>

namespace gnmr {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...; empty off x86
  std::string model_name;
  bool sse3 = false;
  bool avx = false;          // and the OS saves the YMM state
  bool avx2 = false;         // and the OS saves the YMM state
  bool fma = false;          // and the OS saves the YMM state
  bool avx512 = false;       // F, CD, BW, DQ and VL (SkylakeX's set), and the OS saves ZMM state
  bool avx512_bf16 = false;  // AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4)
  int logical_cores = 0;     // that this process may run on
  double clock_ghz = 0;      // the clock /proc/cpuinfo reports (no turbo); 0 when unknown
};

// The features of the CPU this process runs on.
CpuFeatures detect_cpu_features();

// "AVX-512 BF16", "AVX-512", "AVX2+FMA", "AVX", "SSE3" or "none": the widest set present.
std::string widest_vector_isa(const CpuFeatures& cpu);

}  // namespace gnmr
