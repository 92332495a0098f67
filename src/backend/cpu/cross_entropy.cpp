// Fused softmax cross-entropy over the vocabulary: the loss per token and, in the same pass,
// the logits gradient written over the logits (no second [tokens, vocab] buffer).
// Targets < 0 are ignored (loss 0, zero gradient row).
#include <algorithm>
#include <cmath>

#include "backend/cpu/isa_clones.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/vector_math.h"

namespace gnmr {
namespace cpu {

namespace {

// Rows [begin, end) of cross_entropy_forward; compiled per instruction set for the exp.
template <typename T>
GNMR_ISA_CLONES void cross_entropy_forward_rows(const T* logits, const int32_t* targets, T* losses,
                                                int64_t vocab, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    if (targets[i] < 0) {
      losses[i] = T(0);
      continue;
    }
    const T* row = logits + i * vocab;
    const T max_logit = row_max(row, vocab);
    // exp values go to a stack block, only their sum is kept
    constexpr int64_t kChunk = 2048;
    T scratch[kChunk];
    double sum = 0.0;
    for (int64_t j0 = 0; j0 < vocab; j0 += kChunk) {
      const int64_t count = std::min(kChunk, vocab - j0);
      sum += exp_shifted_sum(row + j0, max_logit, scratch, count);
    }
    losses[i] = static_cast<T>(std::log(sum) + static_cast<double>(max_logit - row[targets[i]]));
  }
}

// Rows [begin, end) of cross_entropy_forward_backward.
template <typename T>
GNMR_ISA_CLONES void cross_entropy_forward_backward_rows(T* logits, const int32_t* targets,
                                                         T* losses, T dloss, int64_t vocab,
                                                         int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    T* row = logits + i * vocab;
    if (targets[i] < 0) {
      losses[i] = T(0);
      std::fill(row, row + vocab, T(0));
      continue;
    }
    const T max_logit = row_max(row, vocab);
    const T target_logit = row[targets[i]];
    const double sum = exp_shifted_sum(row, max_logit, row, vocab);
    losses[i] = static_cast<T>(std::log(sum) + static_cast<double>(max_logit - target_logit));
    const T factor = static_cast<T>(static_cast<double>(dloss) / sum);
    for (int64_t j = 0; j < vocab; ++j) row[j] *= factor;
    row[targets[i]] -= dloss;
  }
}

}  // namespace

template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, int64_t n,
                           int64_t vocab, int threads) {
  // logits: [n, vocab]; losses[i] = logsumexp(logits[i]) - logits[i, target]
  for_each_thread_range(n, threads, [&](int64_t begin, int64_t end) {
    cross_entropy_forward_rows(logits, targets, losses, vocab, begin, end);
  });
}

template <typename T>
void cross_entropy_forward_backward(T* logits, const int32_t* targets, T* losses, T dloss,
                                    int64_t n, int64_t vocab, int threads) {
  // logits[i] <- dloss * (softmax(logits[i]) - onehot(target))
  for_each_thread_range(n, threads, [&](int64_t begin, int64_t end) {
    cross_entropy_forward_backward_rows(logits, targets, losses, dloss, vocab, begin, end);
  });
}

#define GNMR_INSTANTIATE(T)                                                                    \
  template void cross_entropy_forward<T>(const T*, const int32_t*, T*, int64_t, int64_t, int); \
  template void cross_entropy_forward_backward<T>(T*, const int32_t*, T*, T, int64_t, int64_t, int);
GNMR_INSTANTIATE(float)
GNMR_INSTANTIATE(double)
#undef GNMR_INSTANTIATE

// One thread, index order: the value must not depend on the thread count, and [N] adds are
// nothing next to the [N, V] pass that produced the losses.
void accumulate_mean_loss(const float* losses, int64_t n, int64_t valid, double* loss_sum) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += losses[i];
  *loss_sum += static_cast<double>(static_cast<float>(sum / static_cast<double>(valid)));
}

}  // namespace cpu
}  // namespace gnmr
