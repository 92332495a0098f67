// Flash attention, forward and backward, on bf16 tensor cores (mma.sync m16n8k16, so it runs on
// sm_80 and sm_90): causal GQA, fp32 softmax statistics and accumulation, FlashAttention-2's
// loops (arXiv 2307.08691, algorithms 1 and 2) over the same 64 x 64 tiles as the SIMT kernels
// (kernels/flash_attention.cu, src/backend/flash_tiling.h). model.attention = flash_bf16 selects
// it, and so does `auto` under bf16 GEMMs (docs/DESIGN.md §6).
//
// Reference: the exact attention of the bf16-rounded q, k, v in double precision
// (tests/backend/attention_bf16_reference.h). The only rounding beyond the inputs' is P's to
// bf16 before P V, so each output is within 2^-8 * max |v| of it (the tests' bound).
//
// One block per (batch, head, query tile) (the dK/dV pass: per key tile), kFlashMmaWarps warps
// of 16 rows each, a head's longest tiles first (flash_block_task in src/backend/flash_layout.h);
// the forward's query tile is 128 rows by default, two 16-row blocks a warp
// (kFlashMmaForwardQueryTile, the reasons beside kQueryTileBlocksPerSm), or 64, and so is the dQ
// pass's at hd 64 (flash_mma_query_pass_tile); on a GPU the backend runs whichever it timed
// faster at the shape (backend/cuda/flash_tile_choice.h). The host side first
// converts q, k, v to bf16 copies that the caller keeps for the backward, and the backward dout
// to one in its scratch (flash_mma_buffers); the kernels copy tiles of those to shared memory by
// cp.async, 16 bytes per thread and pass, and take fragments from there by ldmatrix, one
// instruction per A fragment or pair of B fragments, with the row addresses and delivery rules
// of src/backend/mma_fragment.h. The forward overlaps its copies with its math as
// FlashAttention-2 does, with one K and one V buffer: V(j) lands during S = Q K(j)^T and the
// softmax, K(j + 1) during O += P V(j); the dQ pass alternates the roles of its two buffers so
// that V(j) lands during S and P, K(j + 1) during dS and dQ; the dK/dV pass keeps two stages of
// its per-query-tile data (q, dout, lse, delta), the next tile's landing while this one's math
// runs. Exponentials are one special-function instruction each (exp2_approx_ftz); the forward
// and the dQ pass with 64-row tiles are capped at 168 registers so that three blocks fit a
// multiprocessor (__launch_bounds__; with 128-row tiles, and the dK/dV pass, two). Per key tile
// and 16-row block a warp computes its 16 x 64 scores S = Q K^T (HD / 16 x 8 mma), masks them
// where the tile pair needs it, updates its rows' running max m and partial sums l (each lane
// holds 2 rows x 16 of the 64 columns; a row's 4 lanes combine by butterfly shuffles), then
// O += P V (4 x HD / 8 mma) with P's accumulators reused as the A fragments. No atomics; every
// output element is written by one lane. The same three kernels on sm_90a's warpgroup MMA
// (flash_forward_wgmma_kernel, flash_backward_query_wgmma_kernel,
// flash_backward_key_value_wgmma_kernel, each after its mma.sync twin) run the same rows' steps
// with their products as wgmma: FlashMmaInstruction::Wgmma, model.attention = flash_wgmma, not
// auto's choice until a GPU has run them (the forward's comment says why).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "backend/flash_layout.h"
#include "backend/mma_fragment.h"
#include "backend/wgmma_operand.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/flash_launch.cuh"
#include "kernels/model_ops.cuh"
#include "kernels/quantize.cuh"
#include "precision/bf16.h"
// ---- hardware only begin: the CUDA emulation (tests/emulated_cuda) has its own of these.
#include "kernels/ptx_instructions.cuh"
// ---- hardware only end

namespace gnmr::cuda {
namespace {

using flash_launch::check_shape;
using flash_launch::launch_blocks;

// ---- device code begin: tests/backend/test_flash_attention_emulated.cpp runs what lies
// between these markers on the host (tests/emulated_cuda: the threads as fibers, an emulated
// mma and shuffle per warp) against the double-precision reference.

// log2(e): the kernels take exponentials as exp2 of scores scaled by scale log2(e), so each is one
// fma and one exp2 (FlashAttention-2's form), and the log-sum-exp they store stays in natural
// log units for the backward and the other kernels.
constexpr float kLog2e = 1.4426950408889634f;

// Issues (cp.async, not yet committed) the copy of a kRows x HD tile of bf16 codes into shared
// memory: row r from global src + r * src_stride to dst + r * dst_stride, 16 bytes per thread
// and pass (the buffers' regions and rows are 16-byte aligned: flash_mma_buffers); rows from
// `rows` on are zero-filled, so a partial tile's missing keys and queries multiply as 0 (the
// mask removes their scores). Thread t copies 16-byte chunk t % (HD / 8) of rows
// t / (HD / 8) + pass kRowsPerPass, so both its addresses step by a fixed stride: a pass is a
// few instructions, no division and no 64-bit multiply (the loop over element indices that this
// replaced spent ~26 on each copy: more, for a tile pair's K and V, than its 128 HMMA at hd 128;
// scripts/sass_counts.sh).
template <int HD, int kRows>
__device__ void load_tile_async(uint16_t* dst, int dst_stride, const uint16_t* src,
                                int64_t src_stride, int rows) {
  constexpr int kChunks = HD / 8;
  constexpr int kRowsPerPass = kFlashMmaThreads / kChunks;
  static_assert(kFlashMmaThreads % kChunks == 0 && kRows % kRowsPerPass == 0,
                "every thread copies the same chunk of the same number of rows");
  const int row = int(threadIdx.x) / kChunks, chunk = 8 * (int(threadIdx.x) % kChunks);
  const uint16_t* from = src + row * src_stride + chunk;
  uint16_t* to = dst + row * dst_stride + chunk;
  const int64_t from_step = kRowsPerPass * src_stride;
  const int to_step = kRowsPerPass * dst_stride;
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const bool real = row + pass * kRowsPerPass < rows;
    cp_async_16(to, real ? from : src, real ? 16 : 0);
    from += from_step;
    to += to_step;
  }
}

// Issues (not committed) the copy of key tile kj of `kv` (k or v: the rows of kv head g of
// batch row b) into `dst` (row stride dst_stride).
template <int HD>
__device__ void load_kv_tile_async(uint16_t* dst, int dst_stride, const uint16_t* kv,
                                   const FlashDims& s, const FlashTiling& tiles, int64_t b,
                                   int64_t g, int64_t kj) {
  load_tile_async<HD, kFlashKvTile>(
      dst, dst_stride, kv + flash_kv_offset(s, b, kj * tiles.kv_tile, g, HD), s.kv_heads * HD,
      int(flash_tile_rows(kj, tiles.kv_tile, s.seq)));
}

// Issues (cp.async, not committed) the copy of a kRows x HD tile of bf16 codes (kRows 64 or
// 128) into shared memory laid out for wgmma (wgmma_tile_element): row r from global
// src + r * src_stride; rows from `rows` on zero-filled, as load_tile_async. Thread t copies the
// 16-byte chunk (t / 8) % (HD / 8) of rows t % 8 + 8 (t / HD) + pass 1024 / HD, so the 8 lanes of
// a quarter warp fill one core matrix, 128 contiguous bytes (no bank conflict), and both
// addresses step by a fixed stride.
template <int HD, int kRows>
__device__ void load_wgmma_tile_async(uint16_t* dst, const uint16_t* src, int64_t src_stride,
                                      int rows) {
  constexpr int kRowsPerPass = 8 * kFlashMmaThreads / HD;
  static_assert(kFlashMmaThreads % HD == 0 && kRows % kRowsPerPass == 0,
                "every thread copies the same chunk of the same number of rows");
  const int t = int(threadIdx.x);
  const int row = t % 8 + 8 * (t / HD), col = 8 * ((t / 8) % (HD / 8));
  const uint16_t* from = src + row * src_stride + col;
  uint16_t* to = dst + wgmma_tile_element(row, col, HD);
  const int64_t from_step = kRowsPerPass * src_stride;
  constexpr int kToStep = kRowsPerPass * HD;  // kRowsPerPass / 8 of wgmma_tile_element's row groups
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const bool real = row + pass * kRowsPerPass < rows;
    cp_async_16(to, real ? from : src, real ? 16 : 0);
    from += from_step;
    to += kToStep;
  }
}

// The same for key tile kj of `kv` (k or v: the rows of kv head g of batch row b).
template <int HD>
__device__ void load_wgmma_kv_tile_async(uint16_t* dst, const uint16_t* kv, const FlashDims& s,
                                         const FlashTiling& tiles, int64_t b, int64_t g,
                                         int64_t kj) {
  load_wgmma_tile_async<HD, kWgmmaN>(dst, kv + flash_kv_offset(s, b, kj * tiles.kv_tile, g, HD),
                                     s.kv_heads * HD,
                                     int(flash_tile_rows(kj, tiles.kv_tile, s.seq)));
}

// The A fragment of the 16 x 16 block at `base` of a row-major bf16 tile (row stride `stride`).
__device__ void load_a_fragment(uint32_t a[4], const uint16_t* base, int64_t stride, int lane) {
  ldmatrix_x4(a, base + ldmatrix_a_row(lane) * stride + ldmatrix_a_col(lane));
}

// The B fragments (16 x 8, k x n) of two n-blocks, b[0..1] for n 0-7 and b[2..3] for n 8-15,
// from the rows of a row-major bf16 tile at `base` (row stride `stride`). From rows that are n
// (K: B = K^T, B(k, n) = base[n * stride + k]):
__device__ void load_b_fragments_from_n_rows(uint32_t b[4], const uint16_t* base, int64_t stride,
                                             int lane) {
  ldmatrix_x4(b, base + ldmatrix_b_n_rows_row(lane) * stride + ldmatrix_b_n_rows_col(lane));
}
// From rows that are k (V: B(k, n) = base[k * stride + n]), the transposing load:
__device__ void load_b_fragments_from_k_rows(uint32_t b[4], const uint16_t* base, int64_t stride,
                                             int lane) {
  ldmatrix_x4_trans(b, base + ldmatrix_a_row(lane) * stride + ldmatrix_a_col(lane));
}

// The maximum and the sum of a C-fragment row over its 4 lanes (lane ^ 1, lane ^ 2). Both
// butterflies give every lane of the quad the same bits: max is exact, and each lane adds the
// same two pairs, in the same order up to commutation.
__device__ float quad_max(float value) {
  value = fmaxf(value, warp_shfl_xor(value, 1));
  return fmaxf(value, warp_shfl_xor(value, 2));
}
__device__ float quad_sum(float value) {
  value += warp_shfl_xor(value, 1);
  return value + warp_shfl_xor(value, 2);
}

// acc = A B^T for one warp: A kRowBlocks blocks of 16 rows x HD at `a` (block r's rows from
// a + 16 r stride), B the kBlocks x 8 rows x HD at `b` (both bf16, row stride `stride`), so
// acc[r] is 16 x 8 kBlocks in C fragments. Each pair of B fragments is loaded once for all the
// row blocks. The score-like products: S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T.
template <int HD, int kBlocks, int kRowBlocks>
__device__ void multiply_by_rows_transposed(float acc[][kBlocks][kMmaCElements], const uint16_t* a,
                                            const uint16_t* b, int64_t stride, int lane) {
  static_assert(kBlocks % 2 == 0, "B fragments load two n-blocks at a time");
#pragma unroll
  for (int r = 0; r < kRowBlocks; ++r) {
#pragma unroll
    for (int nb = 0; nb < kBlocks; ++nb) {
#pragma unroll
      for (int i = 0; i < kMmaCElements; ++i) acc[r][nb][i] = 0.0f;
    }
  }
#pragma unroll
  for (int kk = 0; kk < HD / kMmaK; ++kk) {
    uint32_t af[kRowBlocks][4];
#pragma unroll
    for (int r = 0; r < kRowBlocks; ++r) {
      load_a_fragment(af[r], a + r * kMmaM * stride + kk * kMmaK, stride, lane);
    }
#pragma unroll
    for (int nb = 0; nb < kBlocks; nb += 2) {
      uint32_t bf[4];
      load_b_fragments_from_n_rows(bf, b + nb * kMmaN * stride + kk * kMmaK, stride, lane);
#pragma unroll
      for (int r = 0; r < kRowBlocks; ++r) {
        mma_bf16_m16n8k16(acc[r][nb], af[r], bf);
        mma_bf16_m16n8k16(acc[r][nb + 1], af[r], bf + 2);
      }
    }
  }
}

