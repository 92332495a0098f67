// AdamW with decoupled weight decay, exactly as torch.optim.AdamW (foreach=False) orders it:
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", Algorithm 2.)
#include <cmath>

#include "backend/cpu/ops.h"

namespace gnmr {
namespace cpu {

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t count,
                  const AdamWStep& s, float grad_scale, int threads) {
  // Bias corrections in double, then fp32 per element as torch does.
  const double t = static_cast<double>(s.step);
  const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(s.beta1), t));
  const float bias2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(s.beta2), t)));
  const float step_size = s.lr / bias1;
  const float decay = 1.0f - s.lr * s.weight_decay;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bias2_sqrt + s.eps;
    param[i] = param[i] * decay - step_size * mi / denom;
  }
}

}  // namespace cpu
}  // namespace gnmr
