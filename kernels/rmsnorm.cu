// RMSNorm forward and backward (Hugging Face LlamaRMSNorm: y = w * x / sqrt(mean(x^2) + eps)).
// CPU twin: gnmr::cpu::rmsnorm_forward / rmsnorm_backward (src/backend/cpu/rmsnorm.cpp).
// Row statistics (sum of x^2, sum of dy w xhat) are summed in double by one block per row in a
// fixed tree (block_sum), the CPU in index order: they can differ in the last bits of a double,
// which after rounding to f32 is at most an ulp of the mean. Everything else is the CPU's
// per-element expression. dw is summed as on the CPU: per chunk of kRmsnormChunkRows rows in
// row order into the workspace, then the chunks in order, so given the same rstd it is
// bit-identical, and deterministic always.
// The backward runs as one kernel over each chunk's rows where a thread's share of a row fits
// its registers (rmsnorm_backward_chunk_kernel: d up to 4096 four-wide, 1024 one at a time),
// else as a row kernel for dx and a chunk kernel for dw's partials, which read x and dout a
// second time (24 bytes moved an element instead of 16). Both give the same bits.
#include <algorithm>

#include "backend/train_math.h"
#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/train_ops.cuh"
#include "precision/bf16.h"

namespace gnmr::cuda {
namespace {

constexpr int kRowThreads = 256;      // one block per row
constexpr int kElementThreads = 256;  // one thread per (chunk, column)
constexpr int kCombineThreads = 64;   // one thread per column
constexpr int64_t kMaxBlocks = 1 << 20;

int blocks_for(int64_t items, int threads) {
  return static_cast<int>(std::min<int64_t>((items + threads - 1) / threads, kMaxBlocks));
}

// Element j of a row, and four at once: the row kernels read a thread's elements a quad at a time
// (one 16-byte load, kernels/quad_access.cuh) where d is a multiple of 4 and the arrays are
// aligned (kQuads), one at a time otherwise. A thread's elements are then j = 4q..4q+3 for its
// quads q, else its j; either way a fixed set, so its partial sums have a fixed order.
template <bool kQuads>
struct RowElements {
  static constexpr int kWidth = kQuads ? 4 : 1;
  __device__ static void load(const float* row, int64_t at, float (&v)[kWidth]) {
    if constexpr (kQuads) {
      const float4 q = *reinterpret_cast<const float4*>(row + at);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      v[0] = row[at];
    }
  }
  __device__ static void store(float* row, int64_t at, const float (&v)[kWidth]) {
    if constexpr (kQuads) {
      *reinterpret_cast<float4*>(row + at) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      row[at] = v[0];
    }
  }
  // v rounded to bf16 (encode_bf16, convert_to_bf16's bits); a quad in one 8-byte store, the
  // first element in the low half of the first word.
  __device__ static void store_bf16(uint16_t* row, int64_t at, const float (&v)[kWidth]) {
    if constexpr (kQuads) {
      *reinterpret_cast<uint2*>(row + at) =
          make_uint2(uint32_t{encode_bf16(v[0])} | uint32_t{encode_bf16(v[1])} << 16,
                     uint32_t{encode_bf16(v[2])} | uint32_t{encode_bf16(v[3])} << 16);
    } else {
      row[at] = encode_bf16(v[0]);
    }
  }
};

// x, out: [n, d]; w: [d]; rstd: [n]. The row loop is uniform across the block (block_sum).
// kResidual: the normalized row is x + b (residual_forward's one IEEE add), written to sum [n, d]
// as it is made and read back by the same thread for the output: the residual add and the
// RMSNorm after it in one pass, the bits of the two kernels (sum may be x). out_bf16 (or null):
// out rounded to bf16 too, the bf16 GEMM operand of the projection reading out, which
// convert_to_bf16 would make from it: a read of out fewer.
template <bool kQuads, bool kResidual>
__global__ void rmsnorm_forward_kernel(const float* x, const float* b, float* sum, const float* w,
                                       float eps, float* out, uint16_t* out_bf16, float* rstd,
                                       int64_t n, int64_t d) {
  using E = RowElements<kQuads>;
  constexpr int kW = E::kWidth;
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const float* xr = kResidual ? sum + row * d : x + row * d;  // the row normalized
    float* yr = out + row * d;
    double sum_sq = 0.0;
    for (int64_t j = threadIdx.x * int64_t{kW}; j < d; j += blockDim.x * int64_t{kW}) {
      float v[kW];
      E::load(x + row * d, j, v);
      if constexpr (kResidual) {
        float bv[kW];
        E::load(b + row * d, j, bv);
        for (int k = 0; k < kW; ++k) v[k] = v[k] + bv[k];
        E::store(sum + row * d, j, v);
      }
      for (int k = 0; k < kW; ++k) sum_sq += static_cast<double>(v[k]) * v[k];
    }
    sum_sq = block_sum(sum_sq);
    const float mean_sq = static_cast<float>(sum_sq / static_cast<double>(d));
    const float r = 1.0f / sqrtf(mean_sq + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t j = threadIdx.x * int64_t{kW}; j < d; j += blockDim.x * int64_t{kW}) {
      float v[kW], g[kW];
      E::load(xr, j, v);
      E::load(w, j, g);
      for (int k = 0; k < kW; ++k) v[k] = g[k] * (v[k] * r);
      E::store(yr, j, v);
      if (out_bf16 != nullptr) E::store_bf16(out_bf16 + row * d, j, v);
    }
  }
}

// dx += r (g - xhat mean(g xhat)), g = dout w, xhat = x r; one block per row. dx_bf16 (or
// null): the updated dx rounded to bf16 too, the bf16 GEMM operand of the projection whose dy it
// is, which convert_to_bf16 would make from it: a read of dx fewer.
template <bool kQuads>
__global__ void rmsnorm_backward_dx_kernel(const float* x, const float* w, const float* rstd,
                                           const float* dout, float* dx, uint16_t* dx_bf16,
                                           int64_t n, int64_t d) {
  using E = RowElements<kQuads>;
  constexpr int kW = E::kWidth;
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const float* xr = x + row * d;
    const float* dyr = dout + row * d;
    float* dxr = dx + row * d;
    const float r = rstd[row];
    double dot = 0.0;
    for (int64_t j = threadIdx.x * int64_t{kW}; j < d; j += blockDim.x * int64_t{kW}) {
      float xv[kW], dyv[kW], wv[kW];
      E::load(xr, j, xv);
      E::load(dyr, j, dyv);
      E::load(w, j, wv);
      for (int k = 0; k < kW; ++k) dot += static_cast<double>(dyv[k] * wv[k]) * (xv[k] * r);
    }
    dot = block_sum(dot);
    const float mean_dot = static_cast<float>(dot / static_cast<double>(d));
    for (int64_t j = threadIdx.x * int64_t{kW}; j < d; j += blockDim.x * int64_t{kW}) {
      float xv[kW], dyv[kW], wv[kW], dxv[kW];
      E::load(xr, j, xv);
      E::load(dyr, j, dyv);
      E::load(w, j, wv);
      E::load(dxr, j, dxv);
      for (int k = 0; k < kW; ++k) {
        const float xhat = xv[k] * r;
        dxv[k] += r * (dyv[k] * wv[k] - xhat * mean_dot);
      }
      E::store(dxr, j, dxv);
      if (dx_bf16 != nullptr) E::store_bf16(dx_bf16 + row * d, j, dxv);
    }
  }
}