// The C fragments of a 16 x 8 kBlocks product, rounded to bf16, as the A fragments of its
// 16 x 16 blocks (mma_fragment.h): the next product's operand without leaving registers.
template <int kBlocks>
__device__ void a_fragments_from_c(uint32_t a[kBlocks / 2][4],
                                   const float c[kBlocks][kMmaCElements]) {
#pragma unroll
  for (int kk = 0; kk < kBlocks / 2; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int lo = 2 * j, hi = 2 * j + 1;
      a[kk][j] = pack_bf16x2_rn(c[2 * kk + mma_a_from_c_block(lo)][mma_a_from_c_element(lo)],
                                c[2 * kk + mma_a_from_c_block(hi)][mma_a_from_c_element(hi)]);
    }
  }
}

// acc += A B for one warp: A kRowBlocks blocks of 16 x 16 kSteps bf16 A fragments, B the
// 16 kSteps rows x HD at `b` (bf16, row stride `stride`); acc[r] is 16 x HD. Each pair of B
// fragments is loaded once for all the row blocks.
template <int HD, int kSteps, int kRowBlocks>
__device__ void accumulate_a_times_rows(float acc[][HD / kMmaN][kMmaCElements],
                                        const uint32_t a[][kSteps][4], const uint16_t* b,
                                        int64_t stride, int lane) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
    for (int ob = 0; ob < HD / kMmaN; ob += 2) {
      uint32_t bf[4];
      load_b_fragments_from_k_rows(bf, b + kk * kMmaK * stride + ob * kMmaN, stride, lane);
#pragma unroll
      for (int r = 0; r < kRowBlocks; ++r) {
        mma_bf16_m16n8k16(acc[r][ob], a[r][kk], bf);
        mma_bf16_m16n8k16(acc[r][ob + 1], a[r][kk], bf + 2);
      }
    }
  }
}

// acc += C B for one warp: C kRowBlocks blocks of 16 x 8 kBlocks fp32 C fragments of an
// earlier product, as A fragments (a_fragments_from_c), B the 8 kBlocks rows x HD at `b`. The
// value-like products: O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q.
template <int HD, int kBlocks, int kRowBlocks>
__device__ void accumulate_times_rows(float acc[][HD / kMmaN][kMmaCElements],
                                      const float c[][kBlocks][kMmaCElements], const uint16_t* b,
                                      int64_t stride, int lane) {
  uint32_t a[kRowBlocks][kBlocks / 2][4];
#pragma unroll
  for (int r = 0; r < kRowBlocks; ++r) a_fragments_from_c<kBlocks>(a[r], c[r]);
  accumulate_a_times_rows<HD, kBlocks / 2, kRowBlocks>(acc, a, b, stride, lane);
}

// Sets to `masked` each element of a warp's 16 x 8 kBlocks tile of scores (C fragments) that is
// not a visible one: a key after its query, a key past the end, and with kMaskQueriesPastEnd a
// query past the end. Element (row, column) is query row0 + row and key col0 + column, or with
// kTransposed key row0 + row and query col0 + column. Positions in 32 bits (one compare each,
// where 64-bit ones take two): sequences are shorter than 2^31 (flash_launch::check_shape).
template <int kBlocks, bool kTransposed, bool kMaskQueriesPastEnd>
__device__ void mask_scores(float acc[kBlocks][kMmaCElements], int row0, int col0, int seq,
                            float masked, int lane) {
#pragma unroll
  for (int nb = 0; nb < kBlocks; ++nb) {
#pragma unroll
    for (int i = 0; i < kMmaCElements; ++i) {
      const int row = row0 + mma_c_row(lane, i), column = col0 + nb * kMmaN + mma_c_col(lane, i);
      const int query = kTransposed ? column : row, key = kTransposed ? row : column;
      const bool visible = key <= query && key < seq && (!kMaskQueriesPastEnd || query < seq);
      if (!visible) acc[nb][i] = masked;
    }
  }
}

// A 16 x HD accumulator of C fragments, zeroed.
template <int HD>
__device__ void zero_rows(float acc[HD / kMmaN][kMmaCElements]) {
#pragma unroll
  for (int ob = 0; ob < HD / kMmaN; ++ob) {
#pragma unroll
    for (int i = 0; i < kMmaCElements; ++i) acc[ob][i] = 0.0f;
  }
}

// Writes a warp's 16 x HD accumulator times `scale` to the rows at dst + row * dst_stride, for
// the rows below `rows` (those of a partial tile that exist).
template <int HD>
__device__ void store_rows(float* dst, int64_t dst_stride, int w0, int64_t rows,
                           const float acc[HD / kMmaN][kMmaCElements], float scale, int lane) {
#pragma unroll
  for (int ob = 0; ob < HD / kMmaN; ++ob) {
#pragma unroll
    for (int i = 0; i < kMmaCElements; ++i) {
      const int64_t row = w0 + mma_c_row(lane, i);
      if (row < rows) dst[row * dst_stride + ob * kMmaN + mma_c_col(lane, i)] = acc[ob][i] * scale;
    }
  }
}

// The key tile's 16 x 8 n-blocks of scores, per warp and 16-row block.
constexpr int kFlashKeyBlocks = int(kFlashKvTile) / kMmaN;

// One key tile of the forward's online softmax for a warp's 16-row block (both forward kernels):
// its scores `sc` (C fragments, masked) move the rows' running max m and partial sums l (rows
// group and group + 8: m[0], l[0] and m[1], l[1]; l is this lane's share, its 16 of the 64
// columns), O is rescaled to the new max, and P = exp(scale (S - m)) comes back rounded to bf16
// as the A fragments of O += P V (`pa`), so its fp32 scores are dead before the product.
template <int HD>
__device__ void online_softmax_step(float sc[kFlashKeyBlocks][kMmaCElements], float m[2],
                                    float l[2], float o[HD / kMmaN][kMmaCElements],
                                    uint32_t pa[kFlashKeyBlocks / 2][4], float scale_log2) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nb = 0; nb < kFlashKeyBlocks; ++nb) {
#pragma unroll
    for (int i = 0; i < kMmaCElements; ++i) tile_max[i >> 1] = fmaxf(tile_max[i >> 1], sc[nb][i]);
  }
  // Key tile 0 holds key 0, which every query sees, so m is finite from tile 0 on; a later tile
  // with no key a row sees leaves its m, rescales by 1 and adds weights 0.
  float rescale[2], neg_m_scaled[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float m_new = fmaxf(m[half], quad_max(tile_max[half]));
    rescale[half] = exp2_approx_ftz((m[half] - m_new) * scale_log2);
    m[half] = m_new;
    neg_m_scaled[half] = -m_new * scale_log2;
    l[half] *= rescale[half];
  }
  // P = exp(scale (S - m)) = exp2(scale_log2 S - scale_log2 m): one fma and one exp2 each.
#pragma unroll
  for (int nb = 0; nb < kFlashKeyBlocks; ++nb) {
#pragma unroll
    for (int i = 0; i < kMmaCElements; ++i) {
      const float p = exp2_approx_ftz(fmaf(sc[nb][i], scale_log2, neg_m_scaled[i >> 1]));
      sc[nb][i] = p;
      l[i >> 1] += p;
    }
  }
  a_fragments_from_c<kFlashKeyBlocks>(pa, sc);
#pragma unroll
  for (int ob = 0; ob < HD / kMmaN; ++ob) {
#pragma unroll
    for (int i = 0; i < kMmaCElements; ++i) o[ob][i] *= rescale[i >> 1];
  }
}

// The end of the forward for a warp's 16-row block at row w0 of the query tile at r0 (both
// forward kernels): out = O / l for the rows below `rows`, and their lse. O / l as O times 1 / l:
// two roundings instead of one, 2^-24 next to P's 2^-9, and no division (with its slow path)
// per element.
template <int HD>
__device__ void store_output_rows(float* out, float* lse, const FlashDims& s, int64_t b, int64_t h,
                                  int64_t r0, int w0, int rows, float o[HD / kMmaN][kMmaCElements],
                                  const float m[2], const float l[2], float scale, int lane) {
  const float row_sum[2] = {quad_sum(l[0]), quad_sum(l[1])};
  const float inverse_sum[2] = {1.0f / row_sum[0], 1.0f / row_sum[1]};
#pragma unroll
  for (int ob = 0; ob < HD / kMmaN; ++ob) {
#pragma unroll
    for (int i = 0; i < kMmaCElements; ++i) o[ob][i] *= inverse_sum[i >> 1];
  }
  store_rows<HD>(out + flash_q_offset(s, b, r0, h, HD), s.heads * HD, w0, rows, o, 1.0f, lane);
  if (mma_quad(lane) == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = w0 + mma_group(lane) + 8 * half;
      if (row < rows)
        lse[flash_stat_offset(s, b, h, r0 + row)] = m[half] * scale + logf(row_sum[half]);
    }
  }
}

// The forward's query tile: kRowBlocks blocks of 16 rows a warp, 64 rows (1) or 128 (2;
// flash_mma_query_tiling). Per key tile a 64-row tile reads 32 KB of K and V (hd 128) for
// 2.1 MFLOP, 64 FLOP a byte: at the flash issue's 350 TFLOP/s, 5.5 TB/s of reads from L2,
// more than the HBM's whole bandwidth (4.8 TB/s on an H200). A 128-row tile does twice the math
// per K and V tile, and each warp loads every K and V fragment once for its two row blocks:
// half the ldmatrix traffic, barriers and copies per mma, and ~20% fewer instructions per mma
// off the diagonal (scripts/sass_counts.sh). The cost is registers: two row blocks' O and
// scores take 192 at hd 128 and fit only in 255 (254 used, no spills; two blocks a
// multiprocessor, as FlashAttention-2's 128-row forward), and at hd 64 spill 420 bytes in the
// 168 that three blocks allow (238 used of 255). Both tiles run the same rows' math in the same
// order, so they give the same bits; tests/gpu/bench_gpu_attention.cpp times both.
// The blocks a multiprocessor holds (__launch_bounds__) of the forward and the dQ pass: three
// with 64-row tiles (168 registers), two with 128 (255).
template <int kRowBlocks>
constexpr int kQueryTileBlocksPerSm = kRowBlocks == 2 ? 2 : 3;

