// Flash attention, causal GQA, forward and deterministic backward: a plain SIMT fp32 version
// (no tensor cores yet; docs/DESIGN.md §6). CPU twin: gnmr::cpu::flash_attention_forward /
// flash_attention_backward (src/backend/cpu/flash_attention.cpp), which it follows tile for tile
// and, per output element, in the same order of operations: the same tiles
// (src/backend/flash_tiling.h, 64 x 64), the same sequential dot products, the same online
// softmax updates, the same order of the backward's sums. With --fmad=false the two differ only
// where CUDA's expf / logf round differently from the host's exp / log.
//
// Kernels (thread blocks of kFlashThreads, tiles in dynamic shared memory laid out by
// src/backend/flash_layout.h; FlashAttention-2, arXiv 2307.08691, algorithms 1 and 2):
// - forward: one block per (batch, head, query tile); loops over the key tiles the causal mask
//   leaves; writes out and lse = m + log(l).
// - delta: one thread per (batch, head, query): delta = dout . out.
// - pass 1: one block per (batch, kv head, key tile) owns those dK and dV rows, looping over
//   the GQA group's heads, then the query tiles from the first that sees the key tile.
// - pass 2: one block per (batch, head, query tile) owns those dQ rows, looping over key tiles.
// No atomics and no cross-block sums: each output element is written by one thread, which adds
// its terms in a fixed order, so the bits are the same on every run.
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "backend/flash_layout.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/flash_launch.cuh"

namespace gnmr::cuda {
namespace {

using flash_launch::check_shape;
using flash_launch::launch_blocks;
using flash_launch::shape_text;

// ---- device code begin: tests/backend/test_flash_attention_emulated.cpp runs what lies
// between these markers on the host (tests/emulated_cuda) against the CPU twin.

// Sequential over d, as the CPU twin's dot.
template <int HD>
__device__ float dot(const float* a, const float* b) {
  float sum = 0.0f;
  for (int d = 0; d < HD; ++d) sum += a[d] * b[d];
  return sum;
}

// rows x HD floats: row r from global src + r * src_stride into shared dst + r * dst_stride.
template <int HD>
__device__ void load_tile(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                          int64_t rows) {
  for (int64_t e = threadIdx.x; e < rows * HD; e += blockDim.x) {
    const int64_t r = e / HD, d = e % HD;
    dst[r * dst_stride + d] = src[r * src_stride + d];
  }
}

// Elements of a 64 x HD register tile each thread owns (flash_layout.h).
template <int HD>
constexpr int kOwned = int(flash_owned_per_thread(HD));
static_assert(kFlashQTile == kFlashKvTile, "register tiles assume square tiles");
static_assert(kFlashQTile * 64 % kFlashThreads == 0, "every element of a tile has one owner");

template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(const float* q, const float* k, const float* v, float* out, float* lse,
                         FlashDims s, FlashTiling tiles, float scale) {
  extern __shared__ float smem[];
  const FlashSharedLayout lay = flash_shared_layout(FlashKernel::Forward, HD, tiles);
  float *qs = smem + lay.q, *ks = smem + lay.k, *vs = smem + lay.v, *ss = smem + lay.s;
  float *m = smem + lay.row_a, *l = smem + lay.row_b, *rescale = smem + lay.row_c;
  const FlashBlockTask task = flash_block_task(FlashKernel::Forward, blockIdx.x, s, tiles);
  const int64_t qi = task.tile, b = task.batch, h = task.head, g = task.kv_head;
  const int64_t r0 = qi * tiles.q_tile, rows = flash_tile_rows(qi, tiles.q_tile, s.seq);
  const int64_t sst = lay.score_stride, kvs = lay.kv_stride;

  load_tile<HD>(qs, HD, q + flash_q_offset(s, b, r0, h, HD), s.heads * HD, rows);
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) m[i] = -INFINITY, l[i] = 0.0f;
  float acc[kOwned<HD>];
#pragma unroll
  for (int a = 0; a < kOwned<HD>; ++a) acc[a] = 0.0f;

