// AdamW with decoupled weight decay as torch.optim.AdamW (foreach=False): the per-element
// update and its coefficients are in backend/train_math.h, shared with the CUDA twin
// kernels/adamw.cu.
#include "backend/cpu/ops.h"
#include "backend/train_math.h"

namespace gnmr {
namespace cpu {

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t count,
                  const AdamWStep& s, float grad_scale, int threads) {
  const AdamWCoefficients c = adamw_coefficients(s);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    adamw_update_element(param[i], grad[i], m[i], v[i], grad_scale, c);
  }
}

}  // namespace cpu
}  // namespace gnmr