template <int HD, int kRowBlocks>
__global__ void __launch_bounds__(kFlashMmaThreads, kQueryTileBlocksPerSm<kRowBlocks>)
    flash_forward_mma_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, float* out,
                             float* lse, FlashDims s, FlashTiling tiles, float scale) {
  constexpr int kKeyBlocks = kFlashKeyBlocks;
  constexpr int kWarpRows = kRowBlocks * kMmaM;
  constexpr int kQueryTile = kFlashMmaWarps * kWarpRows;  // tiles.q_tile
  extern __shared__ __align__(16) float smem[];           // ldmatrix, cp.async: 16-byte rows
  const FlashMmaSharedLayout lay = flash_mma_shared_layout(FlashKernel::Forward, HD, tiles);
  uint16_t* tile = reinterpret_cast<uint16_t*>(smem);
  uint16_t *qs = tile + lay.q, *ks = tile + lay.k, *vs = tile + lay.v;
  const int st = int(lay.row_stride);
  const FlashBlockTask task = flash_block_task(FlashKernel::Forward, blockIdx.x, s, tiles);
  const int64_t qi = task.tile, b = task.batch, h = task.head, g = task.kv_head;
  const int64_t r0 = qi * kQueryTile;
  const int rows = int(flash_tile_rows(qi, kQueryTile, s.seq));
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int w0 = warp * kWarpRows;  // the warp's first row in the query tile

  const float scale_log2 = scale * kLog2e;  // exp(scale x) = exp2(scale_log2 x)

  // FlashAttention-2's pipeline over one K and one V buffer: V(j) lands while S = Q K(j)^T and
  // the softmax run, K(j + 1) while O += P V(j) runs.
  const int64_t last_kj = flash_last_kv_tile(tiles, qi);
  load_tile_async<HD, kQueryTile>(qs, st, q + flash_q_offset(s, b, r0, h, HD), s.heads * HD, rows);
  load_kv_tile_async<HD>(ks, st, k, s, tiles, b, g, 0);
  cp_async_commit_group();
  float o[kRowBlocks][HD / kMmaN][kMmaCElements];
#pragma unroll
  for (int r = 0; r < kRowBlocks; ++r) zero_rows<HD>(o[r]);
  // Rows w0 + 16 r + group (half 0: c0, c1) and w0 + 16 r + group + 8 (half 1: c2, c3): the
  // running max of the unscaled scores, and this lane's share of the running sum (its 16 of each
  // key tile's 64 columns).
  float m[kRowBlocks][2], l[kRowBlocks][2];
#pragma unroll
  for (int r = 0; r < kRowBlocks; ++r) {
    m[r][0] = m[r][1] = -INFINITY;
    l[r][0] = l[r][1] = 0.0f;
  }

  const int64_t warp_last_query = r0 + w0 + kWarpRows - 1;
  const bool warp_has_rows = w0 < rows;
  for (int64_t kj = 0; kj <= last_kj; ++kj) {
    const int64_t c0 = kj * tiles.kv_tile;
    cp_async_wait_group<0>();
    __syncthreads();  // q and K(kj) are in shared memory; every warp is done with V(kj - 1)
    load_kv_tile_async<HD>(vs, st, v, s, tiles, b, g, kj);
    cp_async_commit_group();

    // A warp whose scores here would all be masked skips the tile's math (warp-uniform), and
    // still takes part in the copies and barriers.
    const bool warp_math = flash_mma_warp_sees_key_tile(c0, warp_last_query, warp_has_rows);
    // P as the A fragments of O += P V, rounded to bf16 as each row block's softmax ends, so
    // its fp32 scores are dead before the next block's and during the product (registers).
    uint32_t pa[kRowBlocks][kKeyBlocks / 2][4];
    if (warp_math) {
      float sc[kRowBlocks][kKeyBlocks][kMmaCElements];
      multiply_by_rows_transposed<HD, kKeyBlocks, kRowBlocks>(sc, qs + w0 * st, ks, st, lane);
      // The mask (keys after the query, and the zero rows past the end of a partial key tile)
      // on the tile pairs that hold such scores.
      if (flash_tile_needs_mask(tiles, qi, kj)) {
#pragma unroll
        for (int r = 0; r < kRowBlocks; ++r) {
          mask_scores<kKeyBlocks, false, false>(sc[r], int(r0) + w0 + r * kMmaM, int(c0),
                                                int(s.seq), -INFINITY, lane);
        }
      }
#pragma unroll
      for (int r = 0; r < kRowBlocks; ++r) {
        online_softmax_step<HD>(sc[r], m[r], l[r], o[r], pa[r], scale_log2);
      }
    }
    cp_async_wait_group<0>();
    __syncthreads();  // V(kj) is in shared memory; every warp is done with K(kj)
    if (kj < last_kj) {
      load_kv_tile_async<HD>(ks, st, k, s, tiles, b, g, kj + 1);
      cp_async_commit_group();
    }
    if (warp_math) {
      accumulate_a_times_rows<HD, kKeyBlocks / 2, kRowBlocks>(o, pa, vs, st, lane);  // O += P V
    }
  }

#pragma unroll
  for (int r = 0; r < kRowBlocks; ++r) {
    store_output_rows<HD>(out, lse, s, b, h, r0, w0 + r * kMmaM, rows, o[r], m[r], l[r], scale,
                          lane);
  }
}

// The warpgroup's two products in the wgmma kernels, issued and not committed. c = A B^T: A and
// B the 64 x HD tiles (64 rows: a slab of a query tile, or a key tile) whose descriptors are
// `a` and `b` (wgmma_scores_operand), both K-major; HD / 16 wgmma, the first overwriting c.
template <int HD>
__device__ void wgmma_rows_times_rows_transposed(float c[kFlashKeyBlocks][kMmaCElements],
                                                 uint64_t a, uint64_t b) {
#pragma unroll
  for (int kk = 0; kk < HD / kWgmmaK; ++kk) {
    wgmma_m64n64k16_ss(c, wgmma_scores_step(a, kk), wgmma_scores_step(b, kk), kk > 0 ? 1 : 0);
  }
}
// acc += A B: A 64 x 64 in registers (a_fragments_from_c's, four 16-column k-steps), B the
// 64 x HD tile whose descriptor is `b` (wgmma_values_operand), MN-major; 4 x HD / 64 wgmma.
template <int HD>
__device__ void wgmma_accumulate_a_times_rows(float acc[HD / kMmaN][kMmaCElements],
                                              const uint32_t a[kFlashKeyBlocks / 2][4],
                                              uint64_t b) {
#pragma unroll
  for (int kk = 0; kk < kFlashKeyBlocks / 2; ++kk) {
#pragma unroll
    for (int half = 0; half < HD / kWgmmaN; ++half) {
      wgmma_m64n64k16_rs_trans_b(acc + half * (kWgmmaN / kMmaN), a[kk],
                                 wgmma_values_step(b, kk, half, HD), 1);
    }
  }
}

// The forward on sm_90a's warpgroup MMA (wgmma): the mma.sync forward above, row for row, with
// its two products issued by the whole block (one warpgroup, kFlashMmaThreads threads) as
// wgmma.m64n64k16 instead of per warp as mma.sync, and its tiles laid out in core matrices for
// the instruction (src/backend/wgmma_operand.h) instead of padded rows for ldmatrix. The query
// tile is kSlabs slabs of 64 rows (64 or 128 rows, as the mma.sync forward's); warp w owns rows
// 16 w .. 16 w + 15 of each slab (wgmma's accumulator layout). Per key tile and slab:
// - S = Q K^T: HD / 16 wgmma, A = the slab of Q's tile and B = K's, both from shared memory
//   (K-major), committed as one group per slab, so that with two slabs at hd 64 slab 0's
//   softmax runs while slab 1's products are still on the tensor cores (wgmma.wait_group 1;
//   kOverlapSlabs says why not at hd 128);
// - O += P V: per 16 keys and 64 output columns one wgmma, A = P from registers (the same
//   a_fragments_from_c as mma.sync's, since a warp's 16 rows of wgmma's accumulators and
//   register A are mma.sync's C and A fragments), B = V's tile MN-major.
// No ldmatrix, and one instruction where a warp issued 32 (S at hd 128: 8 wgmma a slab for 128
// mma and 64 ldmatrix a warp). The copies' pipeline (V(j) lands during S and the softmax,
// K(j + 1) during O += P V), the mask, the online softmax and the output are the mma kernel's.
// Every warp takes part in every wgmma (the instruction is the warpgroup's), and every slab in
// every key tile: a wgmma behind a branch on the slab made ptxas serialize all of them (its
// C7514 warning). So the 128-row tile's first slab computes its last key tile, where all its
// scores are masked (weights 0: O, m and l keep their bits, as where the mma kernel skips it),
// and a slab's rows past a partial tile's end compute scores of zero-filled queries (finite:
// key 0 is visible to every query row) and store nothing. The emulated wgmma and mma.sync sum the
// same products in the same order, so on the emulation this kernel gives the mma kernels' bits
// (tests/backend/test_flash_attention_emulated.cpp); on a GPU the hardware's summation may differ,
// and the GPU test holds it to the same bound of the reference. It runs for
// model.attention = flash_wgmma (FlashMmaInstruction::Wgmma; auto keeps mma.sync until a GPU run
// has measured these kernels) and in attention-bench.
// Registers: one slab capped at 168 (three blocks a multiprocessor), two at 255 (two), as the mma
// forward's 64- and 128-row tiles.
template <int HD, int kSlabs>
__global__ void __launch_bounds__(kFlashMmaThreads, kQueryTileBlocksPerSm<kSlabs>)
    flash_forward_wgmma_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, float* out,
                               float* lse, FlashDims s, FlashTiling tiles, float scale) {
  static_assert(kFlashMmaThreads == 128 && kFlashKvTile == kWgmmaN,
                "one warpgroup; a key tile is one wgmma's N");
  constexpr int kQueryTile = kSlabs * kWgmmaM;   // tiles.q_tile
  extern __shared__ __align__(16) float smem[];  // cp.async, descriptors: 16-byte aligned
  const FlashWgmmaSharedLayout lay = flash_wgmma_shared_layout(HD, kQueryTile);
  unsigned char* shared_bytes = reinterpret_cast<unsigned char*>(smem);
  uint16_t* qs = reinterpret_cast<uint16_t*>(shared_bytes + lay.q);
  uint16_t* ks = reinterpret_cast<uint16_t*>(shared_bytes + lay.k);
  uint16_t* vs = reinterpret_cast<uint16_t*>(shared_bytes + lay.v);
  // The operands' descriptors, built once; each slab's and k-step's is a constant add.
  const uint64_t q_operand = wgmma_scores_operand(shared_space_address(qs), HD);
  const uint64_t k_operand = wgmma_scores_operand(shared_space_address(ks), HD);
  const uint64_t v_operand = wgmma_values_operand(shared_space_address(vs), HD);
  const FlashBlockTask task = flash_block_task(FlashKernel::Forward, blockIdx.x, s, tiles);
  const int64_t qi = task.tile, b = task.batch, h = task.head, g = task.kv_head;
  const int64_t r0 = qi * kQueryTile;
  const int rows = int(flash_tile_rows(qi, kQueryTile, s.seq));
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int w0 = warp * kMmaM;  // the warp's 16 rows of each slab
  const float scale_log2 = scale * kLog2e;
  // Two slabs' scores in flight together, slab 0's softmax running while slab 1's products
  // do, fit the registers at hd 64 only; at hd 128 each slab's S is issued after the last's
  // softmax (209 and 255 registers, no spills; overlapped at hd 128, ptxas spills).
  constexpr bool kOverlapSlabs = kSlabs == 2 && HD == 64;

  const int64_t last_kj = flash_last_kv_tile(tiles, qi);
  load_wgmma_tile_async<HD, kQueryTile>(qs, q + flash_q_offset(s, b, r0, h, HD), s.heads * HD,
                                        rows);
  load_wgmma_kv_tile_async<HD>(ks, k, s, tiles, b, g, 0);
  cp_async_commit_group();
  float o[kSlabs][HD / kMmaN][kMmaCElements];
  float m[kSlabs][2], l[kSlabs][2];
#pragma unroll
  for (int r = 0; r < kSlabs; ++r) {
    zero_rows<HD>(o[r]);
    m[r][0] = m[r][1] = -INFINITY;
    l[r][0] = l[r][1] = 0.0f;
  }

  for (int64_t kj = 0; kj <= last_kj; ++kj) {
    const int64_t c0 = kj * tiles.kv_tile;
    cp_async_wait_group<0>();
    fence_proxy_async_shared();
    __syncthreads();  // q and K(kj) are in shared memory; every warp is done with V(kj - 1)
    load_wgmma_kv_tile_async<HD>(vs, v, s, tiles, b, g, kj);
    cp_async_commit_group();

    float sc[kSlabs][kFlashKeyBlocks][kMmaCElements];
    // S for slab r: its HD / 16 products, one group.
    const auto issue_scores = [&](int r) {
      wgmma_rows_times_rows_transposed<HD>(
          sc[r], wgmma_descriptor_advanced(q_operand, r * wgmma_tile_bytes(kWgmmaM, HD)),
          k_operand);
      wgmma_commit_group();
    };
    if (kOverlapSlabs) {
      wgmma_fence();
      issue_scores(0);
      issue_scores(1);
    }
    uint32_t pa[kSlabs][kFlashKeyBlocks / 2][4];
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) {
      if (!kOverlapSlabs) {
        wgmma_fence();
        issue_scores(r);
        wgmma_wait_group<0>();
      } else if (r == 0) {
        wgmma_wait_group<1>();  // slab 0's scores, slab 1's products still running
      } else {
        wgmma_wait_group<0>();
      }
      wgmma_fence_operands(sc[r]);
      if (flash_tile_needs_mask(tiles, qi, kj)) {
        mask_scores<kFlashKeyBlocks, false, false>(sc[r], int(r0) + r * kWgmmaM + w0, int(c0),
                                                   int(s.seq), -INFINITY, lane);
      }
      online_softmax_step<HD>(sc[r], m[r], l[r], o[r], pa[r], scale_log2);
    }

    cp_async_wait_group<0>();
    fence_proxy_async_shared();
    __syncthreads();  // V(kj) is in shared memory; every warp is done with K(kj)
    if (kj < last_kj) {
      load_wgmma_kv_tile_async<HD>(ks, k, s, tiles, b, g, kj + 1);
      cp_async_commit_group();
    }
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) {
      wgmma_fence_operands(o[r]);  // the softmax's rescale of o and its P land before the fence
      wgmma_fence_operands(pa[r]);
    }
    wgmma_fence();
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) wgmma_accumulate_a_times_rows<HD>(o[r], pa[r], v_operand);
    wgmma_commit_group();
    wgmma_wait_group<0>();
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) wgmma_fence_operands(o[r]);
  }
