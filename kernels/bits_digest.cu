// The bits digest of a device buffer (src/backend/bits_digest.h): whether two kernels wrote the
// same bits, learned without keeping a copy of either output. The CUDA backend compares the
// tensor-core flash kernels' instructions with it before it times them (docs/DESIGN.md §6).
// CPU twin: gnmr::bits_digest (the same terms; integer sums in any order give the same digest).
// A fixed grid of kBitsDigestPartials blocks, each thread summing its grid-strided words; each
// block's sum goes to partials[block], which the host reads back and adds. No atomics.
#include <vector>

#include "backend/bits_digest.h"
#include "kernels/cuda_check.cuh"
#include "kernels/train_ops.cuh"
#include "util/error.h"

namespace gnmr::cuda {
namespace {

constexpr int kDigestThreads = 256;

__global__ void __launch_bounds__(kDigestThreads)
    bits_digest_kernel(const uint32_t* words, int64_t count, uint64_t* partials) {
  uint64_t sum = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    sum += bits_digest_term(uint64_t(i), words[i]);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
  }
  __shared__ uint64_t warp_sums[kDigestThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t block_sum = 0;
    for (int w = 0; w < kDigestThreads / 32; ++w) block_sum += warp_sums[w];
    partials[blockIdx.x] = block_sum;
  }
}

}  // namespace

uint64_t bits_digest(const void* words, int64_t count, uint64_t* partials, cudaStream_t stream) {
  GNMR_CHECK(count >= 0, "bits_digest: negative word count");
  bits_digest_kernel<<<kBitsDigestPartials, kDigestThreads, 0, stream>>>(
      static_cast<const uint32_t*>(words), count, partials);
  GNMR_CUDA_CHECK(cudaGetLastError());
  std::vector<uint64_t> host(kBitsDigestPartials);
  GNMR_CUDA_CHECK(cudaMemcpyAsync(host.data(), partials, sizeof(uint64_t) * host.size(),
                                  cudaMemcpyDeviceToHost, stream));
  GNMR_CUDA_CHECK(cudaStreamSynchronize(stream));
  uint64_t digest = 0;
  for (uint64_t partial : host) digest += partial;
  return digest;
}

}  // namespace gnmr::cuda
