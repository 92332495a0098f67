// LlamaModel's gradient-ready signal (model/gradient_ready_listener.h): what backward reports,
// in which order, and that a reported gradient is already final.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/llama.h"

namespace gnmr {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.dim = 16;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 40;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  return c;
}

// Records each reported range and a copy of the flat gradient at that moment.
class Recorder final : public GradientReadyListener {
 public:
  explicit Recorder(LlamaModel& model) : model_(model) {}
  void on_params_ready(int first_param, int last_param) override {
    ranges.emplace_back(first_param, last_param);
    std::vector<float> grads(size_t(model_.flat_grads().numel()));
    model_.backend().copy_to_host(model_.flat_grads(), grads.data());
    snapshots.push_back(std::move(grads));
  }
  std::vector<std::pair<int, int>> ranges;
  std::vector<std::vector<float>> snapshots;

 private:
  LlamaModel& model_;
};

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_tokens(int64_t n, int vocab) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  Batch r;
  for (int64_t i = 0; i < n; ++i) {
    r.tokens.push_back(token(rng));
    r.targets.push_back(token(rng));
  }
  return r;
}

TEST(GradientReady, BackwardReportsEveryParameterOnceLastLayerFirst) {
  const ModelConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  LlamaModel model(c, *be, 2, 8);
  model.init_weights(1);
  const Batch batch = random_tokens(16, c.vocab_size);
  Recorder recorder(model);
  model.zero_grads();
  model.set_gradient_ready_listener(&recorder);
  model.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f);

  const int num_params = int(model.params().size());
  // lm_head with the final norm, each layer, the embedding.
  ASSERT_EQ(recorder.ranges.size(), size_t(c.n_layers + 2));
  int next_last = num_params - 1;  // contiguous, descending, no gap, no overlap
  for (const auto& [first, last] : recorder.ranges) {
    EXPECT_EQ(last, next_last);
    EXPECT_LE(first, last);
    next_last = first - 1;
  }
  EXPECT_EQ(next_last, -1);
  EXPECT_EQ(model.params()[size_t(recorder.ranges.front().second)].name, "lm_head.weight");
  EXPECT_EQ(model.params()[size_t(recorder.ranges.back().first)].name, "model.embed_tokens.weight");
  EXPECT_EQ(model.params()[size_t(recorder.ranges[1].first)].name,
            "model.layers.2.self_attn.q_proj.weight");
}

TEST(GradientReady, AReportedGradientNoLongerChangesInThatBackward) {
  const ModelConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  LlamaModel model(c, *be, 2, 8);
  model.init_weights(2);
  const Batch batch = random_tokens(16, c.vocab_size);
  Recorder recorder(model);
  model.zero_grads();
  // A first micro-step unheard (its gradients are partial sums), then the heard one.
  model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f);
  model.set_gradient_ready_listener(&recorder);
  model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f);
  model.set_gradient_ready_listener(nullptr);
  ASSERT_EQ(recorder.ranges.size(), size_t(c.n_layers + 2));

  std::vector<float> final_grads(size_t(model.flat_grads().numel()));
  be->copy_to_host(model.flat_grads(), final_grads.data());
  for (size_t call = 0; call < recorder.ranges.size(); ++call) {
    const auto [first, last] = recorder.ranges[call];
    for (int p = first; p <= last; ++p) {
      const ParamInfo& info = model.params()[size_t(p)];
      const size_t n = size_t(info.grad.numel()), at = size_t(info.offset);
      EXPECT_EQ(std::memcmp(recorder.snapshots[call].data() + at, final_grads.data() + at,
                            n * sizeof(float)),
                0)
          << info.name << " changed after it was reported ready";
      double sum = 0;
      for (size_t i = 0; i < n; ++i) sum += std::abs(final_grads[at + i]);
      EXPECT_GT(sum, 0.0) << info.name << " has no gradient at all";
    }
  }
  // Without a listener the next backward reports nothing.
  model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f);
  EXPECT_EQ(recorder.ranges.size(), size_t(c.n_layers + 2));
}

}  // namespace
}  // namespace gnmr
