// Both FP8 operands the backward makes of one dy [n, cols] from a single read of it: the input
// gradient's codes [n, cols] in 1x128 tiles along cols (as quantize_fp_tile_1x128 writes them,
// scales in VEC128 order for an [n, cols] operand) and the weight gradient's codes_t [cols, n]
// in 128x1 tiles along n (as quantize_fp_tile_128x1_transposed writes them, scales in VEC128
// order for a [cols, n] operand). Two kernels would read dy twice: 8 of the 10 bytes an element
// costs them, 4 of the 6 here. (The FP8 forward makes x's and x^T's the same way.)
// The elements come from a source: TensorElements, an fp32 tensor; SwigluOutputElements, the
// SwiGLU forward's output, computed from gate and up and written as it is quantized (8 bytes
// an element read, 4 + 2 written, where the SwiGLU kernel and the pair kernel move 18);
// SwigluGradientElements, the SwiGLU backward's dgate or dup, computed from gate, up and dout
// and never written (12 or 8 bytes an element read and 2 written, where the SwiGLU backward and
// two pair kernels move 32 for both gradients).
// One block per 128 tokens x 128 columns (a 1x128 tile per token, a 128x1 tile per column).
// The row pass gives a token's tile 8 lanes, sixteen elements each
// (kernels/quantize_row_tile.cuh), and stages the block in shared memory (66 KB); the column pass
// (kernels/quantize_staged_columns.cuh) quantizes the staged columns and writes each one's
// row of codes_t 32 adjacent bytes a store. Before the staging, the column pass read the
// block again from L2 and the transposed codes went through shared memory a byte at a time.
// On an H200 (ncu, e3m2, 8192 x 2048): 36 us, 79 us with a warp per tile row and the integer
// encoder; "prep dy (dW+dx)" in the 1B bench 19.8 -> 9.3 ms a step.
// CPU twins: gnmr::quantize_fp_tile_1x128 and gnmr::quantize_fp_blockwise(x, n, cols, 128, 1,
// ...) (src/precision/quantize_fine_grained.h): the same fine_grained_scale and
// quantize_fp_element's codes (here quantize_fp_tile_code_words, kernels/fp_storage_conversion.cuh:
// the division by the tile's reciprocal, the conversion instructions or the compile-time
// encoder, the same codes for every float: tests/precision, tests/gpu), so the same codes and
// scales, bit for bit.
#include <string>

#include "backend/train_math.h"
#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/fp_storage_conversion.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/quantize.cuh"
#include "kernels/quantize_row_tile.cuh"
#include "kernels/quantize_staged_columns.cuh"
#include "precision/fp_format_dispatch.h"
#include "precision/quantize_fine_grained.h"
#include "precision/scale_layout.h"

