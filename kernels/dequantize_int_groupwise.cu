// Group-wise integer dequantization on the GPU: out = code * scale.
// CPU twin: gnmr::dequantize_int_groupwise in src/precision/quantize_groupwise.h; both call
// dequantize_int_groupwise_element, so the floats are identical.
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void dequantize_int_groupwise_kernel(const uint8_t* packed, const float* scales,
                                                int64_t rows, int64_t cols, GroupwiseSpec spec,
                                                float* out) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = dequantize_int_groupwise_element(packed, scales, i / cols, i % cols, cols, spec);
  }
}

}  // namespace

void dequantize_int_groupwise(const uint8_t* packed, const float* scales, int64_t rows,
                              int64_t cols, const GroupwiseSpec& spec, float* out,
                              cudaStream_t stream) {
  validate_groupwise_spec(cols, spec);
  const int64_t total = rows * cols;
  if (total == 0) return;
  const int blocks =
      static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 1 << 20));
  dequantize_int_groupwise_kernel<<<blocks, kThreads, 0, stream>>>(packed, scales, rows, cols, spec,
                                                                   out);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
