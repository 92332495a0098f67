// Host API of the model-op kernels (embedding, RoPE, residual, scale). All pointers are device
// pointers, fp32 unless said; work is queued on `stream`; errors surface through
// GNMR_CUDA_CHECK. Plain C++, so a .cpp file can include it and link gnmr_kernels. Each names
// its CPU twin in src/backend/cpu and gives the same bits (tests/gpu compare them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gnmr::cuda {

// tokens: [n] i32 (0 <= id < vocab); table: [vocab, d]; out: [n, d].
// Twin: gnmr::cpu::embedding_forward.
void embedding_forward(const int32_t* tokens, const float* table, float* out, int64_t n, int64_t d,
                       cudaStream_t stream);
// dtable[tokens[i]] += dout[i], from the batch's EmbeddingIndex (unique_tokens, offsets,
// positions; src/backend/embedding_index.h) uploaded to the device. Twin:
// gnmr::cpu::embedding_backward.
void embedding_backward(const int32_t* unique_tokens, const int32_t* offsets,
                        const int32_t* positions, int64_t n_unique, const float* dout,
                        float* dtable, int64_t d, cudaStream_t stream);

// x: [b, t, heads, hd] in place; cos, sin: [>= t, hd / 2] (backend/rope_table.h).
// Twins: gnmr::cpu::rope_forward / rope_backward.
void rope_forward(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
                  int64_t hd, cudaStream_t stream);
void rope_backward(float* dx, const float* cos, const float* sin, int64_t b, int64_t t,
                   int64_t heads, int64_t hd, cudaStream_t stream);
// rope_forward's (rope_backward's) result rounded to bf16 (encode_bf16) into out [b, t, heads,
// hd], x (dx) not written: the tensor-core flash attention's bf16 q and k
// (Backend::rope_attention_forward); q's or k's bf16 dy (Backend::rope_projection_backward).
// Twins: cpu::rope_forward (rope_backward), then encode_bf16.
void rope_forward_to_bf16(const float* x, const float* cos, const float* sin, int64_t b, int64_t t,
                          int64_t heads, int64_t hd, uint16_t* out, cudaStream_t stream);
void rope_backward_to_bf16(const float* dx, const float* cos, const float* sin, int64_t b,
                           int64_t t, int64_t heads, int64_t hd, uint16_t* out,
                           cudaStream_t stream);

// out = a + b; x *= factor. Twins: gnmr::cpu::residual_forward / scale.
void residual_forward(const float* a, const float* b, float* out, int64_t count,
                      cudaStream_t stream);
void scale(float* x, float factor, int64_t count, cudaStream_t stream);

}  // namespace gnmr::cuda