#pragma unroll
  for (int r = 0; r < kSlabs; ++r) {
    store_output_rows<HD>(out, lse, s, b, h, r0, r * kWgmmaM + w0, rows, o[r], m[r], l[r], scale,
                          lane);
  }
}

// The dQ pass: one block per (batch, head, query tile), kFlashMmaWarps warps of kRowBlocks
// 16-row blocks of query rows (64- or 128-row tiles, as the forward's), over the key tiles the
// causal mask leaves. Per key tile: as the forward, S = Q K^T and P = exp(scale S - lse) (as
// exp2, masked only on the pairs that need it); dP = dO V^T; then dS = P (dP - delta) and
// dQ += dS K, the scale applied once at the end. A warp skips a key tile whose scores would all
// be masked (flash_mma_warp_sees_key_tile). Two row blocks take dQ's, P's and dP's 16 x hd and
// 16 x 64 tiles twice: at hd 64 they fit in 255 registers (two blocks a multiprocessor), at hd
// 128 they do not.
template <int HD, int kRowBlocks>
__global__ void __launch_bounds__(kFlashMmaThreads, kQueryTileBlocksPerSm<kRowBlocks>)
    flash_backward_query_mma_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                    const float* lse, const float* delta, const uint16_t* dout,
                                    float* dq, FlashDims s, FlashTiling tiles, float scale) {
  constexpr int kKeyBlocks = kFlashKeyBlocks;
  constexpr int kWarpRows = kRowBlocks * kMmaM;
  constexpr int kQueryTile = kFlashMmaWarps * kWarpRows;  // tiles.q_tile
  extern __shared__ __align__(16) float smem[];           // ldmatrix, cp.async: 16-byte rows
  const FlashMmaSharedLayout lay = flash_mma_shared_layout(FlashKernel::BackwardQuery, HD, tiles);
  uint16_t* tile = reinterpret_cast<uint16_t*>(smem);
  uint16_t *qs = tile + lay.q, *dos = tile + lay.dout;
  const int st = int(lay.row_stride);
  const FlashBlockTask task = flash_block_task(FlashKernel::BackwardQuery, blockIdx.x, s, tiles);
  const int64_t qi = task.tile, b = task.batch, h = task.head, g = task.kv_head;
  const int64_t r0 = qi * kQueryTile;
  const int rows = int(flash_tile_rows(qi, kQueryTile, s.seq));
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int w0 = warp * kWarpRows;

  // The layout's k and v tiles as two buffers whose roles alternate: K(j) lies in buffer j % 2
  // and V(j) in the other. V(j) lands while S = Q K(j)^T and P run (its buffer held K(j - 1),
  // free once dQ(j - 1) is done), K(j + 1) while dS and dQ += dS K(j) run (its buffer held V(j),
  // free once dP(j) is done). With fixed K and V buffers K(j + 1) could only start after dQ(j)
  // and the loop would wait for each K tile's copy.
  uint16_t *const buffer0 = tile + lay.k, *const buffer1 = tile + lay.v;
  const int64_t last_kj = flash_last_kv_tile(tiles, qi);
  load_tile_async<HD, kQueryTile>(qs, st, q + flash_q_offset(s, b, r0, h, HD), s.heads * HD, rows);
  load_tile_async<HD, kQueryTile>(dos, st, dout + flash_q_offset(s, b, r0, h, HD), s.heads * HD,
                                  rows);
  load_kv_tile_async<HD>(buffer0, st, k, s, tiles, b, g, 0);
  cp_async_commit_group();
  const float scale_log2 = scale * kLog2e;
  // This lane's two rows of each row block (group and group + 8 of its 16): lse in log2 units,
  // delta; rows past the end are masked.
  float row_lse_log2[kRowBlocks][2], row_delta[kRowBlocks][2];
#pragma unroll
  for (int r = 0; r < kRowBlocks; ++r) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = w0 + r * kMmaM + mma_group(lane) + 8 * half;
      const bool real = row < rows;
      row_lse_log2[r][half] = real ? lse[flash_stat_offset(s, b, h, r0 + row)] * kLog2e : 0.0f;
      row_delta[r][half] = real ? delta[flash_stat_offset(s, b, h, r0 + row)] : 0.0f;
    }
  }
  float dq_acc[kRowBlocks][HD / kMmaN][kMmaCElements];
#pragma unroll
  for (int r = 0; r < kRowBlocks; ++r) zero_rows<HD>(dq_acc[r]);

  const int64_t warp_last_query = r0 + w0 + kWarpRows - 1;
  const bool warp_has_rows = w0 < rows;
  for (int64_t kj = 0; kj <= last_kj; ++kj) {
    const int64_t c0 = kj * tiles.kv_tile;
    const bool odd = (kj & 1) != 0;
    uint16_t *ks = odd ? buffer1 : buffer0, *vs = odd ? buffer0 : buffer1;
    cp_async_wait_group<0>();
    __syncthreads();  // q, dout and K(kj) are in shared memory; every warp is done with K(kj - 1)
    load_kv_tile_async<HD>(vs, st, v, s, tiles, b, g, kj);
    cp_async_commit_group();

    // A warp whose scores here would all be masked skips the tile's math (warp-uniform), and
    // still takes part in the copies and barriers. With one row block a warp skips only where
    // it has no rows at all, on a partial tile; there the test costs registers (ptxas spilled
    // 16 bytes at hd 128) and saves nothing worth them.
    const bool warp_math =
        kRowBlocks == 1 || flash_mma_warp_sees_key_tile(c0, warp_last_query, warp_has_rows);
    float sc[kRowBlocks][kKeyBlocks][kMmaCElements];
    if (warp_math) {
      multiply_by_rows_transposed<HD, kKeyBlocks, kRowBlocks>(sc, qs + w0 * st, ks, st, lane);
      // P = exp(scale S - lse) = exp2(scale_log2 S - lse log2 e) into sc.
#pragma unroll
      for (int r = 0; r < kRowBlocks; ++r) {
#pragma unroll
        for (int nb = 0; nb < kKeyBlocks; ++nb) {
#pragma unroll
          for (int i = 0; i < kMmaCElements; ++i) {
            sc[r][nb][i] =
                exp2_approx_ftz(fmaf(sc[r][nb][i], scale_log2, -row_lse_log2[r][i >> 1]));
          }
        }
      }
      if (flash_tile_needs_mask(tiles, qi, kj)) {  // masked pairs exactly 0
#pragma unroll
        for (int r = 0; r < kRowBlocks; ++r) {
          mask_scores<kKeyBlocks, false, true>(sc[r], int(r0) + w0 + r * kMmaM, int(c0), int(s.seq),
                                               0.0f, lane);
        }
      }
    }
    cp_async_wait_group<0>();
    __syncthreads();  // V(kj) is in shared memory
    float dp[kRowBlocks][kKeyBlocks][kMmaCElements];
    if (warp_math) {
      multiply_by_rows_transposed<HD, kKeyBlocks, kRowBlocks>(dp, dos + w0 * st, vs, st, lane);
    }
    // dS = P (dP - delta), as the A fragments of dQ += dS K: with two row blocks before the
    // barrier, with one after it and the next K tile's copies. The same math; where it sits
    // decides whether ptxas spills at 255 and 168 registers (each place spilled the other
    // tiling, on sm_80 or sm_90a: sass_counts.sh --check-spills).
    uint32_t dsa[kRowBlocks][kKeyBlocks / 2][4];
    const auto ds_fragments = [&] {
#pragma unroll
      for (int r = 0; r < kRowBlocks; ++r) {
#pragma unroll
        for (int nb = 0; nb < kKeyBlocks; ++nb) {
#pragma unroll
          for (int i = 0; i < kMmaCElements; ++i) {
            sc[r][nb][i] *= dp[r][nb][i] - row_delta[r][i >> 1];
          }
        }
        a_fragments_from_c<kKeyBlocks>(dsa[r], sc[r]);
      }
    };
    if (kRowBlocks > 1 && warp_math) ds_fragments();
    __syncthreads();  // every warp is done with V(kj), whose buffer K(kj + 1) takes
    if (kj < last_kj) {
      load_kv_tile_async<HD>(vs, st, k, s, tiles, b, g, kj + 1);
      cp_async_commit_group();
    }
    if (warp_math) {
      if (kRowBlocks == 1) ds_fragments();
      accumulate_a_times_rows<HD, kKeyBlocks / 2, kRowBlocks>(dq_acc, dsa, ks, st,
                                                              lane);  // dQ += dS K
    }
  }
#pragma unroll
  for (int r = 0; r < kRowBlocks; ++r) {
    store_rows<HD>(dq + flash_q_offset(s, b, r0, h, HD), s.heads * HD, w0 + r * kMmaM, rows,
                   dq_acc[r], scale, lane);
  }
}

