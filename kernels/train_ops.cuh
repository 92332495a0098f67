// Host API of the training-op kernels (RMSNorm, SwiGLU, cross-entropy, the trainer's loss and
// norm reductions, AdamW, the recipes' fp fake quantizer, bf16 rounding, the bits digest). All
// pointers are device pointers, fp32 unless said; work is queued on `stream`; errors surface
// through GNMR_CUDA_CHECK. Plain C++, so a .cpp file can include it and link gnmr_kernels. Each
// names its CPU twin in src/backend/cpu; the elementwise ops give the same bits (shared math in
// backend/train_math.h and src/precision), the reductions are deterministic and their order is
// said at each (tests/gpu/test_gpu_train_ops.cpp compares them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "precision/fp_format.h"

namespace gnmr::cuda {

// x, out: [n, d]; w: [d]; rstd: [n]. One block per row, the row's sum of squares in double
// (a fixed tree, not the CPU's index order). Twin: cpu::rmsnorm_forward<float>.
void rmsnorm_forward(const float* x, const float* w, float eps, float* out, float* rstd, int64_t n,
                     int64_t d, cudaStream_t stream);
// sum = a + b (residual_forward's bits), then rmsnorm_forward of sum, in one pass over each row
// (sum may be a). out_bf16 (or null): out rounded to bf16 [n, d] as well, convert_to_bf16's bits.
// Twins: cpu::residual_forward, then cpu::rmsnorm_forward<float> (and encode_bf16).
void residual_rmsnorm_forward(const float* a, const float* b, float* sum, const float* w, float eps,
                              float* out, float* rstd, int64_t n, int64_t d, cudaStream_t stream,
                              uint16_t* out_bf16 = nullptr);
// dx += ..., dw += ... (as backend.h). workspace: rmsnorm_backward_workspace_floats(n, d) floats
// (device): dw's partial sums per kRmsnormChunkRows rows, combined in chunk order as on the CPU.
// dx_bf16 (or null): the updated dx rounded to bf16 [n, d] as well, convert_to_bf16's bits.
// Twin: cpu::rmsnorm_backward<float> (and encode_bf16).
int64_t rmsnorm_backward_workspace_floats(int64_t n, int64_t d);
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dout,
                      float* dx, float* dw, int64_t n, int64_t d, float* workspace,
                      cudaStream_t stream, uint16_t* dx_bf16 = nullptr);

// gate, up, out: [count]. Twins: cpu::swiglu_forward / swiglu_backward (bit-identical).
void swiglu_forward(const float* gate, const float* up, float* out, int64_t count,
                    cudaStream_t stream);
void swiglu_backward(const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup, int64_t count, cudaStream_t stream);
// swiglu_forward's out, and out rounded to bf16 (encode_bf16) into out_bf16 [count]: a bf16
// projection's x (Backend::swiglu_projection_forward). Twins: cpu::swiglu_forward, then
// encode_bf16.
void swiglu_forward_with_bf16(const float* gate, const float* up, float* out, uint16_t* out_bf16,
                              int64_t count, cudaStream_t stream);
// swiglu_backward's dgate, or dup where up_gradient (then up is not read and may be null),
// rounded to bf16 (encode_bf16) into out [count], the fp32 gradient never written: a bf16
// projection's dy (Backend::swiglu_projections_backward). Twins: cpu::swiglu_backward, then
// encode_bf16.
void swiglu_gradient_to_bf16(const float* gate, const float* up, const float* dout,
                             bool up_gradient, uint16_t* out, int64_t count, cudaStream_t stream);