// A thread's elements of a row for rmsnorm_backward_chunk_kernel: kItems groups of kWidth,
// group t at column (threadIdx.x + t blockDim.x) kWidth, the columns the row kernels' loops
// give the thread, in the same order. Groups past d stay zero and are not stored.
template <bool kQuads, int kItems>
struct RowShare {
  using E = RowElements<kQuads>;
  static constexpr int kW = E::kWidth;
  float v[kItems][kW];

  __device__ static int64_t column(int t) { return (threadIdx.x + int64_t{t} * blockDim.x) * kW; }
  __device__ void load(const float* row, int64_t d) {
#pragma unroll
    for (int t = 0; t < kItems; ++t) {
      if (column(t) < d) {
        E::load(row, column(t), v[t]);
      } else {
        for (int k = 0; k < kW; ++k) v[t][k] = 0.0f;
      }
    }
  }
  __device__ void store(float* row, int64_t d) const {
#pragma unroll
    for (int t = 0; t < kItems; ++t) {
      if (column(t) < d) E::store(row, column(t), v[t]);
    }
  }
  __device__ void store_bf16(uint16_t* row, int64_t d) const {
#pragma unroll
    for (int t = 0; t < kItems; ++t) {
      if (column(t) < d) E::store_bf16(row, column(t), v[t]);
    }
  }
};