// The dQ pass on sm_90a's warpgroup MMA: the mma.sync dQ pass above, row for row, with its three
// products issued by the block's warpgroup as wgmma.m64n64k16 (as the wgmma forward's; one or
// two 64-row slabs of query rows, warp w owning rows 16 w .. 16 w + 15 of each):
// - S = Q K^T and dP = dO V^T: HD / 16 wgmma a slab each, both operands from shared memory
//   K-major (V's rows are keys, so V^T is the same operand as K^T);
// - dQ += dS K: per 16 keys and 64 columns one wgmma, A = dS from registers (a_fragments_from_c),
//   B = K's tile MN-major (K's rows are the product's K dimension, as V's in the forward).
// The buffers' alternating roles, the masks and dS are the mma kernel's; every slab computes
// every key tile (the wgmma forward says why), its masked pairs' P exactly 0, so dQ gains
// exact zeros there. On the emulation the mma kernel's bits; not yet run on a GPU, so the
// backend runs it for model.attention = flash_wgmma only.
template <int HD, int kSlabs>
__global__ void __launch_bounds__(kFlashMmaThreads, kQueryTileBlocksPerSm<kSlabs>)
    flash_backward_query_wgmma_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                      const float* lse, const float* delta, const uint16_t* dout,
                                      float* dq, FlashDims s, FlashTiling tiles, float scale) {
  static_assert(kFlashMmaThreads == 128 && kFlashKvTile == kWgmmaN,
                "one warpgroup; a key tile is one wgmma's N");
  constexpr int kQueryTile = kSlabs * kWgmmaM;   // tiles.q_tile
  extern __shared__ __align__(16) float smem[];  // cp.async, descriptors: 16-byte aligned
  const FlashWgmmaSharedLayout lay = flash_wgmma_shared_layout(HD, kQueryTile, true);
  unsigned char* shared_bytes = reinterpret_cast<unsigned char*>(smem);
  uint16_t* qs = reinterpret_cast<uint16_t*>(shared_bytes + lay.q);
  uint16_t* dos = reinterpret_cast<uint16_t*>(shared_bytes + lay.dout);
  // K(j) in buffer j % 2, V(j) in the other, as the mma kernel's.
  uint16_t* const buffer0 = reinterpret_cast<uint16_t*>(shared_bytes + lay.k);
  uint16_t* const buffer1 = reinterpret_cast<uint16_t*>(shared_bytes + lay.v);
  const uint64_t q_operand = wgmma_scores_operand(shared_space_address(qs), HD);
  const uint64_t do_operand = wgmma_scores_operand(shared_space_address(dos), HD);
  const uint64_t scores0 = wgmma_scores_operand(shared_space_address(buffer0), HD),
                 scores1 = wgmma_scores_operand(shared_space_address(buffer1), HD);
  const uint64_t values0 = wgmma_values_operand(shared_space_address(buffer0), HD),
                 values1 = wgmma_values_operand(shared_space_address(buffer1), HD);
  const FlashBlockTask task = flash_block_task(FlashKernel::BackwardQuery, blockIdx.x, s, tiles);
  const int64_t qi = task.tile, b = task.batch, h = task.head, g = task.kv_head;
  const int64_t r0 = qi * kQueryTile;
  const int rows = int(flash_tile_rows(qi, kQueryTile, s.seq));
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int w0 = warp * kMmaM;  // the warp's 16 rows of each slab
  const int64_t last_kj = flash_last_kv_tile(tiles, qi);
  load_wgmma_tile_async<HD, kQueryTile>(qs, q + flash_q_offset(s, b, r0, h, HD), s.heads * HD,
                                        rows);
  load_wgmma_tile_async<HD, kQueryTile>(dos, dout + flash_q_offset(s, b, r0, h, HD), s.heads * HD,
                                        rows);
  load_wgmma_kv_tile_async<HD>(buffer0, k, s, tiles, b, g, 0);
  cp_async_commit_group();
  const float scale_log2 = scale * kLog2e;
  // This lane's two rows of each slab (group and group + 8 of its warp's 16): lse in log2
  // units, delta; rows past the end are masked.
  float row_lse_log2[kSlabs][2], row_delta[kSlabs][2];
#pragma unroll
  for (int r = 0; r < kSlabs; ++r) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = r * kWgmmaM + w0 + mma_group(lane) + 8 * half;
      const bool real = row < rows;
      row_lse_log2[r][half] = real ? lse[flash_stat_offset(s, b, h, r0 + row)] * kLog2e : 0.0f;
      row_delta[r][half] = real ? delta[flash_stat_offset(s, b, h, r0 + row)] : 0.0f;
    }
  }
  float dq_acc[kSlabs][HD / kMmaN][kMmaCElements];
#pragma unroll
  for (int r = 0; r < kSlabs; ++r) zero_rows<HD>(dq_acc[r]);

  // C = A B^T for every slab, A the slab's rows of a query-row tile (Q or dO), B^T a key tile
  // (K or V), both K-major: HD / 16 wgmma a slab, one group each, all waited for.
  const auto multiply_slabs = [&](float c[kSlabs][kFlashKeyBlocks][kMmaCElements],
                                  uint64_t rows_operand, uint64_t keys_operand) {
    wgmma_fence();
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) {
      wgmma_rows_times_rows_transposed<HD>(
          c[r], wgmma_descriptor_advanced(rows_operand, r * wgmma_tile_bytes(kWgmmaM, HD)),
          keys_operand);
      wgmma_commit_group();
    }
    wgmma_wait_group<0>();
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) wgmma_fence_operands(c[r]);
  };

  for (int64_t kj = 0; kj <= last_kj; ++kj) {
    const int64_t c0 = kj * tiles.kv_tile;
    const bool odd = (kj & 1) != 0;
    uint16_t* vs = odd ? buffer0 : buffer1;  // V(kj)'s buffer, then K(kj + 1)'s
    cp_async_wait_group<0>();
    fence_proxy_async_shared();
    __syncthreads();  // q, dout and K(kj) are in shared memory; every warp is done with K(kj - 1)
    load_wgmma_kv_tile_async<HD>(vs, v, s, tiles, b, g, kj);
    cp_async_commit_group();

    float sc[kSlabs][kFlashKeyBlocks][kMmaCElements];
    multiply_slabs(sc, q_operand, odd ? scores1 : scores0);  // S = Q K^T
    // P = exp(scale S - lse) = exp2(scale_log2 S - lse log2 e) into sc.
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) {
#pragma unroll
      for (int nb = 0; nb < kFlashKeyBlocks; ++nb) {
#pragma unroll
        for (int i = 0; i < kMmaCElements; ++i) {
          sc[r][nb][i] = exp2_approx_ftz(fmaf(sc[r][nb][i], scale_log2, -row_lse_log2[r][i >> 1]));
        }
      }
    }
    if (flash_tile_needs_mask(tiles, qi, kj)) {  // masked pairs exactly 0
#pragma unroll
      for (int r = 0; r < kSlabs; ++r) {
        mask_scores<kFlashKeyBlocks, false, true>(sc[r], int(r0) + r * kWgmmaM + w0, int(c0),
                                                  int(s.seq), 0.0f, lane);
      }
    }
    cp_async_wait_group<0>();
    fence_proxy_async_shared();
    __syncthreads();  // V(kj) is in shared memory
    float dp[kSlabs][kFlashKeyBlocks][kMmaCElements];
    multiply_slabs(dp, do_operand, odd ? scores0 : scores1);  // dP = dO V^T
    // dS = P (dP - delta), as the A fragments of dQ += dS K.
    uint32_t dsa[kSlabs][kFlashKeyBlocks / 2][4];
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) {
#pragma unroll
      for (int nb = 0; nb < kFlashKeyBlocks; ++nb) {
#pragma unroll
        for (int i = 0; i < kMmaCElements; ++i) sc[r][nb][i] *= dp[r][nb][i] - row_delta[r][i >> 1];
      }
      a_fragments_from_c<kFlashKeyBlocks>(dsa[r], sc[r]);
    }
    __syncthreads();  // every warp is done with V(kj), whose buffer K(kj + 1) takes
    if (kj < last_kj) {
      load_wgmma_kv_tile_async<HD>(vs, k, s, tiles, b, g, kj + 1);
      cp_async_commit_group();
    }
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) {
      wgmma_fence_operands(dq_acc[r]);  // dQ's zeros (the first time) and dS before the fence
      wgmma_fence_operands(dsa[r]);
    }
    wgmma_fence();
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) {
      wgmma_accumulate_a_times_rows<HD>(dq_acc[r], dsa[r], odd ? values1 : values0);
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();  // dQ += dS K(kj)
#pragma unroll
    for (int r = 0; r < kSlabs; ++r) wgmma_fence_operands(dq_acc[r]);
  }
#pragma unroll
  for (int r = 0; r < kSlabs; ++r) {
    store_rows<HD>(dq + flash_q_offset(s, b, r0, h, HD), s.heads * HD, r * kWgmmaM + w0, rows,
                   dq_acc[r], scale, lane);
  }
}

// The dK/dV pass: one block per (batch, kv head, key tile), kFlashMmaWarps warps of 16 key rows,
// over the GQA group's heads and, for each, the query tiles that see the key tile. Per query
// tile, transposed: S^T = K Q^T, P^T = exp(scale S^T - lse) (as exp2, masked only where
// needed), dV += P^T dO; then dP^T = V dO^T, dS^T = P^T (dP^T - delta) and dK += dS^T Q, the
// scale applied once at the end. Each warp owns its 16 rows of dK and dV for the whole loop: no
// atomics. At hd 128 the two 16 x 128 accumulators nearly fill the registers (254 of 255, no
// spills; scripts/sass_counts.sh).
template <int HD>
__global__ void __launch_bounds__(kFlashMmaThreads, 2)
    flash_backward_key_value_mma_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                        const float* lse, const float* delta, const uint16_t* dout,
                                        float* dk, float* dv, FlashDims s, FlashTiling tiles,
                                        float scale) {
  constexpr int kQueryBlocks = int(kFlashQTile) / kMmaN;
  extern __shared__ __align__(16) float smem[];  // ldmatrix, cp.async: 16-byte rows
  const FlashMmaSharedLayout lay =
      flash_mma_shared_layout(FlashKernel::BackwardKeyValue, HD, tiles);
  uint16_t* tile = reinterpret_cast<uint16_t*>(smem);
  uint16_t *ks = tile + lay.k, *vs = tile + lay.v;
  const int st = int(lay.row_stride);
  const FlashBlockTask task = flash_block_task(FlashKernel::BackwardKeyValue, blockIdx.x, s, tiles);
  const int64_t kj = task.tile, b = task.batch, g = task.kv_head;
  const uint32_t group = uint32_t(s.heads) / uint32_t(s.kv_heads);
  const int64_t c0 = kj * tiles.kv_tile;
  const int cols = int(flash_tile_rows(kj, tiles.kv_tile, s.seq));
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int w0 = warp * kMmaM;  // the warp's first key row in the key tile
  const float scale_log2 = scale * kLog2e;
  // The block's tasks: the GQA group's heads, and for each the query tiles that see the key tile
  // (32-bit: task n's head and query tile without a 64-bit division).
  const int64_t first_qi = flash_first_q_tile(tiles, kj);
  const uint32_t per_head = uint32_t(flash_q_tiles(tiles) - first_qi);
  const int64_t tasks = int64_t(group) * per_head;
  // Task n's per-query-tile data sits in stage n % 2 (flash_mma_shared_layout): the copies for
  // task n + 1 land while task n's math runs.
  const auto stage_q = [&](int64_t n) { return tile + lay.q + (n & 1) * lay.stage_elements; };
  const auto stage_dout = [&](int64_t n) { return tile + lay.dout + (n & 1) * lay.stage_elements; };
  const auto stage_lse = [&](int64_t n) { return smem + lay.lse + (n & 1) * lay.stage_floats; };
  const auto stage_delta = [&](int64_t n) { return smem + lay.delta + (n & 1) * lay.stage_floats; };
  // Issues task n's copies into its stage (not committed): its q and dout tiles, and its lse and
  // delta rows, 4 bytes per query row (zero past the end).
  static_assert(kFlashQTile <= kFlashMmaThreads, "a thread per query row of the tile");
  const auto load_task = [&](int64_t n) {
    const int64_t h = g * group + uint32_t(n) / per_head, qi = first_qi + uint32_t(n) % per_head;
    const int64_t r0 = qi * tiles.q_tile;
    const int rows = int(flash_tile_rows(qi, tiles.q_tile, s.seq));
    load_tile_async<HD, kFlashQTile>(stage_q(n), st, q + flash_q_offset(s, b, r0, h, HD),
                                     s.heads * HD, rows);
    load_tile_async<HD, kFlashQTile>(stage_dout(n), st, dout + flash_q_offset(s, b, r0, h, HD),
                                     s.heads * HD, rows);
    const int64_t i = threadIdx.x;
    if (i < tiles.q_tile) {
      const int64_t at = flash_stat_offset(s, b, h, i < rows ? r0 + i : r0);
      cp_async_4(stage_lse(n) + i, lse + at, i < rows ? 4 : 0);
      cp_async_4(stage_delta(n) + i, delta + at, i < rows ? 4 : 0);
    }
  };

  load_kv_tile_async<HD>(ks, st, k, s, tiles, b, g, kj);
  load_kv_tile_async<HD>(vs, st, v, s, tiles, b, g, kj);
  load_task(0);
  cp_async_commit_group();
  float dk_acc[HD / kMmaN][kMmaCElements], dv_acc[HD / kMmaN][kMmaCElements];
  zero_rows<HD>(dk_acc);
  zero_rows<HD>(dv_acc);

  for (int64_t n = 0; n < tasks; ++n) {
    const int64_t qi = first_qi + uint32_t(n) % per_head, r0 = qi * tiles.q_tile;
    const uint16_t *qs = stage_q(n), *dos = stage_dout(n);
    const float *lse_rows = stage_lse(n), *delta_rows = stage_delta(n);
    // Task n + 1's copies go to the other stage, which every warp left at the end of task n - 1.
    if (n + 1 < tasks) {
      load_task(n + 1);
      cp_async_commit_group();
      cp_async_wait_group<1>();  // task n's group (and k, v with task 0's) landed
    } else {
      cp_async_wait_group<0>();
    }
    // Each thread turns the lse it copied into log2 units (its own copy has landed), once per
    // row instead of once per score and key row: the same product, the same bits.
    if (int64_t(threadIdx.x) < tiles.q_tile) stage_lse(n)[threadIdx.x] *= kLog2e;
    __syncthreads();  // task n's tiles and rows are in shared memory

    // P^T into pt: element (key row, query column). dV += P^T dO before dP^T exists, so
    // the two 16 x 64 products are not live at once with everything else (registers). A lane's
    // columns of each n-block are a pair (mma_c_col), so their lse and delta are one 8-byte load.
    float pt[kQueryBlocks][kMmaCElements];
    multiply_by_rows_transposed<HD, kQueryBlocks, 1>(&pt, ks + w0 * st, qs, st, lane);
#pragma unroll
    for (int nb = 0; nb < kQueryBlocks; ++nb) {
      float lse_log2[2];
      load_float2(lse_rows + nb * kMmaN + mma_c_col(lane, 0), lse_log2);
#pragma unroll
      for (int i = 0; i < kMmaCElements; ++i) {
        pt[nb][i] = exp2_approx_ftz(fmaf(pt[nb][i], scale_log2, -lse_log2[i & 1]));
      }
    }
    if (flash_tile_needs_mask(tiles, qi, kj)) {
      // Masked pairs exactly 0 (queries past the end are zero rows of q and dout, whose terms
      // would be 0 anyway, but the mask does not rely on it).
      mask_scores<kQueryBlocks, true, true>(pt, int(c0) + w0, int(r0), int(s.seq), 0.0f, lane);
    }
    accumulate_times_rows<HD, kQueryBlocks, 1>(&dv_acc, &pt, dos, st, lane);  // dV += P^T dO
    // dP^T = V dO^T, then dS^T = P^T (dP^T - delta) into it.
    float dst[kQueryBlocks][kMmaCElements];
    multiply_by_rows_transposed<HD, kQueryBlocks, 1>(&dst, vs + w0 * st, dos, st, lane);
#pragma unroll
    for (int nb = 0; nb < kQueryBlocks; ++nb) {
      float row_delta[2];
      load_float2(delta_rows + nb * kMmaN + mma_c_col(lane, 0), row_delta);
#pragma unroll
      for (int i = 0; i < kMmaCElements; ++i) {
        dst[nb][i] = pt[nb][i] * (dst[nb][i] - row_delta[i & 1]);
      }
    }
    accumulate_times_rows<HD, kQueryBlocks, 1>(&dk_acc, &dst, qs, st, lane);  // dK += dS^T Q
    __syncthreads();  // every warp is done with stage n % 2, where task n + 2's copies go
  }
  const int64_t at = flash_kv_offset(s, b, c0, g, HD);
  store_rows<HD>(dk + at, s.kv_heads * HD, w0, cols, dk_acc, scale, lane);
  store_rows<HD>(dv + at, s.kv_heads * HD, w0, cols, dv_acc, 1.0f, lane);
}

