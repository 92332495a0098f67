// CPU reference ops: plain loops over raw row-major arrays, OpenMP across `threads`.
// Each is instantiated for float (what the backend runs) and double (what the gradient-check
// tests run); a CUDA kernel of the same op is checked against it (docs/DESIGN.md §6).
// Shapes as in backend/backend.h.
// Determinism: every output element and every reduction is computed by one thread in a fixed
// order; partial sums are taken over fixed-size chunks and combined in chunk order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "backend/train_math.h"

namespace gnmr {
namespace cpu {

// ---- gemm.cpp: row-major C = alpha op(A) op(B) + beta C through the BLAS ----
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);
// The same, rows of C split into one contiguous block per thread (single-threaded BLAS
// calls inside). Each element's k-order is the BLAS's, so the split changes no bits.
template <typename T>
void gemm_parallel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, int threads);

// ---- matmul.cpp ----
// x: [n, in]; w: [out, in]; y: [n, out] = x w^T
template <typename T>
void matmul_forward(const T* x, const T* w, T* y, int64_t n, int64_t in, int64_t out, int threads);
// dx: [n, in] = dy w (+= when accumulate)
template <typename T>
void matmul_backward_input(const T* dy, const T* w, T* dx, int64_t n, int64_t in, int64_t out,
                           bool accumulate, int threads);
// dw: [out, in] += dy^T x
template <typename T>
void matmul_backward_weight(const T* x, const T* dy, T* dw, int64_t n, int64_t in, int64_t out,
                            int threads);
// dst[i] = nearest bf16 of src[i], as a float (emulated bf16 GEMM inputs).
void round_to_bf16_copy(const float* src, float* dst, int64_t count, int threads);

// ---- quantize.cpp: the recipes' quantizers (src/precision; shapes as in backend.h) ----
// x: [rows, cols] -> packed: [rows, packed_row_bytes(cols, bits)], scales: [scale_count]
void quantize_int_groupwise(const float* x, int64_t rows, int64_t cols, const GroupwiseSpec& spec,
                            uint8_t* packed, float* scales, const RngKey& key);
void dequantize_int_groupwise(const uint8_t* packed, const float* scales, int64_t rows,
                              int64_t cols, const GroupwiseSpec& spec, float* out);
// out = dequantize(quantize(x)), one scale per block_rows x block_cols block; out may be x
void fake_quantize_fp_blockwise(const float* x, int64_t rows, int64_t cols, FpFormat format,
                                int64_t block_rows, int64_t block_cols, float* out);
// out = symmetric int8 fake quantization, one scale per row; out may be x
void fake_quantize_int8_per_row(const float* x, int64_t rows, int64_t cols, float* out);

// ---- rmsnorm.cpp ----
// x, out: [n, d]; w: [d]; rstd: [n]
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T eps, T* out, T* rstd, int64_t n, int64_t d,
                     int threads);
// Rows per partial-sum chunk of dw (backend/train_math.h); workspace holds
// ceil(n / kRmsnormChunkRows) * d values.
using gnmr::kRmsnormChunkRows;
int64_t rmsnorm_backward_workspace(int64_t n, int64_t d);
// dx += ..., dw += ...
template <typename T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dout, T* dx, T* dw, int64_t n,
                      int64_t d, T* workspace, int threads);

// ---- rope.cpp (kernels/rope.cu) ----
// x: [b, t, heads, hd] in place; cos, sin: [>= t, hd / 2]
template <typename T>
void rope_forward(T* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
                  int64_t hd, int threads);
template <typename T>
void rope_backward(T* dx, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
                   int64_t hd, int threads);

// ---- attention.cpp ----
using AttentionShape = gnmr::AttentionShape;  // backend.h
// q, out: [b, t, h, hd]; k, v: [b, t, hkv, hd]; probs: [b, h, t, t]
template <typename T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs,
                       const AttentionShape& s, int threads);
// workspace: attention_backward_workspace(s, threads) values
int64_t attention_backward_workspace(const AttentionShape& s, int threads);
template <typename T>
void attention_backward(const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq,
                        T* dk, T* dv, const AttentionShape& s, T* workspace, int threads);

// ---- swiglu.cpp ----
template <typename T>
void swiglu_forward(const T* gate, const T* up, T* out, int64_t count, int threads);
template <typename T>
void swiglu_backward(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t count,
                     int threads);

// ---- embedding.cpp (kernels/embedding.cu) ----
// tokens: [n]; table: [vocab, d]; out: [n, d]
template <typename T>
void embedding_forward(const int32_t* tokens, const T* table, T* out, int64_t n, int64_t d,
                       int threads);
template <typename T>
void embedding_backward(const int32_t* tokens, const T* dout, T* dtable, int64_t n, int64_t d,
                        int threads);

// ---- cross_entropy.cpp ----
// logits: [n, vocab]; targets: [n]; losses: [n]
template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, int64_t n,
                           int64_t vocab, int threads);
// logits overwritten with dloss * (softmax - onehot)
template <typename T>
void cross_entropy_forward_backward(T* logits, const int32_t* targets, T* losses, T dloss,
                                    int64_t n, int64_t vocab, int threads);
// *loss_sum += double(float(sum(losses[0..n)) / valid)), summed in double in index order.
void accumulate_mean_loss(const float* losses, int64_t n, int64_t valid, double* loss_sum);

// ---- elementwise.cpp (kernels/elementwise.cu) ----
template <typename T>
void residual_forward(const T* a, const T* b, T* out, int64_t count, int threads);
template <typename T>
void scale(T* x, T factor, int64_t count, int threads);

// ---- norms.cpp ----
// Elements per partial sum (backend/train_math.h); the result does not depend on the thread
// count.
using gnmr::kSumSquaresChunk;
void sum_squares(const float* const* tensors, const int64_t* counts, int64_t num_tensors,
                 double* out_per_tensor, int threads);
// clip[0] = the clip factor, clip[1] = the finite flag, as Backend::global_norm_clip.
void global_norm_clip(const double* sum_squares, int64_t count, double loss_sum, double max_norm,
                      float* clip);

// ---- adamw.cpp ----
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t count,
                  const AdamWStep& s, float grad_scale, int threads);

}  // namespace cpu
}  // namespace gnmr
