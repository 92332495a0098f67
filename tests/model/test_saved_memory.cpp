// The saved activations the model reports (RoutingStats) against what the backend really
// holds for them (Backend::memory_use()[MemoryRole::SavedActivations]), for several recipes
// and plans; and the per-layer fp32 projection inputs that exist only when a backward reads
// them.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/llama.h"

namespace gnmr {
namespace {

// Every buffer a multiple of 16 floats, so the cpu allocator's 64-byte rounding adds nothing.
constexpr int kBatch = 2, kSeq = 8;

ModelConfig small_config() {
  ModelConfig c;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;  // k, v: [N, 32]
  c.ffn_dim = 96;
  c.vocab_size = 64;
  c.max_seq_len = kSeq;
  return c;
}

// What the model saves outside the projections: the residual stream, q, k, v, h, gate, up,
// the norms' rstd and final output, and attention's probabilities [B, H, T, T].
size_t saved_outside_the_projections(const ModelConfig& c) {
  const size_t n = kBatch * kSeq, d = c.dim, f = c.ffn_dim;
  const size_t kv = static_cast<size_t>(c.n_kv_heads) * c.head_dim();
  const size_t per_layer =
      n + n * d + 2 * n * kv + size_t(kBatch) * c.n_heads * kSeq * kSeq + n * d + n + 2 * n * f;
  return sizeof(float) * ((c.n_layers + 1) * n * d + c.n_layers * per_layer + n * d + n);
}

RoutingPlan uniform_plan(int n_units, Path path) {
  RoutingPlan plan;
  plan.path.assign(static_cast<size_t>(n_units), path);
  return plan;
}

RoutingPlan alternating_plan(int n_units) {
  RoutingPlan plan;
  for (int u = 0; u < n_units; ++u) plan.path.push_back(u % 2 ? Path::Recovery : Path::Low);
  return plan;
}

// The plan that needs the most saved memory under actq: q and gate on the low path, the rest
// on recovery, so each shared input needs both of its copies and every unit alone the larger.
RoutingPlan worst_case_plan(int n_units) {
  RoutingPlan plan;
  for (int u = 0; u < n_units; ++u) {
    const ProjectionKind kind = static_cast<ProjectionKind>(u % kKindsPerLayer);
    const bool low = kind == ProjectionKind::Q || kind == ProjectionKind::Gate;
    plan.path.push_back(low ? Path::Low : Path::Recovery);
  }
  return plan;
}

struct Recipe {
  std::string name;
  nlohmann::json section;
};

TEST(SavedMemory, ReportedBytesAgreeWithTheBackendsAllocationForEveryRecipeAndPlan) {
  const ModelConfig c = small_config();
  const std::vector<Recipe> recipes = {
      {"fp32", {{"recipe", "fp32"}}},
      {"bf16", {{"recipe", "bf16"}}},
      {"actq", {{"recipe", "actq"}}},
      {"actq stochastic", {{"recipe", "actq"}, {"stochastic_rounding", true}}},
      {"actq fp32 recovery", {{"recipe", "actq"}, {"recovery_bits", 0}}},
      {"fp8mix", {{"recipe", "fp8mix"}}},
      {"int8", {{"recipe", "int8"}}}};
  const int n_units = kKindsPerLayer * c.n_layers;
  for (const Recipe& r : recipes) {
    SCOPED_TRACE(r.name);
    auto be = make_cpu_backend(1);
    LlamaModel model(c, *be, kBatch, kSeq, recipe_from_json(r.section));
    const size_t planned = model.routing_stats().planned_saved_activation_bytes;
    EXPECT_EQ(be->memory_use()[MemoryRole::SavedActivations],
              saved_outside_the_projections(c) + planned);
    size_t largest = 0;
    for (const RoutingPlan& plan :
         {uniform_plan(n_units, Path::Low), uniform_plan(n_units, Path::Recovery),
          alternating_plan(n_units), worst_case_plan(n_units)}) {
      model.set_routing(plan);
      const size_t kept = model.routing_stats().saved_activation_bytes;
      EXPECT_LE(kept, planned);
      largest = std::max(largest, kept);
    }
    // Memory is planned for nothing a plan cannot use, except under actq with an fp32
    // recovery path, where the fp32 input and the low path's codes are both planned for.
    if (r.name != "actq fp32 recovery") {
      EXPECT_EQ(largest, planned);
    }
  }
}

// Bytes of one unit's int codes at `bits` for an input of `cols` (groups of 128 cut to the
// widths 64 and 96: one group per row, one fp32 scale per token).
size_t codes_of(size_t bits, size_t cols) {
  const size_t n = kBatch * kSeq;
  return n * cols * bits / 8 + n * 4;
}

TEST(SavedMemory, ActqPlansSharedCodesAndNoPerLayerFp32ProjectionInput) {
  // actq (int4 low, int8 recovery): q, k, v share one copy of xn_attn per spec and gate, up
  // one of xn_mlp, so each of the two inputs plans an int4 and an int8 copy (any routing
  // needs at most both) where each unit used to plan its own int8 one; o and down keep their
  // own. xn_attn, att, xn_mlp and act live in one per-step buffer. With an fp32 recovery path
  // the four are kept per layer, beside the low path's int4 codes (shared the same way).
  const ModelConfig c = small_config();
  const size_t n = kBatch * kSeq, d = c.dim, f = c.ffn_dim, layers = c.n_layers;
  const size_t fp32_inputs = layers * sizeof(float) * n * (3 * d + f);
  auto be = make_cpu_backend(1);
  LlamaModel actq(c, *be, kBatch, kSeq, recipe_by_name("actq"));
  const size_t shared_pair = codes_of(4, d) + codes_of(8, d);
  EXPECT_EQ(actq.routing_stats().planned_saved_activation_bytes,
            layers * (2 * shared_pair + codes_of(8, d) + codes_of(8, f)));
  // 2 * 16 * (2 * 64 + 4) fewer bytes than the 7 own int8 copies a layer planned before.
  EXPECT_EQ(layers * (6 * codes_of(8, d) + codes_of(8, f)) -
                actq.routing_stats().planned_saved_activation_bytes,
            layers * (3 * codes_of(8, d) - 2 * codes_of(4, d)));
  // Every unit on one path: one copy of each input, counted once.
  const int n_units = kKindsPerLayer * c.n_layers;
  actq.set_routing(uniform_plan(n_units, Path::Low));
  EXPECT_EQ(actq.routing_stats().saved_activation_bytes,
            layers * (3 * codes_of(4, d) + codes_of(4, f)));
  // What each weight gradient reads is still the whole copy.
  EXPECT_EQ(actq.routing_stats().saved_bytes_per_unit[unit_id(0, ProjectionKind::K)],
            codes_of(4, d));
  actq.set_routing(uniform_plan(n_units, Path::Recovery));
  EXPECT_EQ(actq.routing_stats().saved_activation_bytes,
            layers * (3 * codes_of(8, d) + codes_of(8, f)));

  LlamaModel full(c, *be, kBatch, kSeq,
                  recipe_from_json({{"recipe", "actq"}, {"recovery_bits", 0}}));
  EXPECT_EQ(full.routing_stats().planned_saved_activation_bytes,
            layers * (3 * codes_of(4, d) + codes_of(4, f)) + fp32_inputs);
  // The recovery plan of the fp32-recovery model keeps the fp32 inputs once per layer, not
  // once per unit reading them.
  full.set_routing(uniform_plan(n_units, Path::Recovery));
  EXPECT_EQ(full.routing_stats().saved_activation_bytes, fp32_inputs);
}

TEST(SavedMemory, StochasticRoundingKeepsOneCopyPerUnit) {
  // Each unit's stochastic codes depend on its own RNG key: nothing is shared.
  const ModelConfig c = small_config();
  const size_t d = c.dim, f = c.ffn_dim, layers = c.n_layers;
  auto be = make_cpu_backend(1);
  LlamaModel sr(c, *be, kBatch, kSeq,
                recipe_from_json({{"recipe", "actq"}, {"stochastic_rounding", true}}));
  EXPECT_EQ(sr.routing_stats().planned_saved_activation_bytes,
            layers * (6 * codes_of(8, d) + codes_of(8, f)));
  sr.set_routing(uniform_plan(kKindsPerLayer * c.n_layers, Path::Low));
  EXPECT_EQ(sr.routing_stats().saved_activation_bytes,
            layers * (6 * codes_of(4, d) + codes_of(4, f)));
}

}  // namespace
}  // namespace gnmr
