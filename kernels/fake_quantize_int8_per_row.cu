// Symmetric int8 fake quantization with one scale per row (recipe int8: per-token activations
// and output gradients, per-output-channel weights). One block per row: its threads stride over
// the row (coalesced) for the absmax, combine it with block_max (a max: the CPU loop's value in
// any order), then write every element with the CPU's element function, so the result is
// bit-identical. In place is safe: each thread writes only elements it read itself, after the
// block's barrier. CPU twin: gnmr::fake_quantize_int_per_row(..., 8, ...) in
// src/precision/fake_quantize_int.h.
#include <algorithm>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"
#include "precision/fake_quantize_int.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 20;  // rows beyond it are strided over

__global__ void fake_quantize_int8_per_row_kernel(const float* x, int64_t rows, int64_t cols,
                                                  float* out) {
  const int qmax = int_qmax(8);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* in = x + row * cols;
    float* o = out + row * cols;
    float absmax = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) absmax = fmaxf(absmax, fabsf(in[c]));
    const float scale = groupwise_scale(block_max(absmax), 8);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      o[c] = fake_quantize_int_element(in[c], scale, qmax);
    }
  }
}

}  // namespace

void fake_quantize_int8_per_row(const float* x, int64_t rows, int64_t cols, float* out,
                                cudaStream_t stream) {
  if (rows == 0) return;
  const int blocks = static_cast<int>(std::min(rows, kMaxBlocks));
  fake_quantize_int8_per_row_kernel<<<blocks, kThreads, 0, stream>>>(x, rows, cols, out);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