// The dK/dV pass on sm_90a's warpgroup MMA: the mma.sync dK/dV pass above, row for row, with its
// four products issued by the block's warpgroup as wgmma.m64n64k16 (the key tile is one 64-row
// slab, warp w owning key rows 16 w .. 16 w + 15, as there):
// - S^T = K Q^T and dP^T = V dO^T: HD / 16 wgmma each, K's (V's) tile as A and the task's q
//   (dout) tile as B^T, all from shared memory K-major;
// - dV += P^T dO and dK += dS^T Q: per 16 query rows and 64 columns one wgmma, A = P^T (dS^T)
//   from registers, B = the dout (q) tile MN-major. dV's products run while dP^T's are issued.
// The tasks, their two stages of copies, lse and delta, the mask and dS^T are the mma kernel's.
// On the emulation the mma kernel's bits; not yet run on a GPU, so the backend runs it for
// model.attention = flash_wgmma only.
template <int HD>
__global__ void __launch_bounds__(kFlashMmaThreads, 2)
    flash_backward_key_value_wgmma_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                          const float* lse, const float* delta,
                                          const uint16_t* dout, float* dk, float* dv, FlashDims s,
                                          FlashTiling tiles, float scale) {
  static_assert(kFlashMmaThreads == 128 && kFlashKvTile == kWgmmaM && kFlashQTile == kWgmmaN,
                "one warpgroup; the key tile is one wgmma's M, a query tile its N");
  extern __shared__ __align__(16) float smem[];  // cp.async, descriptors: 16-byte aligned
  const FlashWgmmaKeyValueLayout lay = flash_wgmma_key_value_layout(HD);
  unsigned char* shared_bytes = reinterpret_cast<unsigned char*>(smem);
  uint16_t* ks = reinterpret_cast<uint16_t*>(shared_bytes + lay.k);
  uint16_t* vs = reinterpret_cast<uint16_t*>(shared_bytes + lay.v);
  const uint64_t k_operand = wgmma_scores_operand(shared_space_address(ks), HD);
  const uint64_t v_operand = wgmma_scores_operand(shared_space_address(vs), HD);
  // Stage 0's q and dout tiles as B^T (K-major) and as B (MN-major); stage 1's lie
  // lay.stage_bytes after.
  const uint32_t q0 = shared_space_address(shared_bytes + lay.q),
                 dout0 = shared_space_address(shared_bytes + lay.dout);
  const uint64_t q_scores0 = wgmma_scores_operand(q0, HD), q_values0 = wgmma_values_operand(q0, HD);
  const uint64_t dout_scores0 = wgmma_scores_operand(dout0, HD),
                 dout_values0 = wgmma_values_operand(dout0, HD);
  const FlashBlockTask task = flash_block_task(FlashKernel::BackwardKeyValue, blockIdx.x, s, tiles);
  const int64_t kj = task.tile, b = task.batch, g = task.kv_head;
  const uint32_t group = uint32_t(s.heads) / uint32_t(s.kv_heads);
  const int64_t c0 = kj * tiles.kv_tile;
  const int cols = int(flash_tile_rows(kj, tiles.kv_tile, s.seq));
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const int w0 = warp * kMmaM;  // the warp's first key row in the key tile
  const float scale_log2 = scale * kLog2e;
  const int64_t first_qi = flash_first_q_tile(tiles, kj);
  const uint32_t per_head = uint32_t(flash_q_tiles(tiles) - first_qi);
  const int64_t tasks = int64_t(group) * per_head;
  // Task n's data sits in stage n % 2: the copies for task n + 1 land while task n's math runs.
  const auto stage = [&](int64_t n, int offset) {
    return shared_bytes + offset + (n & 1) * lay.stage_bytes;
  };
  const auto stage_lse = [&](int64_t n) { return reinterpret_cast<float*>(stage(n, lay.lse)); };
  const auto stage_delta = [&](int64_t n) { return reinterpret_cast<float*>(stage(n, lay.delta)); };
  static_assert(kFlashQTile <= kFlashMmaThreads, "a thread per query row of the tile");
  const auto load_task = [&](int64_t n) {
    const int64_t h = g * group + uint32_t(n) / per_head, qi = first_qi + uint32_t(n) % per_head;
    const int64_t r0 = qi * tiles.q_tile;
    const int rows = int(flash_tile_rows(qi, tiles.q_tile, s.seq));
    load_wgmma_tile_async<HD, kWgmmaN>(reinterpret_cast<uint16_t*>(stage(n, lay.q)),
                                       q + flash_q_offset(s, b, r0, h, HD), s.heads * HD, rows);
    load_wgmma_tile_async<HD, kWgmmaN>(reinterpret_cast<uint16_t*>(stage(n, lay.dout)),
                                       dout + flash_q_offset(s, b, r0, h, HD), s.heads * HD, rows);
    const int64_t i = threadIdx.x;
    if (i < tiles.q_tile) {
      const int64_t at = flash_stat_offset(s, b, h, i < rows ? r0 + i : r0);
      cp_async_4(stage_lse(n) + i, lse + at, i < rows ? 4 : 0);
      cp_async_4(stage_delta(n) + i, delta + at, i < rows ? 4 : 0);
    }
  };

  load_wgmma_kv_tile_async<HD>(ks, k, s, tiles, b, g, kj);
  load_wgmma_kv_tile_async<HD>(vs, v, s, tiles, b, g, kj);
  load_task(0);
  cp_async_commit_group();
  float dk_acc[HD / kMmaN][kMmaCElements], dv_acc[HD / kMmaN][kMmaCElements];
  zero_rows<HD>(dk_acc);
  zero_rows<HD>(dv_acc);

  for (int64_t n = 0; n < tasks; ++n) {
    const int64_t qi = first_qi + uint32_t(n) % per_head, r0 = qi * tiles.q_tile;
    const float *lse_rows = stage_lse(n), *delta_rows = stage_delta(n);
    const uint32_t stage_offset = uint32_t(n & 1) * uint32_t(lay.stage_bytes);
    const uint64_t q_scores = wgmma_descriptor_advanced(q_scores0, stage_offset),
                   q_values = wgmma_descriptor_advanced(q_values0, stage_offset),
                   dout_scores = wgmma_descriptor_advanced(dout_scores0, stage_offset),
                   dout_values = wgmma_descriptor_advanced(dout_values0, stage_offset);
    if (n + 1 < tasks) {
      load_task(n + 1);
      cp_async_commit_group();
      cp_async_wait_group<1>();  // task n's group (and k, v with task 0's) landed
    } else {
      cp_async_wait_group<0>();
    }
    if (int64_t(threadIdx.x) < tiles.q_tile) stage_lse(n)[threadIdx.x] *= kLog2e;
    fence_proxy_async_shared();
    __syncthreads();  // task n's tiles and rows are in shared memory

    // S^T = K Q^T, then P^T = exp2(scale_log2 S^T - lse log2 e) in place.
    float pt[kFlashKeyBlocks][kMmaCElements];
    wgmma_fence();
    wgmma_rows_times_rows_transposed<HD>(pt, k_operand, q_scores);
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operands(pt);
#pragma unroll
    for (int nb = 0; nb < kFlashKeyBlocks; ++nb) {
      float lse_log2[2];
      load_float2(lse_rows + nb * kMmaN + mma_c_col(lane, 0), lse_log2);
#pragma unroll
      for (int i = 0; i < kMmaCElements; ++i) {
        pt[nb][i] = exp2_approx_ftz(fmaf(pt[nb][i], scale_log2, -lse_log2[i & 1]));
      }
    }
    if (flash_tile_needs_mask(tiles, qi, kj)) {
      mask_scores<kFlashKeyBlocks, true, true>(pt, int(c0) + w0, int(r0), int(s.seq), 0.0f, lane);
    }
    // dV += P^T dO, in flight while dP^T = V dO^T is issued.
    uint32_t pa[kFlashKeyBlocks / 2][4];
    a_fragments_from_c<kFlashKeyBlocks>(pa, pt);
    float dst[kFlashKeyBlocks][kMmaCElements];
    wgmma_fence_operands(dv_acc);  // dV's zeros (the first task) and P^T before the fence
    wgmma_fence_operands(pa);
    wgmma_fence();
    wgmma_accumulate_a_times_rows<HD>(dv_acc, pa, dout_values);
    wgmma_commit_group();
    wgmma_rows_times_rows_transposed<HD>(dst, v_operand, dout_scores);
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operands(dst);
    wgmma_fence_operands(dv_acc);
    // dS^T = P^T (dP^T - delta), then dK += dS^T Q.
#pragma unroll
    for (int nb = 0; nb < kFlashKeyBlocks; ++nb) {
      float row_delta[2];
      load_float2(delta_rows + nb * kMmaN + mma_c_col(lane, 0), row_delta);
#pragma unroll
      for (int i = 0; i < kMmaCElements; ++i) {
        dst[nb][i] = pt[nb][i] * (dst[nb][i] - row_delta[i & 1]);
      }
    }
    uint32_t dsa[kFlashKeyBlocks / 2][4];
    a_fragments_from_c<kFlashKeyBlocks>(dsa, dst);
    wgmma_fence_operands(dk_acc);  // dK's zeros (the first task) and dS^T before the fence
    wgmma_fence_operands(dsa);
    wgmma_fence();
    wgmma_accumulate_a_times_rows<HD>(dk_acc, dsa, q_values);
    wgmma_commit_group();
    wgmma_wait_group<0>();
    wgmma_fence_operands(dk_acc);
    __syncthreads();  // every warp is done with stage n % 2, where task n + 2's copies go
  }
  const int64_t at = flash_kv_offset(s, b, c0, g, HD);
  store_rows<HD>(dk + at, s.kv_heads * HD, w0, cols, dk_acc, scale, lane);
  store_rows<HD>(dv + at, s.kv_heads * HD, w0, cols, dv_acc, 1.0f, lane);
}

