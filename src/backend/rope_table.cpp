#include "backend/rope_table.h"

#include <cmath>

#include "util/error.h"

namespace gnmr {

void compute_rope_table(float theta, int head_dim, int max_seq, std::vector<float>& cos,
                        std::vector<float>& sin) {
  GNMR_CHECK(head_dim % 2 == 0, "rotary embeddings need an even head dim");
  const int half = head_dim / 2;
  cos.assign(static_cast<size_t>(max_seq) * half, 0.0f);
  sin.assign(static_cast<size_t>(max_seq) * half, 0.0f);
  for (int i = 0; i < half; ++i) {
    // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all fp32
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float inv_freq = 1.0f / std::pow(theta, exponent);
    for (int t = 0; t < max_seq; ++t) {
      const float angle = static_cast<float>(t) * inv_freq;
      cos[static_cast<size_t>(t) * half + i] = std::cos(angle);
      sin[static_cast<size_t>(t) * half + i] = std::sin(angle);
    }
  }
}

}  // namespace gnmr