  for (int64_t kj = 0; kj <= flash_last_kv_tile(tiles, qi); ++kj) {
    const int64_t c0 = kj * tiles.kv_tile, cols = flash_tile_rows(kj, tiles.kv_tile, s.seq);
    const bool masked = flash_tile_is_masked(tiles, qi, kj);
    __syncthreads();  // the previous key tile's readers of ks, vs, ss are done
    load_tile<HD>(ks, kvs, k + flash_kv_offset(s, b, c0, g, HD), s.kv_heads * HD, cols);
    load_tile<HD>(vs, kvs, v + flash_kv_offset(s, b, c0, g, HD), s.kv_heads * HD, cols);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < tiles.q_tile * tiles.kv_tile; e += blockDim.x) {
      const int64_t i = e / tiles.kv_tile, j = e % tiles.kv_tile;
      if (i >= rows || j >= cols) continue;
      ss[i * sst + j] =
          masked && c0 + j > r0 + i ? -INFINITY : dot<HD>(qs + i * HD, ks + j * kvs) * scale;
    }
    __syncthreads();
    // The online softmax update of each row (one thread per row, keys in order).
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
      float* row = ss + i * sst;
      float tile_max = -INFINITY;
      for (int64_t j = 0; j < cols; ++j) tile_max = fmaxf(tile_max, row[j]);
      // Key tile 0 always holds key 0, which every query sees: m is finite after it.
      const float m_new = fmaxf(m[i], tile_max);
      const float r = expf(m[i] - m_new);
      float row_sum = 0.0f;
      for (int64_t j = 0; j < cols; ++j) {
        const float p = expf(row[j] - m_new);
        row[j] = p;
        row_sum += p;
      }
      l[i] = l[i] * r + row_sum;
      m[i] = m_new;
      rescale[i] = r;
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < kOwned<HD>; ++a) {
      const int64_t i = (threadIdx.x + int64_t(a) * kFlashThreads) / HD;
      if (i < rows) acc[a] *= rescale[i];
    }
    for (int64_t j = 0; j < cols; ++j) {
#pragma unroll
      for (int a = 0; a < kOwned<HD>; ++a) {
        const int64_t e = threadIdx.x + int64_t(a) * kFlashThreads, i = e / HD, d = e % HD;
        if (i < rows) acc[a] += ss[i * sst + j] * vs[j * kvs + d];
      }
    }
  }
  // l and m were last written before the loop's final barrier.
#pragma unroll
  for (int a = 0; a < kOwned<HD>; ++a) {
    const int64_t e = threadIdx.x + int64_t(a) * kFlashThreads, i = e / HD, d = e % HD;
    if (i < rows) out[flash_q_offset(s, b, r0 + i, h, HD) + d] = acc[a] / l[i];
  }
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    lse[flash_stat_offset(s, b, h, r0 + i)] = m[i] + logf(l[i]);
  }
}

template <int HD>
__global__ void flash_delta_kernel(const float* out, const float* dout, float* delta, FlashDims s) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= s.batch * s.heads * s.seq) return;
  const int64_t t = row % s.seq, bh = row / s.seq, b = bh / s.heads, h = bh % s.heads;
  const int64_t at = flash_q_offset(s, b, t, h, HD);
  delta[row] = dot<HD>(dout + at, out + at);
}

// The recomputed probability and score gradient of every (query i, key j) pair the mask keeps,
// into ps and dss (ps may be null when only dS is needed).
template <int HD>
__device__ void probs_and_score_grads(const float* qs, const float* dos, const float* ks,
                                      const float* vs, const float* lse_rows,
                                      const float* delta_rows, float* ps, float* dss,
                                      const FlashSharedLayout& lay, const FlashTiling& tiles,
                                      int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                                      bool masked, float scale) {
  const int64_t sst = lay.score_stride, kvs = lay.kv_stride;
  for (int64_t e = threadIdx.x; e < tiles.q_tile * tiles.kv_tile; e += blockDim.x) {
    const int64_t i = e / tiles.kv_tile, j = e % tiles.kv_tile;
    if (i >= rows || j >= cols || (masked && c0 + j > r0 + i)) continue;
    const float p = expf(dot<HD>(qs + i * HD, ks + j * kvs) * scale - lse_rows[i]);
    const float dp = dot<HD>(dos + i * HD, vs + j * kvs);
    if (ps) ps[i * sst + j] = p;
    dss[i * sst + j] = p * (dp - delta_rows[i]);
  }
}

