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
// two pair kernels move 32 for both gradients); RopeGradientElements, q's or k's dy rotated back
// as it is read and never written (4 bytes read and 2 written, where RoPE's backward in place
// and the pair kernel move 14).
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

#include "backend/rope_math.h"
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
  // Lane j's sixteen elements of the row tile starting at element `at` of row `row`
  // (load_row_tile).
  template <bool kQuads>
  __device__ void load(int64_t /*row*/, int64_t at, int64_t available, int j,
                       float (&values)[kRowTileValuesPerLane]) const {
    load_row_tile<kQuads>(x + at, available, j, values);
  }
};

// The fused sources below take only the four-wide accesses (fused_pair_takes): each is one
// kernel instance per format, not two.

// The SwiGLU backward's dgate or (up_gradient) dup of gate, up, dout [n, cols]: the values
// swiglu_backward_element gives (backend/train_math.h, the CPU's and kernels/swiglu.cu's math,
// bit for bit). Past the edge the inputs are zeros, and so are both gradients. dup does not read
// up.
struct SwigluGradientElements {
  const float *gate, *up, *dout;
  bool up_gradient;
  template <bool kQuads>
  __device__ void load(int64_t /*row*/, int64_t at, int64_t available, int j,
                       float (&values)[kRowTileValuesPerLane]) const {
    for (int q = 0; q < kRowTileQuadsPerLane; ++q) {  // a quad of each input at a time
      const int c = row_tile_column(j, q);
      float g[4], u[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d[4];
      load_quad<kQuads>(gate + at + c, available - c, g);
      if (!up_gradient) load_quad<kQuads>(up + at + c, available - c, u);
      load_quad<kQuads>(dout + at + c, available - c, d);
      for (int k = 0; k < 4; ++k) {
        float dgate, dup;
        swiglu_backward_element(g[k], u[k], d[k], dgate, dup);
        values[4 * q + k] = up_gradient ? dup : dgate;
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
  __device__ void load(int64_t /*row*/, int64_t at, int64_t available, int j,
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

// Lane j's rotations of RoPE's backward at one position: kPartner = hd / 64 (hd 64 or 128), so
// lane j's quad q (row_tile_column) and quad q + kPartner are the two halves of one head and
// each pair rotates in the lane's registers (the tile's 128 columns hold whole heads). `cos`,
// `sin`: the tables' row of the position (hd / 2 floats, 16-byte aligned).
template <int kPartner>
__device__ inline void rope_backward_row_tile(const float* cos, const float* sin, int j,
                                              float (&values)[kRowTileValuesPerLane]) {
  constexpr int kHalf = 32 * kPartner;
  for (int q = 0; q < kRowTileQuadsPerLane; ++q) {
    if ((q / kPartner) % 2 != 0) continue;  // the head's upper half: rotated with its lower
    const int i = row_tile_column(j, q) % (2 * kHalf);  // < kHalf
    float c[4], s[4];
    load_quad<true>(cos + i, 4, c);
    load_quad<true>(sin + i, 4, s);
    for (int k = 0; k < 4; ++k) {
      rope_rotate_pair(values[4 * q + k], values[4 * (q + kPartner) + k], c[k], s[k], true);
    }
  }
}

// RoPE's backward (rope_rotate_pair's transposed rotation, backend/rope_math.h, as
// kernels/rope.cu and the CPU run it) of dx [n, heads x hd], row r at position r % seq of the
// cos / sin tables [positions, hd / 2]: q's or k's dy rotated as it is read, never written.
struct RopeGradientElements {
  const float *dx, *cos, *sin;
  uint32_t seq;
  int hd;  // 64 or 128
  template <bool kQuads>
  __device__ void load(int64_t row, int64_t at, int64_t available, int j,
                       float (&values)[kRowTileValuesPerLane]) const {
    load_row_tile<kQuads>(dx + at, available, j, values);
    if (available <= 0) return;                                  // a row past the edge: zeros
    const uint32_t position = static_cast<uint32_t>(row) % seq;  // rows < 2^31 (grid_y)
    const int half = hd / 2;
    if (hd == 64) {
      rope_backward_row_tile<1>(cos + position * half, sin + position * half, j, values);
    } else {
      rope_backward_row_tile<2>(cos + position * half, sin + position * half, j, values);
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
    source.template load<kQuads>(n0 + t, (n0 + t) * cols + c0, available, j, values);
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

template <FpFormat kFormat, bool kQuads, class Source>
void launch_pair_kernel(const Source& source, int64_t n, int64_t cols, uint8_t* codes,
                        float* scales, uint8_t* codes_t, float* scales_t, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(block_count(cols, kTile)),
                  grid_y(block_count(n, kTile), "quantize_fp_tile_1x128_and_transposed: " +
                                                    std::to_string(n) + " tokens"));
  const bool word_stores = staged_column_word_stores(codes_t, n);
  // Over the 48 KiB a block gets without asking (every GPU with FP8 GEMMs allows it).
  GNMR_CUDA_CHECK(cudaFuncSetAttribute(
      quantize_fp_tile_1x128_and_transposed_kernel<kFormat, kQuads, Source>,
      cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedBytes)));
  quantize_fp_tile_1x128_and_transposed_kernel<kFormat, kQuads, Source>
      <<<grid, kThreads, kStagedBytes, stream>>>(source, n, cols, codes, scales, codes_t, scales_t,
                                                 word_stores);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

// A fused source's launch: four-wide accesses only, and the formats with FP8 GEMMs.
template <class Source>
void launch_fused_pair(const Source& source, int64_t n, int64_t cols, FpFormat format,
                       uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                       cudaStream_t stream, const char* what) {
  if (n == 0 || cols == 0) return;
  GNMR_CHECK(format != FpFormat::kE5M2,
             std::string(what) + ": e5m2 has no FP8 GEMM here, so no fused pair kernel");
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    if constexpr (kFormat != FpFormat::kE5M2) {
      launch_pair_kernel<kFormat, true>(source, n, cols, codes, scales, codes_t, scales_t, stream);
    }
  });
}

}  // namespace

void quantize_fp_tile_1x128_and_transposed(const float* x, int64_t n, int64_t cols, FpFormat format,
                                           uint8_t* codes, float* scales, uint8_t* codes_t,
                                           float* scales_t, cudaStream_t stream) {
  if (n == 0 || cols == 0) return;
  dispatch_fp_format(format, [&](auto f) {
    constexpr FpFormat kFormat = decltype(f)::value;
    dispatch_quads(quad_rows(x, cols, codes), [&](auto q) {
      constexpr bool kQuads = decltype(q)::value;
      launch_pair_kernel<kFormat, kQuads>(TensorElements{x}, n, cols, codes, scales, codes_t,
                                          scales_t, stream);
    });
  });
}

bool fused_pair_takes(FpFormat format, int64_t cols, std::initializer_list<const void*> arrays) {
  return format != FpFormat::kE5M2 && cols % 4 == 0 && all_16_byte_aligned(arrays);
}

// The codes' rows start on 4-byte boundaries (quad_rows' condition on them).
bool word_aligned(const uint8_t* codes) {
  return reinterpret_cast<uintptr_t>(codes) % 4 == 0;
}

void quantize_swiglu_gradient_1x128_and_transposed(const float* gate, const float* up,
                                                   const float* dout, SwigluGradient which,
                                                   int64_t n, int64_t cols, FpFormat format,
                                                   uint8_t* codes, float* scales, uint8_t* codes_t,
                                                   float* scales_t, cudaStream_t stream) {
  const bool up_gradient = which == SwigluGradient::kUp;
  GNMR_CHECK(
      fused_pair_takes(format, cols, {gate, dout, up_gradient ? gate : up}) && word_aligned(codes),
      "quantize_swiglu_gradient_1x128_and_transposed: not a fused pair kernel's arrays "
      "(fused_pair_takes)");
  launch_fused_pair(SwigluGradientElements{gate, up, dout, up_gradient}, n, cols, format, codes,
                    scales, codes_t, scales_t, stream,
                    "quantize_swiglu_gradient_1x128_and_transposed");
}

bool rope_gradient_quantizable(int64_t hd, const float* cos, const float* sin) {
  return (hd == 64 || hd == 128) && all_16_byte_aligned({cos, sin});
}

void quantize_rope_gradient_1x128_and_transposed(const float* dx, const float* cos,
                                                 const float* sin, int64_t n, int64_t seq,
                                                 int64_t heads, int64_t hd, FpFormat format,
                                                 uint8_t* codes, float* scales, uint8_t* codes_t,
                                                 float* scales_t, cudaStream_t stream) {
  const int64_t cols = heads * hd;
  GNMR_CHECK(rope_gradient_quantizable(hd, cos, sin) && seq > 0 && seq <= INT32_MAX &&
                 fused_pair_takes(format, cols, {dx}) && word_aligned(codes),
             "quantize_rope_gradient_1x128_and_transposed: head dim " + std::to_string(hd) + ", " +
                 std::to_string(seq) +
                 " positions: needs head dim 64 or 128, 16-byte aligned cos / sin tables and a "
                 "fused pair kernel's arrays (fused_pair_takes)");
  launch_fused_pair(
      RopeGradientElements{dx, cos, sin, static_cast<uint32_t>(seq), static_cast<int>(hd)}, n, cols,
      format, codes, scales, codes_t, scales_t, stream,
      "quantize_rope_gradient_1x128_and_transposed");
}

void quantize_swiglu_output_1x128_and_transposed(const float* gate, const float* up, float* out,
                                                 int64_t n, int64_t cols, FpFormat format,
                                                 uint8_t* codes, float* scales, uint8_t* codes_t,
                                                 float* scales_t, cudaStream_t stream) {
  GNMR_CHECK(fused_pair_takes(format, cols, {gate, up, out}) && word_aligned(codes),
             "quantize_swiglu_output_1x128_and_transposed: not a fused pair kernel's arrays "
             "(fused_pair_takes)");
  launch_fused_pair(SwigluOutputElements{gate, up, out}, n, cols, format, codes, scales, codes_t,
                    scales_t, stream, "quantize_swiglu_output_1x128_and_transposed");
}

}  // namespace gnmr::cuda