// dx and dw's partials in one pass: a block takes a chunk of kRmsnormChunkRows rows in row
// order, a thread keeping its columns' x, dout and dx of a row in registers from the dot to the
// update, and dw's partial sums of its columns over the chunk, then writes them to
// workspace[chunk, j]. The next row's loads are issued before this row's block_sum, so they are
// in flight through its barriers. Per element the expressions of rmsnorm_backward_dx_kernel and
// rmsnorm_backward_dw_partial_kernel, in their orders: the same bits. dx_bf16 as in
// rmsnorm_backward_dx_kernel.
template <bool kQuads, int kItems>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_backward_chunk_kernel(const float* x, const float* w, const float* rstd,
                                  const float* dout, float* dx, uint16_t* dx_bf16, int64_t n,
                                  int64_t d, float* workspace) {
  using Share = RowShare<kQuads, kItems>;
  constexpr int kW = Share::kW;
  Share wv;
  wv.load(w, d);
  const int64_t chunks = (n + kRmsnormChunkRows - 1) / kRmsnormChunkRows;
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const int64_t row_begin = chunk * kRmsnormChunkRows;
    const int64_t row_end = row_begin + kRmsnormChunkRows < n ? row_begin + kRmsnormChunkRows : n;
    Share partial;  // dw's partial sums of the chunk's rows so far
#pragma unroll
    for (int t = 0; t < kItems; ++t) {
      for (int k = 0; k < kW; ++k) partial.v[t][k] = 0.0f;
    }
    Share xv, dyv, dxv;
    xv.load(x + row_begin * d, d);
    dyv.load(dout + row_begin * d, d);
    dxv.load(dx + row_begin * d, d);
    float r = rstd[row_begin];
    for (int64_t row = row_begin; row < row_end; ++row) {
      Share x_next = xv, dy_next = dyv, dx_next = dxv;  // kept where this is the last row
      float r_next = r;
      if (row + 1 < row_end) {
        x_next.load(x + (row + 1) * d, d);
        dy_next.load(dout + (row + 1) * d, d);
        dx_next.load(dx + (row + 1) * d, d);
        r_next = rstd[row + 1];
      }
      double dot = 0.0;
#pragma unroll
      for (int t = 0; t < kItems; ++t) {
        if (Share::column(t) >= d) continue;
        for (int k = 0; k < kW; ++k) {
          dot += static_cast<double>(dyv.v[t][k] * wv.v[t][k]) * (xv.v[t][k] * r);
        }
      }
      dot = block_sum(dot);
      const float mean_dot = static_cast<float>(dot / static_cast<double>(d));
#pragma unroll
      for (int t = 0; t < kItems; ++t) {
        for (int k = 0; k < kW; ++k) {
          const float xhat = xv.v[t][k] * r;
          dxv.v[t][k] += r * (dyv.v[t][k] * wv.v[t][k] - xhat * mean_dot);
          partial.v[t][k] += dyv.v[t][k] * xhat;
        }
      }
      dxv.store(dx + row * d, d);
      if (dx_bf16 != nullptr) dxv.store_bf16(dx_bf16 + row * d, d);
      xv = x_next;
      dyv = dy_next;
      dxv = dx_next;
      r = r_next;
    }
    partial.store(workspace + chunk * d, d);
  }
}

// workspace[chunk, j] = sum over the chunk's rows, in row order, of dout xhat; one thread per
// (chunk, j), j fastest so a warp reads a row segment.
__global__ void rmsnorm_backward_dw_partial_kernel(const float* x, const float* rstd,
                                                   const float* dout, int64_t n, int64_t d,
                                                   float* workspace) {
  const int64_t chunks = (n + kRmsnormChunkRows - 1) / kRmsnormChunkRows;
  const int64_t items = chunks * d;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < items; e += stride) {
    const int64_t chunk = e / d, j = e % d;
    const int64_t row_end =
        (chunk + 1) * kRmsnormChunkRows < n ? (chunk + 1) * kRmsnormChunkRows : n;
    float partial = 0.0f;
    for (int64_t row = chunk * kRmsnormChunkRows; row < row_end; ++row) {
      const float xhat = x[row * d + j] * rstd[row];
      partial += dout[row * d + j] * xhat;
    }
    workspace[e] = partial;
  }
}

// dw[j] += the chunks' partials, added in chunk order from 0. A thread's loads do not depend
// on its sum: unrolled, 16 are in flight at once, where one at a time made a 2048-column combine
// of 256 chunks take ~30 us on an H200 (ncu); small blocks spread the few columns over more
// multiprocessors.
__global__ void rmsnorm_backward_dw_combine_kernel(const float* workspace, int64_t chunks,
                                                   int64_t d, float* dw) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < d; j += stride) {
    float sum = 0.0f;
#pragma unroll 16
    for (int64_t chunk = 0; chunk < chunks; ++chunk) sum += workspace[chunk * d + j];
    dw[j] += sum;
  }
}

}  // namespace