template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_key_value_kernel(const float* q, const float* k, const float* v,
                                    const float* lse, const float* delta, const float* dout,
                                    float* dk, float* dv, FlashDims s, FlashTiling tiles,
                                    float scale) {
  extern __shared__ float smem[];
  const FlashSharedLayout lay = flash_shared_layout(FlashKernel::BackwardKeyValue, HD, tiles);
  float *qs = smem + lay.q, *dos = smem + lay.dout, *ks = smem + lay.k, *vs = smem + lay.v;
  float *ps = smem + lay.s, *dss = smem + lay.ds, *lse_rows = smem + lay.row_a,
        *delta_rows = smem + lay.row_b;
  const int64_t q_tiles = flash_q_tiles(tiles);
  const FlashBlockTask task = flash_block_task(FlashKernel::BackwardKeyValue, blockIdx.x, s, tiles);
  const int64_t kj = task.tile, b = task.batch, g = task.kv_head, group = s.heads / s.kv_heads;
  const int64_t c0 = kj * tiles.kv_tile, cols = flash_tile_rows(kj, tiles.kv_tile, s.seq);
  const int64_t sst = lay.score_stride;

  load_tile<HD>(ks, lay.kv_stride, k + flash_kv_offset(s, b, c0, g, HD), s.kv_heads * HD, cols);
  load_tile<HD>(vs, lay.kv_stride, v + flash_kv_offset(s, b, c0, g, HD), s.kv_heads * HD, cols);
  // Owned: key row j = e / HD, column d = e % HD of the dK and dV tiles.
  float dk_acc[kOwned<HD>], dv_acc[kOwned<HD>];
#pragma unroll
  for (int a = 0; a < kOwned<HD>; ++a) dk_acc[a] = dv_acc[a] = 0.0f;

  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t qi = flash_first_q_tile(tiles, kj); qi < q_tiles; ++qi) {
      const int64_t r0 = qi * tiles.q_tile, rows = flash_tile_rows(qi, tiles.q_tile, s.seq);
      const bool masked = flash_tile_is_masked(tiles, qi, kj);
      __syncthreads();  // the previous query tile's readers are done
      load_tile<HD>(qs, HD, q + flash_q_offset(s, b, r0, h, HD), s.heads * HD, rows);
      load_tile<HD>(dos, HD, dout + flash_q_offset(s, b, r0, h, HD), s.heads * HD, rows);
      for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
        lse_rows[i] = lse[flash_stat_offset(s, b, h, r0 + i)];
        delta_rows[i] = delta[flash_stat_offset(s, b, h, r0 + i)];
      }
      __syncthreads();
      probs_and_score_grads<HD>(qs, dos, ks, vs, lse_rows, delta_rows, ps, dss, lay, tiles, r0,
                                rows, c0, cols, masked, scale);
      __syncthreads();
      for (int64_t i = 0; i < rows; ++i) {
#pragma unroll
        for (int a = 0; a < kOwned<HD>; ++a) {
          const int64_t e = threadIdx.x + int64_t(a) * kFlashThreads, j = e / HD, d = e % HD;
          if (j >= cols || (masked && c0 + j > r0 + i)) continue;
          dv_acc[a] += ps[i * sst + j] * dos[i * HD + d];
          dk_acc[a] += dss[i * sst + j] * qs[i * HD + d] * scale;
        }
      }
    }
  }
#pragma unroll
  for (int a = 0; a < kOwned<HD>; ++a) {
    const int64_t e = threadIdx.x + int64_t(a) * kFlashThreads, j = e / HD, d = e % HD;
    if (j >= cols) continue;
    dk[flash_kv_offset(s, b, c0 + j, g, HD) + d] = dk_acc[a];
    dv[flash_kv_offset(s, b, c0 + j, g, HD) + d] = dv_acc[a];
  }
}

