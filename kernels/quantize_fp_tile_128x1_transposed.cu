// The weight-gradient GEMM's FP8 operands: x [n, cols] (or dy) quantized in 128x1 tiles along
// the token dimension n, written transposed as codes_t [cols, n] (the TN operand x^T / dy^T),
// scales in cuBLASLt's VEC128 order for a [cols, n] operand (scale of column c, token block b at
// c + b * cols, precision/scale_layout.h).
// One block per 128 tokens x 64 columns, through shared memory, so both sides coalesce: the
// block reads its tile a quad (four adjacent columns of a token, kernels/quad_access.cuh) per
// thread, and quantize_staged_columns (kernels/quantize_staged_columns.cuh) writes each
// column's row of codes_t 32 adjacent bytes a store, where a thread per column would write a
// byte to each of 32 rows n bytes apart per store. On an H200 (ncu, e3m2, 8192 x 2048): 26 us,
// 50 us with a warp per column and the integer encoder.
// CPU twin: gnmr::quantize_fp_blockwise(x, n, cols, 128, 1, ...) in
// src/precision/quantize_fine_grained.h, whose scale grid [ceil(n / 128), cols] is this order,
// and whose codes this kernel writes transposed (by quantize_fp_tile_code_words,
// kernels/fp_storage_conversion.cuh: the division by the tile's reciprocal, the conversion
// instructions or the compile-time encoder, the same codes as its quantize_fp_element for
// every float, tests/precision, tests/gpu).
#include <string>

#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/fp_storage_conversion.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/quantize.cuh"
#include "kernels/quantize_staged_columns.cuh"
#include "precision/fp_format_dispatch.h"
#include "precision/quantize_fine_grained.h"
#include "precision/scale_layout.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTokens = static_cast<int>(kFineGrainedTile);  // one scale tile along n
constexpr int kColumns = 64;

template <FpFormat kFormat, bool kQuads>
__global__ void __launch_bounds__(kThreads)
    quantize_fp_tile_128x1_transposed_kernel(const float* x, int64_t n, int64_t cols,
                                             uint8_t* codes_t, float* scales, bool word_stores) {
  // x[n0 + t, c0 + c] at tile[t][c], zero past the edges (|0| changes no absmax). The odd row
  // length puts the 32 tokens a warp reads of one column in 32 different banks.
  __shared__ float tile[kTokens][kColumns + 1];
  const int64_t c0 = blockIdx.x * int64_t{kColumns}, n0 = blockIdx.y * int64_t{kTokens};
  const int tokens = static_cast<int>(n - n0 < kTokens ? n - n0 : kTokens);
  const int columns = static_cast<int>(cols - c0 < kColumns ? cols - c0 : kColumns);
  constexpr int kQuadsPerRow = kColumns / 4;
  for (int e = static_cast<int>(threadIdx.x); e < kTokens * kQuadsPerRow; e += kThreads) {
    const int t = e / kQuadsPerRow, c = 4 * (e % kQuadsPerRow);
    float values[4];
    load_quad<kQuads>(x + (n0 + t) * cols + c0 + c, t < tokens ? columns - c : 0, values);
    for (int k = 0; k < 4; ++k) tile[t][c + k] = values[k];
  }
  __syncthreads();
  quantize_staged_columns<kFormat, kColumns + 1, kColumns>(&tile[0][0], tokens, columns, n, n0,
                                                           cols, c0, codes_t, scales, word_stores);
}

}  // namespace

void quantize_fp_tile_128x1_transposed(const float* x, int64_t n, int64_t cols, FpFormat format,
                                       uint8_t* codes_t, float* scales, cudaStream_t stream) {
  if (n == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(block_count(cols, kColumns)),
                  grid_y(block_count(n, kTokens),
                         "quantize_fp_tile_128x1_transposed: " + std::to_string(n) + " tokens"));
  const bool quads = cols % 4 == 0 && all_16_byte_aligned({x});
  const bool word_stores = staged_column_word_stores(codes_t, n);
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    dispatch_quads(quads, [&](auto q) {
      constexpr bool kQuads = decltype(q)::value;
      quantize_fp_tile_128x1_transposed_kernel<kFormat, kQuads>
          <<<grid, kThreads, 0, stream>>>(x, n, cols, codes_t, scales, word_stores);
    });
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