// logits: [n, vocab]; targets: [n] i32 (< 0: ignored, loss 0, zero gradient row; otherwise
// < vocab); losses: [n]. One block per row, one pass over the vocabulary for the online max and
// sum (Milakov & Gimelshein, "Online normalizer calculation for softmax", 2018), never a second
// [n, vocab] buffer. forward_backward overwrites logits with dloss * (softmax - onehot) in a
// second pass over the row, or with grad_bf16 writes that gradient rounded to bf16 [n, vocab]
// there (encode_bf16 of the same floats) and leaves logits as it was.
// Twins: cpu::cross_entropy_forward / cross_entropy_forward_backward.
void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses, int64_t n,
                           int64_t vocab, cudaStream_t stream);
void cross_entropy_forward_backward(float* logits, const int32_t* targets, float* losses,
                                    float dloss, int64_t n, int64_t vocab, cudaStream_t stream,
                                    uint16_t* grad_bf16 = nullptr);

// *loss_sum += double(float(sum(losses[0..n)) / valid)), the sum in double in index order (one
// thread adds, as on the CPU: bit-identical). loss_sum: device [1] f64.
// Twin: cpu::accumulate_mean_loss.
void accumulate_mean_loss(const float* losses, int64_t n, int64_t valid, double* loss_sum,
                          cudaStream_t stream);

// Multi-tensor sum of squares: out_per_tensor[i] = sum of squares of tensor i in double
// (overwritten). tensors / counts are HOST arrays of device pointers and element counts;
// workspace: sum_squares_workspace_doubles(counts, num_tensors) device doubles (one partial
// per chunk). The CPU's chunks of kSumSquaresChunk elements, its 4-lane order inside a chunk
// and chunks added in order, no atomics: bit-identical to cpu::sum_squares.
int64_t sum_squares_workspace_doubles(const int64_t* counts, int64_t num_tensors);
void sum_squares(const float* const* tensors, const int64_t* counts, int64_t num_tensors,
                 double* out_per_tensor, double* workspace, cudaStream_t stream);

// clip[0] (clip factor), clip[1] (finite flag) as cpu::global_norm_clip (the same function),
// reading sum_squares [count] f64 and loss_sum [1] f64 from device memory; clip: [2] f32.
void global_norm_clip(const double* sum_squares, int64_t count, const double* loss_sum,
                      double max_norm, float* clip, cudaStream_t stream);

// param, grad, m, v: [count]. AdamW as cpu::adamw_update with grad_scale = clip[0] read on the
// device, and nothing written when clip[1] == 0. clip: device [2] f32. Bit-identical.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t count,
                  const AdamWStep& s, const float* clip, cudaStream_t stream);
// The same on each of `tensors` (each its own step: weight decay differs), in a few launches
// of up to 32 tensors each: every tensor's bits as adamw_update's alone.
struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t count;
  AdamWStep step;
};
void adamw_update_batch(const std::vector<AdamWTensor>& tensors, const float* clip,
                        cudaStream_t stream);

// x, out: [rows, cols]; out = dequantize(quantize(x)) with one fp32 scale per
// block_rows x block_cols block; any block shape (1 x t, t x 1, t x t, partial edge blocks);
// out may be x. Throws a Config error for a block side < 1. Bit-identical to the twin
// cpu::fake_quantize_fp_blockwise.
void fake_quantize_fp_blockwise(const float* x, float* out, int64_t rows, int64_t cols,
                                FpFormat format, int64_t block_rows, int64_t block_cols,
                                cudaStream_t stream);

// The digest of words[0, count) (32-bit words, device memory): gnmr::bits_digest's value, its
// CPU twin (src/backend/bits_digest.h). partials: kBitsDigestPartials device words, overwritten.
// Waits for `stream` (it reads the partial sums back): for one-off checks, not for a step.
constexpr int kBitsDigestPartials = 256;
uint64_t bits_digest(const void* words, int64_t count, uint64_t* partials, cudaStream_t stream);

// out[i] = nearest bf16 of x[i] as f32 (out may be x). Twin: cpu::round_to_bf16_copy.
void round_to_bf16(const float* x, float* out, int64_t count, cudaStream_t stream);

}  // namespace gnmr::cuda