// The backward's first pass: for each query row (b, t, h), delta = dout . out in fp32, which
// both passes read, and dout's bf16 copy, whose tiles they read, from one read of dout (the
// SIMT delta kernel and a conversion read it twice, and that delta kernel gives each thread a
// row, so a warp's 32 loads lie H hd floats apart). kFlashDeltaLanes lanes a row, each 16
// bytes of out and of dout per pass, lane j taking chunks j, j + 8, ...: a warp's loads are
// kWarpSize / kFlashDeltaLanes whole consecutive rows of [B, T, H, hd], contiguous. A lane sums
// its products in order, then the row's lanes by butterfly shuffles (every lane the same bits,
// as quad_sum). The bf16 codes are encode_bf16's, as convert_to_bf16 makes them. Rows are
// counted in 32 bits (the host checks B T H < 2^31) and whole warps leave together.
constexpr int kFlashDeltaLanes = 8;
template <int HD>
__global__ void __launch_bounds__(kFlashMmaThreads)
    flash_delta_and_dout_bf16_kernel(const float* out, const float* dout, float* delta,
                                     uint16_t* dout_bf16, FlashDims s) {
  constexpr int kRowsPerWarp = kWarpSize / kFlashDeltaLanes;
  constexpr int kPasses = HD / (4 * kFlashDeltaLanes);
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const uint32_t rows = uint32_t(s.batch * s.seq * s.heads);
  const uint32_t row = (blockIdx.x * kFlashMmaWarps + uint32_t(warp)) * kRowsPerWarp +
                       uint32_t(lane) / kFlashDeltaLanes;
  const uint32_t warp_first_row = row - uint32_t(lane) / kFlashDeltaLanes;
  if (warp_first_row >= rows) return;
  const int sub = lane % kFlashDeltaLanes;
  float sum = 0.0f;
  if (row < rows) {
    const int64_t at = int64_t(row) * HD;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t e = at + 4 * (pass * kFlashDeltaLanes + sub);
      float o[4], d[4];
      load_float4(out + e, o);
      load_float4(dout + e, d);
#pragma unroll
      for (int i = 0; i < 4; ++i) sum += d[i] * o[i];
      store_bf16x4(dout_bf16 + e, uint32_t{encode_bf16(d[0])} | uint32_t{encode_bf16(d[1])} << 16,
                   uint32_t{encode_bf16(d[2])} | uint32_t{encode_bf16(d[3])} << 16);
    }
  }
#pragma unroll
  for (int lane_mask = 1; lane_mask < kFlashDeltaLanes; lane_mask *= 2) {
    sum += warp_shfl_xor(sum, lane_mask);
  }
  if (row < rows && sub == 0) {
    const uint32_t heads = uint32_t(s.heads), seq = uint32_t(s.seq);
    const uint32_t h = row % heads, bt = row / heads, t = bt % seq, b = bt / seq;
    delta[flash_stat_offset(s, b, h, t)] = sum;
  }
}

// ---- device code end

// The bf16 copies in the two buffers (flash_mma_buffers): q, k, v in `inputs`, dout and delta
// in the backward's scratch (null in the forward).
struct Bf16Copies {
  uint16_t *q, *k, *v, *dout;
  float* delta;
};
Bf16Copies buffer_regions(const void* inputs, void* scratch, const FlashDims& s, int64_t head_dim) {
  const FlashMmaBuffers l = flash_mma_buffers(s, head_dim);
  auto* in = static_cast<unsigned char*>(const_cast<void*>(inputs));
  auto* sc = static_cast<unsigned char*>(scratch);
  return {reinterpret_cast<uint16_t*>(in + l.q), reinterpret_cast<uint16_t*>(in + l.k),
          reinterpret_cast<uint16_t*>(in + l.v),
          sc ? reinterpret_cast<uint16_t*>(sc + l.dout) : nullptr,
          sc ? reinterpret_cast<float*>(sc + l.delta) : nullptr};
}

// The kernels read the buffers' rows 16 bytes at a time.
void check_aligned(const void* buffer, const char* what, const FlashDims& s, int64_t head_dim) {
  if (reinterpret_cast<uintptr_t>(buffer) % 16 != 0) {
    throw Error(ErrorKind::Runtime, std::string("flash attention (tensor cores): the ") + what +
                                        " for " + flash_launch::shape_text(s, head_dim) +
                                        " does not start on a 16-byte boundary");
  }
}