namespace {

template <bool kResidual>
void launch_rmsnorm_forward(const float* x, const float* b, float* sum, const float* w, float eps,
                            float* out, uint16_t* out_bf16, float* rstd, int64_t n, int64_t d,
                            cudaStream_t stream) {
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>(n, kMaxBlocks));
  if (d % 4 == 0 && all_16_byte_aligned({x, b, sum, w, out}) &&
      reinterpret_cast<uintptr_t>(out_bf16) % 8 == 0) {
    rmsnorm_forward_kernel<true, kResidual>
        <<<blocks, kRowThreads, 0, stream>>>(x, b, sum, w, eps, out, out_bf16, rstd, n, d);
  } else {
    rmsnorm_forward_kernel<false, kResidual>
        <<<blocks, kRowThreads, 0, stream>>>(x, b, sum, w, eps, out, out_bf16, rstd, n, d);
  }
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rmsnorm_forward(const float* x, const float* w, float eps, float* out, float* rstd, int64_t n,
                     int64_t d, cudaStream_t stream) {
  launch_rmsnorm_forward<false>(x, nullptr, nullptr, w, eps, out, nullptr, rstd, n, d, stream);
}

void residual_rmsnorm_forward(const float* a, const float* b, float* sum, const float* w, float eps,
                              float* out, float* rstd, int64_t n, int64_t d, cudaStream_t stream,
                              uint16_t* out_bf16) {
  launch_rmsnorm_forward<true>(a, b, sum, w, eps, out, out_bf16, rstd, n, d, stream);
}

int64_t rmsnorm_backward_workspace_floats(int64_t n, int64_t d) {
  return (n + kRmsnormChunkRows - 1) / kRmsnormChunkRows * d;
}

void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dout,
                      float* dx, float* dw, int64_t n, int64_t d, float* workspace,
                      cudaStream_t stream, uint16_t* dx_bf16) {
  if (n == 0 || d == 0) return;
  GNMR_CHECK(dx != x && dx != dout, "rmsnorm_backward: dx must not be x or dout");
  const int64_t chunks = (n + kRmsnormChunkRows - 1) / kRmsnormChunkRows;
  const bool quads = d % 4 == 0 && all_16_byte_aligned({x, w, dout, dx, workspace}) &&
                     reinterpret_cast<uintptr_t>(dx_bf16) % 8 == 0;
  // Groups of columns a thread of the one-pass kernel takes.
  const int64_t items = (d + kRowThreads * (quads ? 4 : 1) - 1) / (kRowThreads * (quads ? 4 : 1));
  if (items <= 4) {
    const int blocks = static_cast<int>(std::min<int64_t>(chunks, kMaxBlocks));
    dispatch_quads(quads, [&](auto q) {
      constexpr bool kQuads = decltype(q)::value;
      if (items == 1) {
        rmsnorm_backward_chunk_kernel<kQuads, 1>
            <<<blocks, kRowThreads, 0, stream>>>(x, w, rstd, dout, dx, dx_bf16, n, d, workspace);
      } else if (items == 2) {
        rmsnorm_backward_chunk_kernel<kQuads, 2>
            <<<blocks, kRowThreads, 0, stream>>>(x, w, rstd, dout, dx, dx_bf16, n, d, workspace);
      } else {
        rmsnorm_backward_chunk_kernel<kQuads, 4>
            <<<blocks, kRowThreads, 0, stream>>>(x, w, rstd, dout, dx, dx_bf16, n, d, workspace);
      }
    });
    GNMR_CUDA_CHECK(cudaGetLastError());
    rmsnorm_backward_dw_combine_kernel<<<blocks_for(d, kCombineThreads), kCombineThreads, 0,
                                         stream>>>(workspace, chunks, d, dw);
    GNMR_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int row_blocks = static_cast<int>(std::min<int64_t>(n, kMaxBlocks));
  if (quads) {
    rmsnorm_backward_dx_kernel<true>
        <<<row_blocks, kRowThreads, 0, stream>>>(x, w, rstd, dout, dx, dx_bf16, n, d);
  } else {
    rmsnorm_backward_dx_kernel<false>
        <<<row_blocks, kRowThreads, 0, stream>>>(x, w, rstd, dout, dx, dx_bf16, n, d);
  }
  GNMR_CUDA_CHECK(cudaGetLastError());
  rmsnorm_backward_dw_partial_kernel<<<blocks_for(chunks * d, kElementThreads), kElementThreads, 0,
                                       stream>>>(x, rstd, dout, n, d, workspace);
  GNMR_CUDA_CHECK(cudaGetLastError());
  rmsnorm_backward_dw_combine_kernel<<<blocks_for(d, kCombineThreads), kCombineThreads, 0,
                                       stream>>>(workspace, chunks, d, dw);
  GNMR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnmr::cuda