template <int HD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_query_kernel(const float* q, const float* k, const float* v, const float* lse,
                                const float* delta, const float* dout, float* dq, FlashDims s,
                                FlashTiling tiles, float scale) {
  extern __shared__ float smem[];
  const FlashSharedLayout lay = flash_shared_layout(FlashKernel::BackwardQuery, HD, tiles);
  float *qs = smem + lay.q, *dos = smem + lay.dout, *ks = smem + lay.k, *vs = smem + lay.v;
  float *dss = smem + lay.ds, *lse_rows = smem + lay.row_a, *delta_rows = smem + lay.row_b;
  const FlashBlockTask task = flash_block_task(FlashKernel::BackwardQuery, blockIdx.x, s, tiles);
  const int64_t qi = task.tile, b = task.batch, h = task.head, g = task.kv_head;
  const int64_t r0 = qi * tiles.q_tile, rows = flash_tile_rows(qi, tiles.q_tile, s.seq);
  const int64_t sst = lay.score_stride, kvs = lay.kv_stride;

  load_tile<HD>(qs, HD, q + flash_q_offset(s, b, r0, h, HD), s.heads * HD, rows);
  load_tile<HD>(dos, HD, dout + flash_q_offset(s, b, r0, h, HD), s.heads * HD, rows);
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    lse_rows[i] = lse[flash_stat_offset(s, b, h, r0 + i)];
    delta_rows[i] = delta[flash_stat_offset(s, b, h, r0 + i)];
  }
  // Owned: query row i = e / HD, column d = e % HD of the dQ tile.
  float dq_acc[kOwned<HD>];
#pragma unroll
  for (int a = 0; a < kOwned<HD>; ++a) dq_acc[a] = 0.0f;

  for (int64_t kj = 0; kj <= flash_last_kv_tile(tiles, qi); ++kj) {
    const int64_t c0 = kj * tiles.kv_tile, cols = flash_tile_rows(kj, tiles.kv_tile, s.seq);
    const bool masked = flash_tile_is_masked(tiles, qi, kj);
    __syncthreads();  // the previous key tile's readers are done (and the query tile loaded)
    load_tile<HD>(ks, kvs, k + flash_kv_offset(s, b, c0, g, HD), s.kv_heads * HD, cols);
    load_tile<HD>(vs, kvs, v + flash_kv_offset(s, b, c0, g, HD), s.kv_heads * HD, cols);
    __syncthreads();
    probs_and_score_grads<HD>(qs, dos, ks, vs, lse_rows, delta_rows, nullptr, dss, lay, tiles, r0,
                              rows, c0, cols, masked, scale);
    __syncthreads();
    for (int64_t j = 0; j < cols; ++j) {
#pragma unroll
      for (int a = 0; a < kOwned<HD>; ++a) {
        const int64_t e = threadIdx.x + int64_t(a) * kFlashThreads, i = e / HD, d = e % HD;
        if (i >= rows || (masked && c0 + j > r0 + i)) continue;
        dq_acc[a] += dss[i * sst + j] * ks[j * kvs + d] * scale;
      }
    }
  }
#pragma unroll
  for (int a = 0; a < kOwned<HD>; ++a) {
    const int64_t e = threadIdx.x + int64_t(a) * kFlashThreads, i = e / HD, d = e % HD;
    if (i < rows) dq[flash_q_offset(s, b, r0 + i, h, HD) + d] = dq_acc[a];
  }
}

// ---- device code end

