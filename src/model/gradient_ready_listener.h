// What LlamaModel's backward tells whoever reduces gradients across ranks: "parameters
// [first_param, last_param] (indices into LlamaModel::params()) hold their final gradient for
// this step", so their all-reduce can start while backward goes on (docs/DESIGN.md §7).
// No communication here: the model only reports, the listener (train/overlapped_gradient_sum.h)
// decides what to launch.
#pragma once

namespace gnmr {

class GradientReadyListener {
 public:
  virtual ~GradientReadyListener() = default;
  // Called from inside backward, once per group in the order backward finishes them: lm_head
  // with the final norm, then each layer from the last to the first, then the embedding.
  // The ranges are disjoint and together cover every parameter once per backward. The backend
  // has issued, not necessarily finished, the ops that wrote them: on the cpu backend that is
  // the same thing; an asynchronous backend's communicator must order itself after them.
  virtual void on_params_ready(int first_param, int last_param) = 0;
};

}  // namespace gnmr
