// Causal GQA attention the flash way, on the CPU: the CPU twin of a flash-attention GPU kernel
// (the same tiles, src/backend/flash_tiling.h; the same online softmax; fp32 statistics). The
// forward keeps only the output and the log-sum-exp of each query row; no T x T tensor exists.
// The backward recomputes the probabilities from the log-sum-exp and is deterministic without
// atomics: pass 1 owns dK and dV of one key tile (looping over the query tiles of every head in
// its GQA group), pass 2 owns dQ of one query tile. Checked against the materialised attention
// (cpu/attention.cpp); not the CPU backend's own attention, which stays the faster materialised
// one.
//
// q, out, dout, dq: [b, t, h, hd]; k, v, dk, dv: [b, t, hkv, hd]; lse: [b, h, t]. Scale 1/sqrt(hd).
#pragma once

#include <cstdint>

#include "backend/cpu/ops.h"
#include "backend/flash_tiling.h"

namespace gnmr {
namespace cpu {

void flash_attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                             const AttentionShape& s, const FlashTiling& tiles, int threads);

// dq, dk, dv overwritten.
void flash_attention_backward(const float* q, const float* k, const float* v, const float* out,
                              const float* lse, const float* dout, float* dq, float* dk, float* dv,
                              const AttentionShape& s, const FlashTiling& tiles, int threads);

}  // namespace cpu
}  // namespace gnmr
