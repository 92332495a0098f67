// Group-wise integer dequantization on the GPU: out = code * scale, as fp32 or (a bf16 GEMM's
// operand) rounded to bf16 as it is written, where a dequantization and a conversion would
// write the fp32 values and read them back.
// CPU twins: gnmr::dequantize_int_groupwise in src/precision/quantize_groupwise.h, and for the
// bf16 form encode_bf16 (src/precision/bf16.h) of each of its floats, which convert_to_bf16
// applies too; both call dequantize_int_groupwise_element, so the bits are identical.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"
#include "precision/bf16.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;

// The element as each output type stores it.
struct Fp32Out {
  __device__ static float store(float x) { return x; }
};
struct Bf16Out {
  __device__ static uint16_t store(float x) { return encode_bf16(x); }
};

// Rows along y and a row's elements along x, each grid-strided: the row and column come from
// the launch, not from dividing a flat index (two 64-bit divisions per element, ~70
// instructions each).
template <typename Out, typename T>
__global__ void dequantize_int_groupwise_kernel(const uint8_t* packed, const float* scales,
                                                int64_t rows, int64_t cols, GroupwiseSpec spec,
                                                T* out) {
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    for (int64_t col = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; col < cols;
         col += int64_t{gridDim.x} * blockDim.x) {
      out[row * cols + col] =
          Out::store(dequantize_int_groupwise_element(packed, scales, row, col, cols, spec));
    }
  }
}

template <typename Out, typename T>
void launch_dequantize(const uint8_t* packed, const float* scales, int64_t rows, int64_t cols,
                       const GroupwiseSpec& spec, T* out, cudaStream_t stream) {
  validate_groupwise_spec(cols, spec);
  if (rows == 0 || cols == 0) return;
  const dim3 grid(
      static_cast<unsigned>(std::min<int64_t>((cols + kThreads - 1) / kThreads, 1 << 16)),
      strided_grid_y(rows));
  dequantize_int_groupwise_kernel<Out, T>
      <<<grid, kThreads, 0, stream>>>(packed, scales, rows, cols, spec, out);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void dequantize_int_groupwise(const uint8_t* packed, const float* scales, int64_t rows,
                              int64_t cols, const GroupwiseSpec& spec, float* out,
                              cudaStream_t stream) {
  launch_dequantize<Fp32Out>(packed, scales, rows, cols, spec, out, stream);
}

void dequantize_int_groupwise_to_bf16(const uint8_t* packed, const float* scales, int64_t rows,
                                      int64_t cols, const GroupwiseSpec& spec, uint16_t* out,
                                      cudaStream_t stream) {
  launch_dequantize<Bf16Out>(packed, scales, rows, cols, spec, out, stream);
}

}  // namespace gnmr::cuda
