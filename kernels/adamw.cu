// AdamW update over a batch of tensors (a step's parameters, or the shard's pieces under
// ZeRO-1): the tensors' 4096-element blocks laid end to end in one grid (launch_batch.h), so a
// step's ~220 tensors take a few launches instead of one each, and a tensor's last blocks
// overlap the next tensor's first. A thread takes four quads, each one 16-byte access per array
// where all four arrays are aligned (kernels/quad_access.cuh), else four scalar ones; the clip
// factor and the step's finite flag are read from device memory so a skipped step costs no
// readback. CPU twin: gnmr::cpu::adamw_update (src/backend/cpu/adamw.cpp); both take their
// coefficients from adamw_coefficients and call adamw_update_element (src/backend/train_math.h),
// so the results are bit-identical, whatever the batch.
#include <algorithm>
#include <string>
#include <vector>

#include "backend/launch_batch.h"
#include "backend/train_math.h"
#include "kernels/cuda_check.cuh"
#include "kernels/quad_access.cuh"
#include "kernels/train_ops.cuh"
#include "util/error.h"

namespace gnmr::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kQuadsPerThread = 4;
constexpr int64_t kBlockElements = 4 * kQuadsPerThread * kThreads;  // 4096
constexpr int kBatchTensors = 32;

// Up to kBatchTensors tensors, passed by value as a kernel parameter (~2.4 KB, under the 4 KB
// limit). wide[t]: tensor t's leading elements in whole aligned quads (aligned_quad_elements),
// first_block[t]: its first block, [num] one past the last.
struct AdamWBatch {
  float* param[kBatchTensors];
  const float* grad[kBatchTensors];
  float* m[kBatchTensors];
  float* v[kBatchTensors];
  int64_t count[kBatchTensors];
  int64_t wide[kBatchTensors];
  AdamWCoefficients c[kBatchTensors];
  int64_t first_block[kBatchTensors + 1];
  int num;
};

// clip: [2] f32, clip[0] the gradient scale, clip[1] == 0 for a skipped (non-finite) step.
__global__ void __launch_bounds__(kThreads)
    adamw_batch_kernel(AdamWBatch batch, const float* clip) {
  if (clip[1] == 0.0f) return;
  const float grad_scale = clip[0];
  const int t = batch_member(batch.first_block, batch.num, int64_t{blockIdx.x});
  const int64_t count = batch.count[t], wide = batch.wide[t];
  const AdamWCoefficients c = batch.c[t];
  float *param = batch.param[t], *m = batch.m[t], *v = batch.v[t];
  const float* grad = batch.grad[t];
  const int64_t first = (int64_t{blockIdx.x} - batch.first_block[t]) * kBlockElements;
  for (int k = 0; k < kQuadsPerThread; ++k) {
    const int64_t e = first + 4 * (int64_t{k} * kThreads + threadIdx.x);
    if (e >= count) break;
    if (e + 4 <= wide) {
      float p[4], g[4], mi[4], vi[4];
      load_quad<true>(param + e, 4, p);
      load_quad<true>(grad + e, 4, g);
      load_quad<true>(m + e, 4, mi);
      load_quad<true>(v + e, 4, vi);
      for (int i = 0; i < 4; ++i) adamw_update_element(p[i], g[i], mi[i], vi[i], grad_scale, c);
      store_quad<true>(param + e, 4, p);
      store_quad<true>(m + e, 4, mi);
      store_quad<true>(v + e, 4, vi);
    } else {
      for (int64_t i = e; i < e + 4 && i < count; ++i) {
        float p = param[i], mi = m[i], vi = v[i];
        adamw_update_element(p, grad[i], mi, vi, grad_scale, c);
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
      }
    }
  }
}

}  // namespace

void adamw_update_batch(const std::vector<AdamWTensor>& tensors, const float* clip,
                        cudaStream_t stream) {
  for (size_t from = 0; from < tensors.size(); from += kBatchTensors) {
    const size_t to = std::min(tensors.size(), from + kBatchTensors);
    AdamWBatch batch{};
    batch.num = int(to - from);
    batch.first_block[0] = 0;
    for (size_t i = from; i < to; ++i) {
      const AdamWTensor& a = tensors[i];
      GNMR_CHECK(a.step.step >= 1, "adamw_update: step is 1-based");
      GNMR_CHECK(a.count >= 0, "adamw_update: a negative element count");
      const int j = int(i - from);
      batch.param[j] = a.param, batch.grad[j] = a.grad, batch.m[j] = a.m, batch.v[j] = a.v;
      batch.count[j] = a.count;
      batch.wide[j] = aligned_quad_elements(a.count, {a.param, a.grad, a.m, a.v});
      batch.c[j] = adamw_coefficients(a.step);
      batch.first_block[j + 1] =
          batch.first_block[j] + (a.count + kBlockElements - 1) / kBlockElements;
    }
    const int64_t blocks = batch.first_block[batch.num];
    if (blocks == 0) continue;
    GNMR_CHECK(blocks <= INT32_MAX, "adamw_update: " + std::to_string(blocks) +
                                        " blocks in one launch exceed the grid limit 2^31-1");
    adamw_batch_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(batch, clip);
    GNMR_CUDA_CHECK(cudaGetLastError());
  }
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t count,
                  const AdamWStep& s, const float* clip, cudaStream_t stream) {
  adamw_update_batch({AdamWTensor{param, grad, m, v, count, s}}, clip, stream);
}

}  // namespace gnmr::cuda
