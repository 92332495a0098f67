// Saved-input sharing (backend/shared_saved_input.h) changes no number: a model whose q, k, v
// (gate, up) share quantized copies of their input gives the bitwise gradients and losses of
// one where every unit keeps its own, under routings that put the units of one input on
// different paths (different specs, so both copies are written) and that change between
// steps, over two micro-steps each.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/llama.h"

namespace gnmr {
namespace {

constexpr int kBatch = 2, kSeq = 8, kMicroSteps = 2;

ModelConfig config() {
  ModelConfig c;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 96;
  c.vocab_size = 64;
  c.max_seq_len = kSeq;
  c.init_std = 0.1f;
  return c;
}

// Unit u on Low when bit (u % 7) of `low_mask` is set.
RoutingPlan plan_from_mask(int n_units, unsigned low_mask) {
  RoutingPlan plan;
  for (int u = 0; u < n_units; ++u) {
    plan.path.push_back(low_mask >> (u % kKindsPerLayer) & 1u ? Path::Low : Path::Recovery);
  }
  return plan;
}

struct TrainRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;  // after each step
  size_t saved_bytes = 0;                 // planned, as allocated
};

TrainRun train(SavedInputSharing sharing, const PrecisionRecipe& recipe) {
  const ModelConfig c = config();
  auto be = make_cpu_backend(2);
  LlamaModel model(c, *be, kBatch, kSeq, recipe, sharing);
  model.init_weights(11);
  TrainRun run;
  run.saved_bytes = be->memory_use()[MemoryRole::SavedActivations];
  std::mt19937 rng(12);
  std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);
  std::vector<int32_t> tokens(kBatch * kSeq), targets(kBatch * kSeq);
  const int n_units = kKindsPerLayer * c.n_layers;
  // q low, k recovery, v low, gate recovery, up low; then the reverse; then all low.
  const unsigned masks[] = {0b0100101u, 0b1011010u, 0b1111111u};
  int64_t step = 0;
  for (unsigned mask : masks) {
    model.set_routing(plan_from_mask(n_units, mask));
    model.zero_grads();
    model.set_step(++step);
    for (int m = 0; m < kMicroSteps; ++m) {
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = token(rng), targets[i] = token(rng);
      run.losses.push_back(model.forward_backward(tokens.data(), targets.data(), 0.5f));
    }
    std::vector<float> g(static_cast<size_t>(model.flat_grads().numel()));
    be->copy_to_host(model.flat_grads(), g.data());
    run.grads.push_back(std::move(g));
  }
  return run;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SharedSavedInput, MixedRoutingGivesTheBitwiseGradientsOfPerUnitCopies) {
  const PrecisionRecipe actq = recipe_by_name("actq");  // int4 low, int8 recovery
  const TrainRun shared = train(SavedInputSharing::kShared, actq);
  const TrainRun per_unit = train(SavedInputSharing::kPerUnit, actq);
  EXPECT_LT(shared.saved_bytes, per_unit.saved_bytes);  // the sharing really happened
  ASSERT_EQ(shared.grads.size(), per_unit.grads.size());
  for (size_t s = 0; s < shared.grads.size(); ++s) {
    EXPECT_TRUE(same_bits(shared.grads[s], per_unit.grads[s])) << "step " << s + 1;
  }
  EXPECT_TRUE(same_bits(shared.losses, per_unit.losses));
}

TEST(SharedSavedInput, StochasticRoundingIsNotShared) {
  PrecisionRecipe sr = recipe_by_name("actq");
  sr.low.saved.stochastic = sr.recovery.saved.stochastic = true;
  const TrainRun shared = train(SavedInputSharing::kShared, sr);
  const TrainRun per_unit = train(SavedInputSharing::kPerUnit, sr);
  EXPECT_EQ(shared.saved_bytes, per_unit.saved_bytes);
  for (size_t s = 0; s < shared.grads.size(); ++s) {
    EXPECT_TRUE(same_bits(shared.grads[s], per_unit.grads[s])) << "step " << s + 1;
  }
}

}  // namespace
}  // namespace gnmr
