// Fine-grained fp fake quantization, out = dequantize(quantize(x)) with one fp32 scale per
// block_rows x block_cols block (DeepSeek-V3 §3.3.2: 1 x 128 activation tiles, 128 x 128
// weight blocks; 128 x 1 tiles for the weight-gradient GEMM), any block shape, partial blocks
// at the right and bottom edges with their own scale, out may be x. Each block's absmax (a max:
// exact in any order) gives scale = absmax / format max, then every element goes through
// fake_quantize_fp_element_fast. Three kernels by block shape, same math:
// - one-column blocks (t x 1): one thread per (band, column), walking the band's rows, so a
//   warp reads a row segment;
// - large blocks (>= kLargeBlock elements, e.g. 128 x 128): one thread block per block;
// - the rest (1 x 128, 1 x 32, ...): one warp per block.
// CPU twin: gnmr::cpu::fake_quantize_fp_blockwise (src/backend/cpu/quantize.cpp), i.e.
// gnmr::fake_quantize_fp_bands (src/precision/quantize_fine_grained.h); both call
// fine_grained_scale and fake_quantize_fp_element_fast, so the results are bit-identical.
#include <algorithm>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/train_ops.cuh"
#include "precision/fp_format_dispatch.h"
#include "precision/quantize_fine_grained.h"
#include "util/error.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kLargeBlock = 4096;
constexpr int64_t kMaxBlocks = 1 << 20;

__device__ int64_t min_int64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// The running max of the CPU loop: a NaN magnitude never wins.
__device__ float max_magnitude(float absmax, float value) {
  const float magnitude = fabsf(value);
  return magnitude > absmax ? magnitude : absmax;
}

// block_cols == 1: thread per (band of block_rows rows, column).
template <FpFormat kFormat>
__global__ void fake_quantize_columns_kernel(const float* x, float* out, int64_t rows, int64_t cols,
                                             int64_t block_rows) {
  const int64_t bands = (rows + block_rows - 1) / block_rows;
  const int64_t items = bands * cols;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < items; e += stride) {
    const int64_t band = e / cols, c = e % cols;
    const int64_t row0 = band * block_rows, row_end = min_int64(rows, row0 + block_rows);
    float absmax = 0.0f;
    for (int64_t r = row0; r < row_end; ++r) absmax = max_magnitude(absmax, x[r * cols + c]);
    const float scale = fine_grained_scale(absmax, kFormat);
    for (int64_t r = row0; r < row_end; ++r) {
      out[r * cols + c] = fake_quantize_fp_element_fast<kFormat>(x[r * cols + c], scale);
    }
  }
}

// One warp per block; the loop bound is the same for all lanes, so the shuffles see full warps.
template <FpFormat kFormat>
__global__ void fake_quantize_warp_blocks_kernel(const float* x, float* out, int64_t rows,
                                                 int64_t cols, int64_t block_rows,
                                                 int64_t block_cols) {
  const int64_t grid_rows = (rows + block_rows - 1) / block_rows;
  const int64_t grid_cols = (cols + block_cols - 1) / block_cols;
  const int64_t blocks = grid_rows * grid_cols;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t b = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; b < blocks; b += warps) {
    const int64_t row0 = b / grid_cols * block_rows, col0 = b % grid_cols * block_cols;
    const int64_t row_end = min_int64(rows, row0 + block_rows);
    const int64_t col_end = min_int64(cols, col0 + block_cols);
    float absmax = 0.0f;
    for (int64_t r = row0; r < row_end; ++r) {
      for (int64_t c = col0 + lane; c < col_end; c += 32) {
        absmax = max_magnitude(absmax, x[r * cols + c]);
      }
    }
    const float scale = fine_grained_scale(warp_max(absmax), kFormat);
    // Each lane rewrites only the elements it read, after the whole warp read the block.
    for (int64_t r = row0; r < row_end; ++r) {
      for (int64_t c = col0 + lane; c < col_end; c += 32) {
        out[r * cols + c] = fake_quantize_fp_element_fast<kFormat>(x[r * cols + c], scale);
      }
    }
  }
}

// One thread block per block (>= kLargeBlock elements); the loop bound is uniform per block.
template <FpFormat kFormat>
__global__ void fake_quantize_large_blocks_kernel(const float* x, float* out, int64_t rows,
                                                  int64_t cols, int64_t block_rows,
                                                  int64_t block_cols) {
  const int64_t grid_rows = (rows + block_rows - 1) / block_rows;
  const int64_t grid_cols = (cols + block_cols - 1) / block_cols;
  const int64_t blocks = grid_rows * grid_cols;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t row0 = b / grid_cols * block_rows, col0 = b % grid_cols * block_cols;
    const int64_t height = min_int64(rows, row0 + block_rows) - row0;
    const int64_t width = min_int64(cols, col0 + block_cols) - col0;
    float absmax = 0.0f;
    for (int64_t e = threadIdx.x; e < height * width; e += blockDim.x) {
      absmax = max_magnitude(absmax, x[(row0 + e / width) * cols + col0 + e % width]);
    }
    // block_max syncs the block: every read above is done before any write below.
    const float scale = fine_grained_scale(block_max(absmax), kFormat);
    for (int64_t e = threadIdx.x; e < height * width; e += blockDim.x) {
      const int64_t at = (row0 + e / width) * cols + col0 + e % width;
      out[at] = fake_quantize_fp_element_fast<kFormat>(x[at], scale);
    }
  }
}

int blocks_for(int64_t items, int64_t per_block) {
  return static_cast<int>(std::min<int64_t>((items + per_block - 1) / per_block, kMaxBlocks));
}

template <FpFormat kFormat>
void launch(const float* x, float* out, int64_t rows, int64_t cols, int64_t block_rows,
            int64_t block_cols, cudaStream_t stream) {
  const int64_t blocks =
      ((rows + block_rows - 1) / block_rows) * ((cols + block_cols - 1) / block_cols);
  if (block_cols == 1) {
    fake_quantize_columns_kernel<kFormat>
        <<<blocks_for(blocks, kThreads), kThreads, 0, stream>>>(x, out, rows, cols, block_rows);
  } else if (block_rows * block_cols >= kLargeBlock) {
    fake_quantize_large_blocks_kernel<kFormat><<<blocks_for(blocks, 1), kThreads, 0, stream>>>(
        x, out, rows, cols, block_rows, block_cols);
  } else {
    fake_quantize_warp_blocks_kernel<kFormat>
        <<<blocks_for(blocks, kThreads / 32), kThreads, 0, stream>>>(x, out, rows, cols, block_rows,
                                                                     block_cols);
  }
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void fake_quantize_fp_blockwise(const float* x, float* out, int64_t rows, int64_t cols,
                                FpFormat format, int64_t block_rows, int64_t block_cols,
                                cudaStream_t stream) {
  if (block_rows < 1 || block_cols < 1) {
    throw Error(ErrorKind::Config, "fake_quantize_fp_blockwise: block " +
                                       std::to_string(block_rows) + " x " +
                                       std::to_string(block_cols) + " (each side must be >= 1)");
  }
  if (rows == 0 || cols == 0) return;
  dispatch_fp_format(format, [&](auto f) {
    launch<decltype(f)::value>(x, out, rows, cols, block_rows, block_cols, stream);
  });
}

}  // namespace gnmr::cuda
