// Group-wise integer dequantization on the GPU: out = code * scale.
// CPU twin: gnmr::dequantize_int_groupwise in src/precision/quantize_groupwise.h; both call
// dequantize_int_groupwise_element, so the floats are identical.
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;

// Rows along y and a row's elements along x, each grid-strided: the row and column come from
// the launch, not from dividing a flat index (two 64-bit divisions per element, ~70
// instructions each).
__global__ void dequantize_int_groupwise_kernel(const uint8_t* packed, const float* scales,
                                                int64_t rows, int64_t cols, GroupwiseSpec spec,
                                                float* out) {
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    for (int64_t col = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; col < cols;
         col += int64_t{gridDim.x} * blockDim.x) {
      out[row * cols + col] =
          dequantize_int_groupwise_element(packed, scales, row, col, cols, spec);
    }
  }
}

}  // namespace

void dequantize_int_groupwise(const uint8_t* packed, const float* scales, int64_t rows,
                              int64_t cols, const GroupwiseSpec& spec, float* out,
                              cudaStream_t stream) {
  validate_groupwise_spec(cols, spec);
  if (rows == 0 || cols == 0) return;
  const dim3 grid(
      static_cast<unsigned>(std::min<int64_t>((cols + kThreads - 1) / kThreads, 1 << 16)),
      strided_grid_y(rows));
  dequantize_int_groupwise_kernel<<<grid, kThreads, 0, stream>>>(packed, scales, rows, cols, spec,
                                                                 out);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