template <int HD, int kRowBlocks>
void forward_mma_for(const Bf16Copies& c, float* out, float* lse, const FlashDims& s,
                     cudaStream_t stream) {
  const FlashTiling tiles = flash_mma_query_tiling(s.seq, kFlashMmaWarps * kMmaM * kRowBlocks);
  const int64_t bytes = flash_mma_shared_bytes(FlashKernel::Forward, HD, tiles);
  const unsigned blocks =
      launch_blocks(flash_forward_mma_kernel<HD, kRowBlocks>,
                    flash_grid_blocks(FlashKernel::Forward, s.batch, s.heads, s.kv_heads, tiles),
                    bytes, s, HD, "forward (tensor cores)");
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  flash_forward_mma_kernel<HD, kRowBlocks><<<blocks, kFlashMmaThreads, size_t(bytes), stream>>>(
      c.q, c.k, c.v, out, lse, s, tiles, scale);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

// The dQ pass (after the delta and dK/dV kernels, which made c.delta and c.dout).
template <int HD, int kQueryRowBlocks>
void dq_pass_mma_for(const Bf16Copies& c, const float* lse, float* dq, const FlashDims& s,
                     cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const FlashTiling q_tiles =
      flash_mma_query_tiling(s.seq, kFlashMmaWarps * kMmaM * kQueryRowBlocks);
  const int64_t q_bytes = flash_mma_shared_bytes(FlashKernel::BackwardQuery, HD, q_tiles);
  const unsigned q_blocks = launch_blocks(
      flash_backward_query_mma_kernel<HD, kQueryRowBlocks>,
      flash_grid_blocks(FlashKernel::BackwardQuery, s.batch, s.heads, s.kv_heads, q_tiles), q_bytes,
      s, HD, "backward dq (tensor cores)");
  flash_backward_query_mma_kernel<HD, kQueryRowBlocks>
      <<<q_blocks, kFlashMmaThreads, size_t(q_bytes), stream>>>(c.q, c.k, c.v, lse, c.delta, c.dout,
                                                                dq, s, q_tiles, scale);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

// The dK/dV pass (after the delta kernel, which made c.delta and c.dout).
template <int HD>
void key_value_pass_mma_for(const Bf16Copies& c, const float* lse, float* dk, float* dv,
                            const FlashDims& s, cudaStream_t stream) {
  const FlashTiling tiles = flash_gpu_tiling(s.seq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const int64_t kv_bytes = flash_mma_shared_bytes(FlashKernel::BackwardKeyValue, HD, tiles);
  const unsigned kv_blocks = launch_blocks(
      flash_backward_key_value_mma_kernel<HD>,
      flash_grid_blocks(FlashKernel::BackwardKeyValue, s.batch, s.heads, s.kv_heads, tiles),
      kv_bytes, s, HD, "backward dk/dv (tensor cores)");
  flash_backward_key_value_mma_kernel<HD>
      <<<kv_blocks, kFlashMmaThreads, size_t(kv_bytes), stream>>>(c.q, c.k, c.v, lse, c.delta,
                                                                  c.dout, dk, dv, s, tiles, scale);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

// The backward's first pass: delta and dout's bf16 copy (c.delta, c.dout).
template <int HD>
void delta_pass_for(const Bf16Copies& c, const float* out, const float* dout, const FlashDims& s,
                    cudaStream_t stream) {
  const int64_t rows = s.batch * s.seq * s.heads;
  constexpr int64_t kRowsPerBlock = kFlashMmaWarps * (kWarpSize / kFlashDeltaLanes);
  const unsigned delta_blocks =
      launch_blocks(flash_delta_and_dout_bf16_kernel<HD>,
                    (rows + kRowsPerBlock - 1) / kRowsPerBlock, 0, s, HD, "backward delta");
  flash_delta_and_dout_bf16_kernel<HD>
      <<<delta_blocks, kFlashMmaThreads, 0, stream>>>(out, dout, c.delta, c.dout, s);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

template <int HD, int kSlabs>
void forward_wgmma_for(const Bf16Copies& c, float* out, float* lse, const FlashDims& s,
                       cudaStream_t stream) {
  const FlashTiling tiles = flash_mma_query_tiling(s.seq, kSlabs * kWgmmaM);
  const int64_t bytes = flash_wgmma_shared_layout(HD, kSlabs * kWgmmaM).total_bytes;
  const unsigned blocks =
      launch_blocks(flash_forward_wgmma_kernel<HD, kSlabs>,
                    flash_grid_blocks(FlashKernel::Forward, s.batch, s.heads, s.kv_heads, tiles),
                    bytes, s, HD, "forward (wgmma)");
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  flash_forward_wgmma_kernel<HD, kSlabs><<<blocks, kFlashMmaThreads, size_t(bytes), stream>>>(
      c.q, c.k, c.v, out, lse, s, tiles, scale);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

template <int HD, int kSlabs>
void dq_pass_wgmma_for(const Bf16Copies& c, const float* lse, float* dq, const FlashDims& s,
                       cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const FlashTiling tiles = flash_mma_query_tiling(s.seq, kSlabs * kWgmmaM);
  const int64_t bytes = flash_wgmma_shared_layout(HD, kSlabs * kWgmmaM, true).total_bytes;
  const unsigned blocks = launch_blocks(
      flash_backward_query_wgmma_kernel<HD, kSlabs>,
      flash_grid_blocks(FlashKernel::BackwardQuery, s.batch, s.heads, s.kv_heads, tiles), bytes, s,
      HD, "backward dq (wgmma)");
  flash_backward_query_wgmma_kernel<HD, kSlabs>
      <<<blocks, kFlashMmaThreads, size_t(bytes), stream>>>(c.q, c.k, c.v, lse, c.delta, c.dout, dq,
                                                            s, tiles, scale);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

template <int HD>
void key_value_pass_wgmma_for(const Bf16Copies& c, const float* lse, float* dk, float* dv,
                              const FlashDims& s, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const FlashTiling tiles = flash_gpu_tiling(s.seq);
  const int64_t bytes = flash_wgmma_key_value_layout(HD).total_bytes;
  const unsigned blocks = launch_blocks(
      flash_backward_key_value_wgmma_kernel<HD>,
      flash_grid_blocks(FlashKernel::BackwardKeyValue, s.batch, s.heads, s.kv_heads, tiles), bytes,
      s, HD, "backward dk/dv (wgmma)");
  flash_backward_key_value_wgmma_kernel<HD><<<blocks, kFlashMmaThreads, size_t(bytes), stream>>>(
      c.q, c.k, c.v, lse, c.delta, c.dout, dk, dv, s, tiles, scale);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

// The forward's query tile, else Error(Runtime) naming it.
void check_forward_query_tile(int64_t query_tile) {
  if (query_tile != kFlashQTile && query_tile != 2 * kFlashQTile) {
    throw Error(ErrorKind::Runtime, "flash attention (tensor cores): a forward query tile of " +
                                        std::to_string(query_tile) + " rows; it takes 64 or 128");
  }
}

// The dq pass's query tile at this head dim, else Error(Runtime) naming both.
void check_dq_query_tile(int64_t query_tile, int64_t head_dim) {
  if ((query_tile != kFlashQTile && query_tile != 2 * kFlashQTile) ||
      (query_tile == 2 * kFlashQTile && head_dim != 64)) {
    throw Error(ErrorKind::Runtime, "flash attention (tensor cores): a dq pass query tile of " +
                                        std::to_string(query_tile) + " rows at head dim " +
                                        std::to_string(head_dim) +
                                        "; it takes 64, or 128 at head dim 64");
  }
}

// What keeps the wgmma kernels off `device`, or "" where they run.
std::string wgmma_missing(int device) {
  int major = 0, minor = 0;
  GNMR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GNMR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) {
    return "compute capability " + std::to_string(major) + "." + std::to_string(minor) +
           " (wgmma is sm_90a's: H100, H200)";
  }
  const std::string no_sm90a = "a build without sm_90a code (GNMR_CUDA_ARCHITECTURES has no 90a)";
#if defined(GNMR_KERNELS_HAVE_SM90A)
  // Code compiled for sm_90a has PTX version 90; where the driver cannot load it, it would
  // compile the sm_80 PTX, in which the wgmma wrappers trap.
  cudaFuncAttributes attributes{};
  GNMR_CUDA_CHECK(cudaFuncGetAttributes(&attributes, flash_forward_wgmma_kernel<64, 1>));
  return attributes.ptxVersion < 90 ? no_sm90a : "";
#else
  // A plain sm_90 build has PTX version 90 too, but its wgmma wrappers trap (no
  // __CUDA_ARCH_FEAT_SM90_ALL); only the build knows which architectures it compiled.
  return no_sm90a;
#endif
}

// wgmma_missing(device), asked of the driver once per device: the entry points check it at
// every call (a step calls them twice per layer), and it cannot change while the process runs.
const std::string& wgmma_missing_cached(int device) {
  static std::mutex mutex;
  static std::map<int, std::string> missing;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = missing.find(device);
  if (it == missing.end()) it = missing.emplace(device, wgmma_missing(device)).first;
  return it->second;
}

// With wgmma, Error(Runtime) naming what keeps those kernels off the current device, if anything.
void check_instruction(FlashMmaInstruction instruction, const FlashDims& s, int64_t head_dim) {
  if (instruction != FlashMmaInstruction::Wgmma) return;
  int device = 0;
  GNMR_CUDA_CHECK(cudaGetDevice(&device));
  const std::string& missing = wgmma_missing_cached(device);
  if (!missing.empty()) {
    throw Error(ErrorKind::Runtime, "flash attention on wgmma for " +
                                        flash_launch::shape_text(s, head_dim) +
                                        " does not run here: " + missing);
  }
}

// Each pass at its head dim, tile and instruction (checked by the entry points).
void forward_pass(const Bf16Copies& c, float* out, float* lse, const FlashDims& s, int64_t head_dim,
                  cudaStream_t stream, int64_t query_tile, FlashMmaInstruction instruction) {
  const bool two = query_tile == 2 * kFlashQTile;
  if (instruction == FlashMmaInstruction::Wgmma) {
    if (head_dim == 64) {
      two ? forward_wgmma_for<64, 2>(c, out, lse, s, stream)
          : forward_wgmma_for<64, 1>(c, out, lse, s, stream);
    } else {
      two ? forward_wgmma_for<128, 2>(c, out, lse, s, stream)
          : forward_wgmma_for<128, 1>(c, out, lse, s, stream);
    }
  } else if (head_dim == 64) {
    two ? forward_mma_for<64, 2>(c, out, lse, s, stream)
        : forward_mma_for<64, 1>(c, out, lse, s, stream);
  } else {
    two ? forward_mma_for<128, 2>(c, out, lse, s, stream)
        : forward_mma_for<128, 1>(c, out, lse, s, stream);
  }
}
void dq_pass(const Bf16Copies& c, const float* lse, float* dq, const FlashDims& s, int64_t head_dim,
             cudaStream_t stream, int64_t query_tile, FlashMmaInstruction instruction) {
  const bool two = query_tile == 2 * kFlashQTile;  // at head dim 64 only (check_dq_query_tile)
  if (instruction == FlashMmaInstruction::Wgmma) {
    if (head_dim == 64) {
      two ? dq_pass_wgmma_for<64, 2>(c, lse, dq, s, stream)
          : dq_pass_wgmma_for<64, 1>(c, lse, dq, s, stream);
    } else {
      dq_pass_wgmma_for<128, 1>(c, lse, dq, s, stream);
    }
  } else if (head_dim == 64) {
    two ? dq_pass_mma_for<64, 2>(c, lse, dq, s, stream)
        : dq_pass_mma_for<64, 1>(c, lse, dq, s, stream);
  } else {
    dq_pass_mma_for<128, 1>(c, lse, dq, s, stream);
  }
}
void key_value_pass(const Bf16Copies& c, const float* lse, float* dk, float* dv, const FlashDims& s,
                    int64_t head_dim, cudaStream_t stream, FlashMmaInstruction instruction) {
  if (instruction == FlashMmaInstruction::Wgmma) {
    head_dim == 64 ? key_value_pass_wgmma_for<64>(c, lse, dk, dv, s, stream)
                   : key_value_pass_wgmma_for<128>(c, lse, dk, dv, s, stream);
  } else {
    head_dim == 64 ? key_value_pass_mma_for<64>(c, lse, dk, dv, s, stream)
                   : key_value_pass_mma_for<128>(c, lse, dk, dv, s, stream);
  }
}

}  // namespace

std::string flash_wgmma_unavailable(int device) {
  return wgmma_missing(device);
}

int64_t flash_attention_mma_inputs_bytes(int64_t batch, int64_t seq, int64_t heads,
                                         int64_t kv_heads, int64_t head_dim) {
  return flash_mma_buffers(FlashDims{batch, seq, heads, kv_heads}, head_dim).inputs_bytes;
}
int64_t flash_attention_mma_scratch_bytes(int64_t batch, int64_t seq, int64_t heads,
                                          int64_t kv_heads, int64_t head_dim) {
  return flash_mma_buffers(FlashDims{batch, seq, heads, kv_heads}, head_dim).scratch_bytes;
}

namespace {

// The checks both forward entry points make (the shape, the tile, the instruction, the copies'
// alignment), then the copies' regions. False for an empty shape: nothing to do.
bool checked_forward_regions(const void* inputs, const FlashDims& s, int64_t head_dim,
                             int64_t query_tile, FlashMmaInstruction instruction, Bf16Copies& c) {
  check_shape(s, head_dim);
  check_forward_query_tile(query_tile);
  check_instruction(instruction, s, head_dim);
  if (s.batch * s.seq * s.heads == 0) return false;
  check_aligned(inputs, "inputs' bf16 copies", s, head_dim);
  c = buffer_regions(inputs, nullptr, s, head_dim);
  return true;
}

// The checks the backward entry points make (the shape, the dq pass's tile, the instruction,
// the rows' count in 31 bits, the buffers' alignment), then the bf16 copies' and the scratch's
// regions. False for an empty shape: nothing to do.
bool checked_backward_regions(const void* inputs, const void* scratch, const FlashDims& s,
                              int64_t head_dim, int64_t query_tile, FlashMmaInstruction instruction,
                              Bf16Copies& c) {
  check_shape(s, head_dim);
  check_dq_query_tile(query_tile, head_dim);
  check_instruction(instruction, s, head_dim);
  const int64_t rows = s.batch * s.seq * s.heads;
  if (rows == 0) return false;
  check_aligned(inputs, "inputs' bf16 copies", s, head_dim);
  check_aligned(scratch, "scratch", s, head_dim);
  if (rows >= (int64_t{1} << 31)) {
    throw Error(ErrorKind::Runtime,
                "flash attention (tensor cores): " + flash_launch::shape_text(s, head_dim) +
                    " has " + std::to_string(rows) +
                    " query rows; the backward counts them in 31 bits");
  }
  c = buffer_regions(inputs, const_cast<void*>(scratch), s, head_dim);
  return true;
}

}  // namespace

void flash_attention_forward_mma(const float* q, const float* k, const float* v,
                                 const float* rope_cos, const float* rope_sin, float* out,
                                 float* lse, void* inputs, int64_t batch, int64_t seq,
                                 int64_t heads, int64_t kv_heads, int64_t head_dim,
                                 cudaStream_t stream, int64_t query_tile,
                                 FlashMmaInstruction instruction) {
  const FlashDims s{batch, seq, heads, kv_heads};
  Bf16Copies c{};
  if (!checked_forward_regions(inputs, s, head_dim, query_tile, instruction, c)) return;
  GNMR_CHECK((rope_cos == nullptr) == (rope_sin == nullptr),
             "flash attention (tensor cores): RoPE needs both tables, cos and sin");
  if (rope_cos != nullptr) {  // q and k rotated as they are copied
    rope_forward_to_bf16(q, rope_cos, rope_sin, batch, seq, heads, head_dim, c.q, stream);
    rope_forward_to_bf16(k, rope_cos, rope_sin, batch, seq, kv_heads, head_dim, c.k, stream);
  } else {
    convert_to_bf16(q, batch * seq * heads * head_dim, c.q, stream);
    convert_to_bf16(k, batch * seq * kv_heads * head_dim, c.k, stream);
  }
  convert_to_bf16(v, batch * seq * kv_heads * head_dim, c.v, stream);
  forward_pass(c, out, lse, s, head_dim, stream, query_tile, instruction);
}

void flash_forward_mma_kernel_only(const void* inputs, float* out, float* lse, int64_t batch,
                                   int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                   cudaStream_t stream, int64_t query_tile,
                                   FlashMmaInstruction instruction) {
  const FlashDims s{batch, seq, heads, kv_heads};
  Bf16Copies c{};
  if (!checked_forward_regions(inputs, s, head_dim, query_tile, instruction, c)) return;
  forward_pass(c, out, lse, s, head_dim, stream, query_tile, instruction);
}

void flash_dq_pass_mma_only(const void* inputs, const float* lse, const void* scratch, float* dq,
                            int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                            int64_t head_dim, cudaStream_t stream, int64_t query_tile,
                            FlashMmaInstruction instruction) {
  const FlashDims s{batch, seq, heads, kv_heads};
  Bf16Copies c{};
  if (!checked_backward_regions(inputs, scratch, s, head_dim, query_tile, instruction, c)) return;
  dq_pass(c, lse, dq, s, head_dim, stream, query_tile, instruction);
}

void flash_key_value_pass_mma_only(const void* inputs, const float* lse, const void* scratch,
                                   float* dk, float* dv, int64_t batch, int64_t seq, int64_t heads,
                                   int64_t kv_heads, int64_t head_dim, cudaStream_t stream,
                                   FlashMmaInstruction instruction) {
  const FlashDims s{batch, seq, heads, kv_heads};
  Bf16Copies c{};
  if (!checked_backward_regions(inputs, scratch, s, head_dim, kFlashQTile, instruction, c)) {
    return;
  }
  key_value_pass(c, lse, dk, dv, s, head_dim, stream, instruction);
}

void flash_attention_backward_mma(const void* inputs, const float* out, const float* lse,
                                  const float* dout, float* dq, float* dk, float* dv, void* scratch,
                                  int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim, cudaStream_t stream, int64_t query_tile,
                                  FlashMmaInstruction instruction) {
  const FlashDims s{batch, seq, heads, kv_heads};
  Bf16Copies c{};
  if (!checked_backward_regions(inputs, scratch, s, head_dim, query_tile, instruction, c)) return;
  check_aligned(out, "output", s, head_dim);
  check_aligned(dout, "output gradient", s, head_dim);
  head_dim == 64 ? delta_pass_for<64>(c, out, dout, s, stream)
                 : delta_pass_for<128>(c, out, dout, s, stream);
  key_value_pass(c, lse, dk, dv, s, head_dim, stream, instruction);
  dq_pass(c, lse, dq, s, head_dim, stream, query_tile, instruction);
}

}  // namespace gnmr::cuda
