// One sm_90a warpgroup MMA (wgmma.mma_async m64n64k16, bf16 -> fp32) on operands the caller
// lays out in shared memory, for checking on a GPU how the hardware reads the layouts and
// descriptors of src/backend/wgmma_operand.h, which the flash attention's wgmma kernels
// (kernels/flash_attention_mma.cu) are built on and which come from the PTX ISA and CUTLASS's
// documentation, not from a GPU. Its CPU twin is the descriptor's definition itself
// (wgmma_operand_byte): tests/gpu/test_gpu_wgmma.cpp computes D on the host under that reading
// and under its likeliest misreadings, and says which one the GPU's D matches, so a first GPU
// run that finds the kernels wrong also says where.
// The same two forms as the kernels: A and B from shared memory, both K-major (S = Q K^T), and
// A from registers (the mma.sync A fragment of each warp's 16 rows) with B MN-major (O = P V).
#include <string>

#include "backend/mma_fragment.h"
#include "backend/wgmma_operand.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"
// ---- hardware only begin: the CUDA emulation (tests/emulated_cuda) has its own of these.
#include "kernels/ptx_instructions.cuh"
// ---- hardware only end

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 128;  // one warpgroup
constexpr int kColumns = kWgmmaN;

// The image to shared memory by cp.async, fenced for the async proxy (the wgmma's reads), then
// one wgmma; D to d row-major by the accumulators' layout (warp w: rows 16 w .. 16 w + 15, the
// mma.sync C fragment per 8 columns). Two kernels, not a branch: a wgmma behind a branch makes
// ptxas serialize it (C7514).
template <bool kRegistersA>
__global__ void __launch_bounds__(kThreads)
    wgmma_operand_check_kernel(const unsigned char* image, int image_bytes, WgmmaCheckOperand a,
                               WgmmaCheckOperand b, const uint16_t* a_rows, float* d) {
  extern __shared__ __align__(16) float smem[];  // cp.async, descriptors: 16-byte aligned
  unsigned char* shared = reinterpret_cast<unsigned char*>(smem);
  for (int chunk = int(threadIdx.x); chunk < image_bytes / 16; chunk += kThreads) {
    cp_async_16(shared + 16 * chunk, image + 16 * chunk, 16);
  }
  cp_async_commit_group();
  cp_async_wait_group<0>();
  fence_proxy_async_shared();
  __syncthreads();
  const uint32_t base = shared_space_address(shared);
  const uint64_t b_desc = wgmma_descriptor(base + b.start, b.lbo, b.sbo);
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  float acc[kColumns / kMmaN][kMmaCElements];
  if constexpr (kRegistersA) {
    uint32_t fragment[1][kMmaAElements / 2];  // element 2 p in pair p's low half
#pragma unroll
    for (int p = 0; p < kMmaAElements / 2; ++p) {
      const auto element = [&](int i) {
        return a_rows[(kMmaM * warp + mma_a_row(lane, i)) * kWgmmaK + mma_a_col(lane, i)];
      };
      fragment[0][p] = pack_bf16_pair(element(2 * p), element(2 * p + 1));
    }
    wgmma_fence_operands(fragment);  // written before the fence, as the kernels' A fragments
    wgmma_fence();
    wgmma_m64n64k16_rs_trans_b(acc, fragment[0], b_desc, 0);
  } else {
    wgmma_fence();
    wgmma_m64n64k16_ss(acc, wgmma_descriptor(base + a.start, a.lbo, a.sbo), b_desc, 0);
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operands(acc);
#pragma unroll
  for (int j = 0; j < kColumns / kMmaN; ++j) {
#pragma unroll
    for (int i = 0; i < kMmaCElements; ++i) {
      d[(kMmaM * warp + mma_c_row(lane, i)) * kColumns + kMmaN * j + mma_c_col(lane, i)] =
          acc[j][i];
    }
  }
}

}  // namespace

void wgmma_operand_check(const void* image, int image_bytes, WgmmaCheckOperand a,
                         WgmmaCheckOperand b, const uint16_t* a_rows, float* d,
                         cudaStream_t stream) {
  int device = 0;
  GNMR_CUDA_CHECK(cudaGetDevice(&device));
  const std::string unavailable = flash_wgmma_unavailable(device);
  if (!unavailable.empty()) {
    throw Error(ErrorKind::Runtime, "wgmma_operand_check: wgmma does not run here: " + unavailable);
  }
  constexpr int kMaxImageBytes = 48 * 1024;  // the default dynamic shared memory limit
  if (image_bytes <= 0 || image_bytes % 16 != 0 || image_bytes > kMaxImageBytes) {
    throw Error(ErrorKind::Runtime, "wgmma_operand_check: an image of " +
                                        std::to_string(image_bytes) +
                                        " bytes; it takes a multiple of 16 up to 48 KiB");
  }
  const auto* bytes = static_cast<const unsigned char*>(image);
  if (a_rows != nullptr) {
    wgmma_operand_check_kernel<true>
        <<<1, kThreads, size_t(image_bytes), stream>>>(bytes, image_bytes, a, b, a_rows, d);
  } else {
    wgmma_operand_check_kernel<false>
        <<<1, kThreads, size_t(image_bytes), stream>>>(bytes, image_bytes, a, b, a_rows, d);
  }
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
