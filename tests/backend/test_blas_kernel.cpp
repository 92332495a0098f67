// The OpenBLAS kernel decision (src/backend/cpu/blas_kernel.h) on CPUs given as plain data.
#include <gtest/gtest.h>

#include "backend/cpu/blas_kernel.h"

namespace gnmr {
namespace {

CpuFeatures intel(bool avx, bool avx2_fma, bool avx512, bool bf16) {
  CpuFeatures cpu;
  cpu.vendor = "GenuineIntel";
  cpu.sse3 = true;
  cpu.avx = avx;
  cpu.avx2 = cpu.fma = avx2_fma;
  cpu.avx512 = avx512;
  cpu.avx512_bf16 = bf16;
  return cpu;
}

const CpuFeatures kSapphireRapids = intel(true, true, true, true);
const CpuFeatures kSkylakeServer = intel(true, true, true, false);
const CpuFeatures kHaswell = intel(true, true, false, false);

TEST(BlasKernelDecision, ForcesCooperlakeWhenTheLibraryFellBackToPrescottOnSapphireRapids) {
  const BlasKernelDecision d = decide_blas_kernel(kSapphireRapids, "Prescott");
  EXPECT_EQ(d.force, "Cooperlake");
  EXPECT_NE(d.reason.find("Prescott"), std::string::npos) << d.reason;
}

TEST(BlasKernelDecision, ForcesSkylakeXOnAvx512WithoutBf16) {
  EXPECT_EQ(decide_blas_kernel(kSkylakeServer, "Prescott").force, "SkylakeX");
  EXPECT_EQ(decide_blas_kernel(kSkylakeServer, "Haswell").force, "SkylakeX");
}

TEST(BlasKernelDecision, KeepsAGoodOrBetterChoice) {
  EXPECT_EQ(decide_blas_kernel(kSapphireRapids, "Cooperlake").force, "");
  EXPECT_EQ(decide_blas_kernel(kSapphireRapids, "COOPERLAKE").force, "");  // case-insensitive
  EXPECT_EQ(decide_blas_kernel(kSapphireRapids, "SapphireRapids").force, "");
  EXPECT_EQ(decide_blas_kernel(kSkylakeServer, "SkylakeX").force, "");
  EXPECT_EQ(decide_blas_kernel(kHaswell, "Haswell").force, "");
  EXPECT_EQ(decide_blas_kernel(kHaswell, "Zen").force, "");  // same instructions
}

TEST(BlasKernelDecision, KeepsANameItDoesNotKnow) {
  // A newer library may name a better kernel than this table holds: never downgrade it.
  EXPECT_EQ(decide_blas_kernel(kSapphireRapids, "GraniteRapids").force, "");
}

TEST(BlasKernelDecision, NeedsTheOperatingSystemToSaveTheWideRegisters) {
  // An AVX-512 CPU under an OS (or hypervisor) that does not enable ZMM state: detect reports
  // avx512 = false there, and the decision stops at AVX2.
  CpuFeatures cpu = kSapphireRapids;
  cpu.avx512 = cpu.avx512_bf16 = false;
  EXPECT_EQ(decide_blas_kernel(cpu, "Prescott").force, "Haswell");
}

TEST(BlasKernelDecision, ChoosesZenOnAmdWithAvx2) {
  CpuFeatures zen3 = kHaswell;
  zen3.vendor = "AuthenticAMD";
  EXPECT_EQ(decide_blas_kernel(zen3, "Prescott").force, "Zen");
  CpuFeatures zen4 = kSapphireRapids;
  zen4.vendor = "AuthenticAMD";
  EXPECT_EQ(decide_blas_kernel(zen4, "Zen").force, "Cooperlake");
}

TEST(BlasKernelDecision, LeavesACpuWithoutAvxAlone) {
  EXPECT_EQ(decide_blas_kernel(intel(false, false, false, false), "Prescott").force, "");
  EXPECT_EQ(decide_blas_kernel(intel(true, false, false, false), "Prescott").force, "Sandybridge");
}

TEST(BlasKernelClass, NominalRatesFollowTheVectorWidth) {
  // Two vector pipes per core: SSE multiply + add 4 lanes -> 8 flops per cycle; AVX-512 FMA 16
  // lanes × 2 flops × 2 pipes -> 64.
  EXPECT_DOUBLE_EQ(nominal_sgemm_gflops(blas_kernel_class("Prescott"), 2, 2.0), 32.0);
  EXPECT_DOUBLE_EQ(nominal_sgemm_gflops(blas_kernel_class("Haswell"), 2, 2.0), 128.0);
  EXPECT_DOUBLE_EQ(nominal_sgemm_gflops(blas_kernel_class("SkylakeX"), 2, 2.0), 256.0);
  EXPECT_EQ(blas_kernel_class("Unknown").rank, 0);
  EXPECT_LT(blas_kernel_class("Sandybridge").rank, blas_kernel_class("Haswell").rank);
}

TEST(CpuFeatures, WidestIsaNamesTheStrongestSet) {
  EXPECT_EQ(widest_vector_isa(kSapphireRapids), "AVX-512 BF16");
  EXPECT_EQ(widest_vector_isa(kHaswell), "AVX2+FMA");
  EXPECT_EQ(widest_vector_isa(CpuFeatures{}), "none");
}

TEST(CpuFeatures, DetectionIsConsistentOnThisMachine) {
  // Whatever this CPU is, a wider set implies the narrower ones the kernels also use.
  const CpuFeatures cpu = detect_cpu_features();
  EXPECT_TRUE(!cpu.avx512_bf16 || cpu.avx512);
  EXPECT_TRUE(!cpu.avx512 || (cpu.avx2 && cpu.fma));
  EXPECT_TRUE(!cpu.avx2 || cpu.avx);
  EXPECT_GE(cpu.logical_cores, 1);
}

}  // namespace
}  // namespace gnmr