template <int HD>
void forward_for(const float* q, const float* k, const float* v, float* out, float* lse,
                 const FlashDims& s, cudaStream_t stream) {
  const FlashTiling tiles = flash_gpu_tiling(s.seq);
  const int64_t bytes = flash_shared_bytes(FlashKernel::Forward, HD, tiles);
  const unsigned blocks =
      launch_blocks(flash_forward_kernel<HD>,
                    flash_grid_blocks(FlashKernel::Forward, s.batch, s.heads, s.kv_heads, tiles),
                    bytes, s, HD, "forward");
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  flash_forward_kernel<HD>
      <<<blocks, kFlashThreads, size_t(bytes), stream>>>(q, k, v, out, lse, s, tiles, scale);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

template <int HD>
void delta_for(const float* out, const float* dout, float* delta, const FlashDims& s,
               cudaStream_t stream) {
  const int64_t rows = s.batch * s.heads * s.seq;
  const int64_t delta_blocks = (rows + kFlashThreads - 1) / kFlashThreads;
  GNMR_CHECK(delta_blocks <= INT_MAX, "flash attention delta: grid of " +
                                          std::to_string(delta_blocks) + " blocks for " +
                                          shape_text(s, HD) + " exceeds 2^31-1");
  flash_delta_kernel<HD><<<unsigned(delta_blocks), kFlashThreads, 0, stream>>>(out, dout, delta, s);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

template <int HD>
void backward_for(const float* q, const float* k, const float* v, const float* out,
                  const float* lse, const float* dout, float* dq, float* dk, float* dv,
                  float* delta, const FlashDims& s, cudaStream_t stream) {
  const FlashTiling tiles = flash_gpu_tiling(s.seq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  delta_for<HD>(out, dout, delta, s, stream);

  const int64_t kv_bytes = flash_shared_bytes(FlashKernel::BackwardKeyValue, HD, tiles);
  const unsigned kv_blocks = launch_blocks(
      flash_backward_key_value_kernel<HD>,
      flash_grid_blocks(FlashKernel::BackwardKeyValue, s.batch, s.heads, s.kv_heads, tiles),
      kv_bytes, s, HD, "backward dk/dv");
  flash_backward_key_value_kernel<HD><<<kv_blocks, kFlashThreads, size_t(kv_bytes), stream>>>(
      q, k, v, lse, delta, dout, dk, dv, s, tiles, scale);
  GNMR_CUDA_CHECK(cudaGetLastError());

  const int64_t q_bytes = flash_shared_bytes(FlashKernel::BackwardQuery, HD, tiles);
  const unsigned q_blocks = launch_blocks(
      flash_backward_query_kernel<HD>,
      flash_grid_blocks(FlashKernel::BackwardQuery, s.batch, s.heads, s.kv_heads, tiles), q_bytes,
      s, HD, "backward dq");
  flash_backward_query_kernel<HD><<<q_blocks, kFlashThreads, size_t(q_bytes), stream>>>(
      q, k, v, lse, delta, dout, dq, s, tiles, scale);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool flash_attention_supports_head_dim(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128;
}

int64_t flash_attention_shared_bytes(int64_t head_dim, int64_t seq, bool tensor_cores) {
  const FlashTiling tiles = flash_gpu_tiling(seq);
  int64_t most = 0;
  for (FlashKernel kernel :
       {FlashKernel::Forward, FlashKernel::BackwardKeyValue, FlashKernel::BackwardQuery}) {
    // The tensor-core forward and dq pass run their own query tiles.
    const FlashTiling mma_tiles =
        kernel == FlashKernel::Forward ? flash_mma_query_tiling(seq, kFlashMmaForwardQueryTile)
        : kernel == FlashKernel::BackwardQuery
            ? flash_mma_query_tiling(seq, flash_mma_query_pass_tile(head_dim))
            : tiles;
    most = std::max(most, tensor_cores ? flash_mma_shared_bytes(kernel, head_dim, mma_tiles)
                                       : flash_shared_bytes(kernel, head_dim, tiles));
  }
  return most;
}

int64_t flash_attention_backward_scratch_floats(int64_t batch, int64_t seq, int64_t heads) {
  return flash_backward_scratch_floats(batch, heads, seq);
}

void flash_attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                             int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, cudaStream_t stream) {
  const FlashDims s{batch, seq, heads, kv_heads};
  check_shape(s, head_dim);
  if (batch * seq * heads == 0) return;
  if (head_dim == 64) {
    forward_for<64>(q, k, v, out, lse, s, stream);
  } else {
    forward_for<128>(q, k, v, out, lse, s, stream);
  }
}

void flash_attention_backward(const float* q, const float* k, const float* v, const float* out,
                              const float* lse, const float* dout, float* dq, float* dk, float* dv,
                              float* scratch, int64_t batch, int64_t seq, int64_t heads,
                              int64_t kv_heads, int64_t head_dim, cudaStream_t stream) {
  const FlashDims s{batch, seq, heads, kv_heads};
  check_shape(s, head_dim);
  if (batch * seq * heads == 0) return;
  if (head_dim == 64) {
    backward_for<64>(q, k, v, out, lse, dout, dq, dk, dv, scratch, s, stream);
  } else {
    backward_for<128>(q, k, v, out, lse, dout, dq, dk, dv, scratch, s, stream);
  }
}

}  // namespace gnmr::cuda
