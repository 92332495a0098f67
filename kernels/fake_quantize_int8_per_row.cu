// Symmetric int8 fake quantization with one scale per row (recipe int8: per-token activations
// and output gradients, per-output-channel weights). One thread per row running the CPU's own
// row function: bit-identical, and slow on wide rows (a block-per-row version is the fast one).
// CPU twin: gnmr::fake_quantize_int_per_row(..., 8, ...) in src/precision/fake_quantize_int.h,
// which calls the same fake_quantize_int_row.
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"
#include "precision/fake_quantize_int.h"

namespace gnmr::cuda {
namespace {

__global__ void fake_quantize_int8_per_row_kernel(const float* x, int64_t rows, int64_t cols,
                                                  float* out) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (row < rows) fake_quantize_int_row(x + row * cols, cols, 8, out + row * cols);
}

}  // namespace

void fake_quantize_int8_per_row(const float* x, int64_t rows, int64_t cols, float* out,
                                cudaStream_t stream) {
  if (rows == 0) return;
  constexpr int kThreads = 128;
  const int blocks = static_cast<int>((rows + kThreads - 1) / kThreads);
  fake_quantize_int8_per_row_kernel<<<blocks, kThreads, 0, stream>>>(x, rows, cols, out);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
