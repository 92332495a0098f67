// Group-wise symmetric integer quantization of activations on the GPU.
// CPU twin: gnmr::quantize_int_groupwise in src/precision/quantize_groupwise.h; both call
// groupwise_scale and quantize_int_groupwise_code, so packed bytes and scales are identical.
//
// Groups of 128, 256, 512 or 1024 elements (actq's 128 among them) take one pass, a warp a
// group: each lane loads four elements per 128 with one 16-byte load, keeps them in registers
// through the warp's absmax, and writes their codes' 1, 2 or 4 bytes (pack_int_codes_x4). One
// read of x, where the general path below reads it twice and gives each group a block of its
// own, a scheduling cost per 128 elements.
// The general path, for every other spec: (1) one block per group reduces absmax -> scale (for
// kGroupTensor, a grid-wide atomicMax on the float bits, then one thread divides); (2) one
// thread per output byte quantizes that byte's 1, 2 or 4 elements. Per-byte work keeps odd
// group sizes race-free.
#include <algorithm>
#include <cstdint>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/quantize.cuh"

namespace gnmr::cuda {
namespace {

constexpr int kReduceThreads = 128;
constexpr int kPackThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 20;
constexpr int kGroupWarpThreads = 256;  // 8 warps, 8 groups at a time
constexpr int kGroupChunk = 128;        // a warp's 16-byte loads cover 128 floats

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

// One warp per group of kChunks * 128 elements (grid-strided over the groups, row-major, so
// group g's scale is scales[g]). The absmax is a max, exact in any order, and fmaxf drops NaN
// as the CPU's does, so the scale's bits are the CPU's.
template <int kChunks>
__global__ void __launch_bounds__(kGroupWarpThreads)
    quantize_int_groups_by_warp_kernel(const float* x, int64_t rows, int64_t cols,
                                       GroupwiseSpec spec, RngKey key, uint8_t* packed,
                                       float* scales) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t warps = kGroupWarpThreads / 32;
  const int64_t group = int64_t{kChunks} * kGroupChunk;
  const int64_t groups_per_row = cols / group;
  const int64_t groups = rows * groups_per_row;
  const int per_byte_log2 = int_codes_per_byte_log2(spec.bits);
  const int64_t row_bytes = packed_row_bytes(cols, spec.bits);
  for (int64_t g = blockIdx.x * warps + threadIdx.x / 32; g < groups; g += gridDim.x * warps) {
    const int64_t row = g / groups_per_row;  // one 64-bit division per group, not per element
    const int64_t first_col = (g - row * groups_per_row) * group;
    const float4* base = reinterpret_cast<const float4*>(x + row * cols + first_col);
    float4 v[kChunks];
    float absmax = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      v[c] = base[c * (kGroupChunk / 4) + lane];
      absmax = fmaxf(
          absmax, fmaxf(fmaxf(fabsf(v[c].x), fabsf(v[c].y)), fmaxf(fabsf(v[c].z), fabsf(v[c].w))));
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset));
    }
    const float scale = groupwise_scale(absmax, spec.bits);
    if (lane == 0) scales[g] = scale;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t col = first_col + c * kGroupChunk + 4 * lane;
      const int64_t index = row * cols + col;
      const int codes[4] = {quantize_int_groupwise_code(v[c].x, index, scale, spec, key),
                            quantize_int_groupwise_code(v[c].y, index + 1, scale, spec, key),
                            quantize_int_groupwise_code(v[c].z, index + 2, scale, spec, key),
                            quantize_int_groupwise_code(v[c].w, index + 3, scale, spec, key)};
      const uint32_t word = pack_int_codes_x4(codes, spec.bits);
      // The lane's bytes start at a multiple of their count: rows are whole multiples of 128
      // elements, and the caller checked packed's 4-byte alignment.
      uint8_t* out = packed + row * row_bytes + (col >> per_byte_log2);
      if (per_byte_log2 == 0) {
        *reinterpret_cast<uint32_t*>(out) = word;
      } else if (per_byte_log2 == 1) {
        *reinterpret_cast<uint16_t*>(out) = static_cast<uint16_t>(word);
      } else {
        *out = static_cast<uint8_t>(word);
      }
    }
  }
}

// Launches the warp-per-group kernel where it takes the call: groups of 128, 256, 512 or 1024
// elements, x on a 16-byte boundary (its float4 loads), packed on a 4-byte one. False if not.
bool quantize_groups_by_warp(const float* x, int64_t rows, int64_t cols, const GroupwiseSpec& spec,
                             uint8_t* packed, float* scales, RngKey key, cudaStream_t stream) {
  if (spec.group_size <= 0 || spec.group_size % kGroupChunk != 0) return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(packed) % 4 != 0) {
    return false;
  }
  const int64_t groups = rows * (cols / spec.group_size);
  const int blocks = grid_for(groups, kGroupWarpThreads / 32);
  switch (spec.group_size / kGroupChunk) {
    case 1:
      quantize_int_groups_by_warp_kernel<1>
          <<<blocks, kGroupWarpThreads, 0, stream>>>(x, rows, cols, spec, key, packed, scales);
      break;
    case 2:
      quantize_int_groups_by_warp_kernel<2>
          <<<blocks, kGroupWarpThreads, 0, stream>>>(x, rows, cols, spec, key, packed, scales);
      break;
    case 4:
      quantize_int_groups_by_warp_kernel<4>
          <<<blocks, kGroupWarpThreads, 0, stream>>>(x, rows, cols, spec, key, packed, scales);
      break;
    case 8:
      quantize_int_groups_by_warp_kernel<8>
          <<<blocks, kGroupWarpThreads, 0, stream>>>(x, rows, cols, spec, key, packed, scales);
      break;
    default:
      return false;
  }
  GNMR_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace

void quantize_int_groupwise(const float* x, int64_t rows, int64_t cols, const GroupwiseSpec& spec,
                            uint8_t* packed, float* scales, RngKey key, cudaStream_t stream) {
  validate_groupwise_spec(cols, spec);
  const int64_t elements = rows * cols;
  if (quantize_groups_by_warp(x, rows, cols, spec, packed, scales, key, stream)) return;
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
