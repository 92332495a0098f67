// Multi-tensor sum of squares (per-unit gradient norms for GNMR, the global clip norm).
// One pass over all tensors in fixed chunks of kSumSquaresChunk elements; each chunk sums in
// double, chunks combine in order, so the result is the same for any thread count.
// global_norm_clip turns the per-tensor sums into the clip factor and the step's finite flag.
// CUDA twin: kernels/sum_squares.cu (same chunks and order, so the same bits).
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/train_math.h"

namespace gnmr {
namespace cpu {

void sum_squares(const float* const* tensors, const int64_t* counts, int64_t num_tensors,
                 double* out_per_tensor, int threads) {
  // Work list: (tensor, first element) per chunk.
  std::vector<int64_t> chunk_tensor, chunk_begin;
  for (int64_t t = 0; t < num_tensors; ++t) {
    for (int64_t begin = 0; begin < counts[t]; begin += kSumSquaresChunk) {
      chunk_tensor.push_back(t);
      chunk_begin.push_back(begin);
    }
  }
  const int64_t chunks = static_cast<int64_t>(chunk_tensor.size());
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 4)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t t = chunk_tensor[c];
    const float* x = tensors[t];
    const int64_t begin = chunk_begin[c];
    const int64_t end = begin + kSumSquaresChunk < counts[t] ? begin + kSumSquaresChunk : counts[t];
    // Four independent double accumulators (a fixed order) so the loop pipelines.
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) {
      for (int lane = 0; lane < 4; ++lane) {
        const double value = x[i + lane];
        acc[lane] += value * value;
      }
    }
    for (; i < end; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
    partial[static_cast<size_t>(c)] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  for (int64_t t = 0; t < num_tensors; ++t) out_per_tensor[t] = 0.0;
  for (int64_t c = 0; c < chunks; ++c) out_per_tensor[chunk_tensor[c]] += partial[c];
}

// The trainer reads the same sums back and recomputes the norm in the same order, so its
// logged grad_norm and skip decision agree with what the optimizer was given.
void global_norm_clip(const double* sum_squares, int64_t count, double loss_sum, double max_norm,
                      float* clip) {
  global_norm_clip_values(sum_squares, count, loss_sum, max_norm, clip);
}

}  // namespace cpu
}  // namespace gnmr
