// Rotary embedding tables, computed on the host once and uploaded by the model.
// Hugging Face LlamaRotaryEmbedding (default rope type), in fp32 as it computes them:
//   inv_freq[i] = 1 / theta^(2i / hd),  angle[t, i] = t * inv_freq[i],  i < hd / 2
// (HF repeats the half table, emb = cat(freqs, freqs); the kernels index the half table.)
#pragma once

#include <vector>

namespace gnmr {

// cos, sin: [max_seq, head_dim / 2] fp32, row-major.
void compute_rope_table(float theta, int head_dim, int max_seq, std::vector<float>& cos,
                        std::vector<float>& sin);

}  // namespace gnmr
