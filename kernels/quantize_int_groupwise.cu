// Group-wise symmetric integer quantization of activations on the GPU.
// CPU twin: gnmr::quantize_int_groupwise in src/precision/quantize_groupwise.h; both call
// groupwise_scale and quantize_int_groupwise_byte, so packed bytes and scales are identical.
//
// Two passes: (1) one block per group reduces absmax -> scale (for kGroupTensor, a grid-wide
// atomicMax on the float bits, then one thread divides); (2) one thread per output byte
// quantizes that byte's 1, 2 or 4 elements. Per-byte work keeps odd group sizes race-free.
#include <algorithm>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"

namespace gnmr::cuda {
namespace {

constexpr int kReduceThreads = 128;
constexpr int kPackThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 20;

int grid_for(int64_t work, int threads_per_block, int64_t per_thread = 1) {
  const int64_t blocks =
      (work + threads_per_block * per_thread - 1) / (threads_per_block * per_thread);
  return static_cast<int>(std::max<int64_t>(1, std::min(blocks, kMaxBlocks)));
}

// scales[s] for every group s of `group` contiguous elements (groups_per_row per row).
__global__ void group_scales_kernel(const float* x, int64_t cols, int64_t group,
                                    int64_t scale_count, int bits, float* scales) {
  const int64_t groups_per_row = cols / group;
  for (int64_t s = blockIdx.x; s < scale_count; s += gridDim.x) {
    const float* base = x + (s / groups_per_row) * cols + (s % groups_per_row) * group;
    float absmax = 0.0f;
    for (int64_t i = threadIdx.x; i < group; i += blockDim.x)
      absmax = fmaxf(absmax, fabsf(base[i]));
    absmax = block_max(absmax);
    if (threadIdx.x == 0) scales[s] = groupwise_scale(absmax, bits);
  }
}

// absmax_bits (zeroed before) <- max over x of |x| as float bits; non-negative floats order
// like their bit patterns, and fmaxf drops NaN, so the integer atomicMax is exact.
__global__ void tensor_absmax_kernel(const float* x, int64_t count, unsigned int* absmax_bits) {
  float absmax = 0.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    absmax = fmaxf(absmax, fabsf(x[i]));
  }
  absmax = block_max(absmax);
  if (threadIdx.x == 0) atomicMax(absmax_bits, __float_as_uint(absmax));
}

__global__ void tensor_scale_kernel(float* scale, int bits) {
  *scale = groupwise_scale(__uint_as_float(*reinterpret_cast<unsigned int*>(scale)), bits);
}

// Rows along y and a row's bytes along x, each grid-strided: the row and byte come from the
// launch, not from dividing a flat index (a 64-bit division per byte, ~70 instructions).
__global__ void quantize_pack_kernel(const float* x, int64_t rows, int64_t cols, GroupwiseSpec spec,
                                     const float* scales, RngKey key, uint8_t* packed) {
  const int64_t row_bytes = packed_row_bytes(cols, spec.bits);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < row_bytes;
         b += int64_t{gridDim.x} * blockDim.x) {
      packed[row * row_bytes + b] = quantize_int_groupwise_byte(x, row, cols, b, spec, scales, key);
    }
  }
}

}  // namespace

void quantize_int_groupwise(const float* x, int64_t rows, int64_t cols, const GroupwiseSpec& spec,
                            uint8_t* packed, float* scales, RngKey key, cudaStream_t stream) {
  validate_groupwise_spec(cols, spec);
  const int64_t elements = rows * cols;
  if (spec.group_size == kGroupTensor) {
    GNMR_CUDA_CHECK(cudaMemsetAsync(scales, 0, sizeof(float), stream));
    if (elements > 0) {
      tensor_absmax_kernel<<<grid_for(elements, kReduceThreads, 8), kReduceThreads, 0, stream>>>(
          x, elements, reinterpret_cast<unsigned int*>(scales));
      GNMR_CUDA_CHECK(cudaGetLastError());
    }
    tensor_scale_kernel<<<1, 1, 0, stream>>>(scales, spec.bits);
    GNMR_CUDA_CHECK(cudaGetLastError());
  } else if (elements > 0) {
    const int64_t group = spec.group_size == kGroupRow ? cols : spec.group_size;
    const int64_t count = static_cast<int64_t>(scale_count(rows, cols, spec));
    group_scales_kernel<<<grid_for(count, 1), kReduceThreads, 0, stream>>>(x, cols, group, count,
                                                                           spec.bits, scales);
    GNMR_CUDA_CHECK(cudaGetLastError());
  }
  const int64_t row_bytes = packed_row_bytes(cols, spec.bits);
  if (rows == 0 || row_bytes == 0) return;
  const dim3 grid(static_cast<unsigned>(grid_for(row_bytes, kPackThreads)), strided_grid_y(rows));
  quantize_pack_kernel<<<grid, kPackThreads, 0, stream>>>(x, rows, cols, spec, scales, key, packed);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