namespace gnmr::cuda {
namespace {

// 16 warps a block, two blocks a multiprocessor (their 132 KB of staging; at most 64
// registers a thread): with 8 warps the 66 KB left three blocks, 24 warps, and ncu found no
// warp ready to issue in a third of the cycles.
constexpr int kThreads = 512;
constexpr int kTile = static_cast<int>(kFineGrainedTile);
constexpr int kRowLength = kTile + 1;  // floats a staged token: 1 mod 32 (banks)
constexpr size_t kStagedBytes = size_t{kTile} * kRowLength * sizeof(float);  // 66,048

// The elements of an fp32 tensor x [n, cols].
struct TensorElements {
  const float* x;
  // Lane j's sixteen elements of the row tile starting at element `at` (load_row_tile).
  template <bool kQuads>
  __device__ void load(int64_t at, int64_t available, int j,
                       float (&values)[kRowTileValuesPerLane]) const {
    load_row_tile<kQuads>(x + at, available, j, values);
  }
};

// The SwiGLU backward's dgate (kUp false) or dup (kUp true) of gate, up, dout [n, cols]: the
// values swiglu_backward_element gives (backend/train_math.h, the CPU's and kernels/swiglu.cu's
// math, bit for bit). Past the edge the inputs are zeros, and so are both gradients. dup does not
// read up.
template <bool kUp>
struct SwigluGradientElements {
  const float *gate, *up, *dout;
  template <bool kQuads>
  __device__ void load(int64_t at, int64_t available, int j,
                       float (&values)[kRowTileValuesPerLane]) const {
    for (int q = 0; q < kRowTileQuadsPerLane; ++q) {  // a quad of each input at a time
      const int c = row_tile_column(j, q);
      float g[4], u[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d[4];
      load_quad<kQuads>(gate + at + c, available - c, g);
      if (!kUp) load_quad<kQuads>(up + at + c, available - c, u);
      load_quad<kQuads>(dout + at + c, available - c, d);
      for (int k = 0; k < 4; ++k) {
        float dgate, dup;
        swiglu_backward_element(g[k], u[k], d[k], dgate, dup);
        values[4 * q + k] = kUp ? dup : dgate;
      }
    }
  }
};

// The SwiGLU forward's output silu(gate) * up of gate, up [n, cols] (swiglu_forward_element,
// bit for bit), written to out as it is computed: the MLP's down projection quantizes its input
// in the SwiGLU's own pass (a read of out fewer).
struct SwigluOutputElements {
  const float *gate, *up;
  float* out;
  template <bool kQuads>
  __device__ void load(int64_t at, int64_t available, int j,
                       float (&values)[kRowTileValuesPerLane]) const {
    for (int q = 0; q < kRowTileQuadsPerLane; ++q) {
      const int c = row_tile_column(j, q);
      float g[4], u[4], h[4];
      load_quad<kQuads>(gate + at + c, available - c, g);
      load_quad<kQuads>(up + at + c, available - c, u);
      for (int k = 0; k < 4; ++k) h[k] = values[4 * q + k] = swiglu_forward_element(g[k], u[k]);
      store_quad<kQuads>(out + at + c, available - c, h);
    }
  }
};

template <FpFormat kFormat, bool kQuads, class Source>
__global__ void __launch_bounds__(kThreads, 2)
    quantize_fp_tile_1x128_and_transposed_kernel(Source source, int64_t n, int64_t cols,
                                                 uint8_t* codes, float* scales, uint8_t* codes_t,
                                                 float* scales_t, bool word_stores) {
  // The block's elements, [token][kRowLength], zero past the edges (|0| changes no maximum).
  extern __shared__ float staged[];
  const int64_t cb = blockIdx.x, tb = blockIdx.y, c0 = cb * kTile, n0 = tb * kTile;
  const int tokens = static_cast<int>(n - n0 < kTile ? n - n0 : kTile);
  const int columns = static_cast<int>(cols - c0 < kTile ? cols - c0 : kTile);

  // Row tiles (kernels/quantize_row_tile.cuh: 8 lanes a token, a warp four tokens at a time):
  // read, stage for the column pass, quantize with the row's scale, write. Token t's element c
  // is staged in bank t + c (mod 32): the warp's stores hit 32 different banks. A thread's two
  // tokens are one iteration each (the instruction cache, precision/fp_format_dispatch.h).
  constexpr int kTokensAtOnce = kThreads / kRowTileLanes;  // 64 (a warp 4)
  const int j = static_cast<int>(threadIdx.x) % kRowTileLanes;
#pragma unroll 1
  for (int i = 0; i < kTile / kTokensAtOnce; ++i) {
    const int t = kTokensAtOnce * i + static_cast<int>(threadIdx.x) / kRowTileLanes;
    const int64_t available = t < tokens ? columns : 0;  // the bound is the group's
    float values[kRowTileValuesPerLane];
    source.template load<kQuads>((n0 + t) * cols + c0, available, j, values);
    for (int q = 0; q < kRowTileQuadsPerLane; ++q) {
      for (int k = 0; k < 4; ++k)
        staged[t * kRowLength + row_tile_column(j, q) + k] = values[4 * q + k];
    }
    const float scale = row_tile_scale<kFormat>(values);
    if (t >= tokens) continue;
    if (j == 0) scales[vec128_scale_index(n0 + t, cb, n)] = scale;
    quantize_row_tile<kFormat, kQuads>(values, scale, codes + (n0 + t) * cols + c0, available, j);
  }
  __syncthreads();  // the block is staged

  // Column tiles: from shared memory, written transposed (kernels/quantize_staged_columns.cuh).
  quantize_staged_columns<kFormat, kRowLength, kTile>(staged, tokens, columns, n, n0, cols, c0,
                                                      codes_t, scales_t, word_stores);
}

// The launch for any source; `quads`: every input array takes the quad accesses.
template <class Source>
void launch_pair(const Source& source, bool quads, int64_t n, int64_t cols, FpFormat format,
                 uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                 cudaStream_t stream) {
  if (n == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(block_count(cols, kTile)),
                  grid_y(block_count(n, kTile), "quantize_fp_tile_1x128_and_transposed: " +
                                                    std::to_string(n) + " tokens"));
  const bool word_stores = staged_column_word_stores(codes_t, n);
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    dispatch_quads(quads, [&](auto q) {
      constexpr bool kQuads = decltype(q)::value;
      // Over the 48 KiB a block gets without asking (every GPU with FP8 GEMMs allows it).
      GNMR_CUDA_CHECK(cudaFuncSetAttribute(
          quantize_fp_tile_1x128_and_transposed_kernel<kFormat, kQuads, Source>,
          cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedBytes)));
      quantize_fp_tile_1x128_and_transposed_kernel<kFormat, kQuads, Source>
          <<<grid, kThreads, kStagedBytes, stream>>>(source, n, cols, codes, scales, codes_t,
                                                     scales_t, word_stores);
    });
  });
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void quantize_fp_tile_1x128_and_transposed(const float* x, int64_t n, int64_t cols, FpFormat format,
                                           uint8_t* codes, float* scales, uint8_t* codes_t,
                                           float* scales_t, cudaStream_t stream) {
  launch_pair(TensorElements{x}, quad_rows(x, cols, codes), n, cols, format, codes, scales, codes_t,
              scales_t, stream);
}

void quantize_swiglu_gradient_1x128_and_transposed(const float* gate, const float* up,
                                                   const float* dout, SwigluGradient which,
                                                   int64_t n, int64_t cols, FpFormat format,
                                                   uint8_t* codes, float* scales, uint8_t* codes_t,
                                                   float* scales_t, cudaStream_t stream) {
  const bool quads = quad_rows(gate, cols, codes) && quad_rows(dout, cols, codes) &&
                     (which == SwigluGradient::kUp || quad_rows(up, cols, codes));
  if (which == SwigluGradient::kGate) {
    launch_pair(SwigluGradientElements<false>{gate, up, dout}, quads, n, cols, format, codes,
                scales, codes_t, scales_t, stream);
  } else {
    launch_pair(SwigluGradientElements<true>{gate, up, dout}, quads, n, cols, format, codes, scales,
                codes_t, scales_t, stream);
  }
}

void quantize_swiglu_output_1x128_and_transposed(const float* gate, const float* up, float* out,
                                                 int64_t n, int64_t cols, FpFormat format,
                                                 uint8_t* codes, float* scales, uint8_t* codes_t,
                                                 float* scales_t, cudaStream_t stream) {
  const bool quads =
      quad_rows(gate, cols, codes) && quad_rows(up, cols, codes) && quad_rows(out, cols, codes);
  launch_pair(SwigluOutputElements{gate, up, out}, quads, n, cols, format, codes, scales, codes_t,
              scales_t, stream);
}

}  // namespace gnmr::cuda
