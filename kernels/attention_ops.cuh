// Host API of the v1 attention's kernels (kernels/causal_softmax.cu): the causal softmax over
// score rows and its backward, between the cuBLASLt GEMMs that MaterializedAttention
// (src/backend/cuda/attention_v1.h) runs. Device pointers, fp32, queued on `stream`, launches
// checked with GNMR_CUDA_CHECK. Plain C++, so a .cpp file can include it and link gnmr_kernels.
// CPU twin: the softmax steps inside gnmr::cpu::attention_forward / attention_backward
// (src/backend/cpu/attention.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gnmr::cuda {

// scores: [matrices, t, t] in place -> causal softmax probabilities: row i of each matrix keeps
// keys 0..i and is exactly zero after i (overwriting whatever was there).
void causal_softmax_forward(float* scores, int64_t matrices, int64_t t, cudaStream_t stream);

// probs: [matrices, t, t] from causal_softmax_forward; dscores: the same shape, dP on entry,
// dS = scale * P * (dP - sum_j P dP) per row on exit (exactly zero after the diagonal).
void causal_softmax_backward(const float* probs, float* dscores, int64_t matrices, int64_t t,
                             float scale, cudaStream_t stream);

}  // namespace gnmr::cuda
