// Per-unit routing of the precision recipes: each unit's weight gradient sees its own path,
// a plan that flips every step equals fresh computations, saved-activation bytes, the bf16
// weight cache.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_tensors.h"
#include "model/llama.h"
#include "model/projection_paths.h"
#include "precision/quantize_groupwise.h"

namespace gnmr {
namespace {

using testing::download;
using testing::upload;

constexpr int kBatch = 2, kSeq = 8;

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

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

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  Batch b;
  for (int i = 0; i < kBatch * kSeq; ++i) {
    b.tokens.push_back(token(rng));
    b.targets.push_back(token(rng));
  }
  return b;
}

RoutingPlan plan_from(int n_units, uint32_t pattern) {
  RoutingPlan plan;
  for (int u = 0; u < n_units; ++u) {
    plan.path.push_back((pattern >> (u % 32)) & 1u ? Path::Recovery : Path::Low);
  }
  return plan;
}

// The model's parameter table with its weight and gradient views in two flat buffers of `be`.
struct TableOnBackend {
  ParamTable table;
  Tensor flat_weights;
};
TableOnBackend table_on(Backend& be, const ModelConfig& c) {
  TableOnBackend t{build_param_table(c), {}};
  t.flat_weights = be.allocate("w", {t.table.flat_size}, DType::F32, MemoryRole::Scratch);
  Tensor flat_g = be.allocate("g", {t.table.flat_size}, DType::F32, MemoryRole::Scratch);
  for (ParamInfo& p : t.table.params) {
    p.weight = tensor_view(t.flat_weights, p.shape, p.offset);
    p.grad = tensor_view(flat_g, p.shape, p.offset);
  }
  return t;
}

TEST(ProjectionPaths, QLeadsKAndVAndGateLeadsUpAsTheForwardRunsThem) {
  auto be = make_cpu_backend(2);
  const ModelConfig c = small_config();
  const ParamTable table = table_on(*be, c).table;
  ProjectionPaths paths(recipe_from_json({{"recipe", "bf16"}}), *be, table, kBatch * kSeq);
  for (int l = 0; l < c.n_layers; ++l) {
    const int q = unit_id(l, ProjectionKind::Q), gate = unit_id(l, ProjectionKind::Gate);
    EXPECT_EQ(paths.input_leader(q), -1);
    EXPECT_EQ(paths.input_leader(unit_id(l, ProjectionKind::K)), q);
    EXPECT_EQ(paths.input_leader(unit_id(l, ProjectionKind::V)), q);
    EXPECT_EQ(paths.input_leader(unit_id(l, ProjectionKind::O)), -1);
    EXPECT_EQ(paths.input_leader(gate), -1);
    EXPECT_EQ(paths.input_leader(unit_id(l, ProjectionKind::Up)), gate);
    EXPECT_EQ(paths.input_leader(unit_id(l, ProjectionKind::Down)), -1);
  }
}

TEST(ProjectionPaths, EachUnitsWeightGradientSeesItsOwnBitsWhenUnitsShareTheirInput) {
  // q, k, v read the same x; q and v on the int4 low path, k on the int8 recovery path.
  // Reference: dW_u = dy_u^T dequant(quant(x, bits_u)), computed here from the precision
  // functions and the backend GEMM, so the comparison is bit for bit.
  auto be = make_cpu_backend(2);
  const ModelConfig c = small_config();
  TableOnBackend on = table_on(*be, c);
  const ParamTable& table = on.table;
  be->copy_from_host(on.flat_weights,
                     random_vector(static_cast<size_t>(table.flat_size), 1, 0.2f).data());
  const PrecisionRecipe recipe = recipe_from_json({{"recipe", "actq"},
                                                   {"low_group_size", 32},
                                                   {"recovery_group_size", 16},
                                                   {"stochastic_rounding", true},
                                                   {"seed", 3}});
  const int64_t n = kBatch * kSeq, d = c.dim, kv = 32;
  ProjectionPaths paths(recipe, *be, table, n);
  const int n_units = static_cast<int>(table.units.size());
  RoutingPlan plan = plan_from(n_units, 0);
  plan.path[unit_id(0, ProjectionKind::K)] = Path::Recovery;
  paths.set_routing(plan);
  paths.set_step(5);

  const std::vector<float> x = random_vector(static_cast<size_t>(n * d), 2);
  const Tensor xt = upload(*be, x, {n, d});
  const ProjectionUnit units[3] = {table.units[0], table.units[1], table.units[2]};  // q k v
  const int64_t widths[3] = {d, kv, kv};
  std::vector<Tensor> y, dy;
  for (int i = 0; i < 3; ++i) {
    y.push_back(be->allocate("y", {n, widths[i]}, DType::F32, MemoryRole::Scratch));
    dy.push_back(
        upload(*be, random_vector(static_cast<size_t>(n * widths[i]), 10 + i), {n, widths[i]}));
    paths.forward(units[i], xt, y.back(), true);
  }
  Tensor dx = be->allocate("dx", {n, d}, DType::F32, MemoryRole::Scratch);
  for (int i = 0; i < 3; ++i) paths.backward(units[i], dy[i], dx, i > 0);

  for (int i = 0; i < 3; ++i) {
    const ProjectionUnit& u = units[i];
    const ParamInfo& p = table.params[u.param_index];
    // The GEMMs themselves run in fp32 under actq.
    Tensor y_ref = be->allocate("y_ref", {n, widths[i]}, DType::F32, MemoryRole::Scratch);
    be->matmul_forward(xt, p.weight, y_ref, GemmPrecision::FP32);
    EXPECT_TRUE(same_bits(download(*be, y[i]), download(*be, y_ref))) << "unit " << u.id;

    const std::vector<float> got = download(*be, p.grad);
    auto reference_grad = [&](const GroupwiseSpec& spec) {
      const RngKey key{3, 5, static_cast<uint32_t>(u.id)};
      const GroupwiseQuantized q = quantize_int_groupwise(x.data(), n, d, spec, key);
      std::vector<float> restored(x.size());
      dequantize_int_groupwise(q, restored.data());
      Tensor ref = be->allocate("ref", p.shape, DType::F32, MemoryRole::Scratch);
      be->matmul_backward_weight(upload(*be, restored, {n, d}), dy[i], ref, GemmPrecision::FP32);
      return download(*be, ref);
    };
    const GroupwiseSpec own = i == 1 ? GroupwiseSpec{8, 16, true} : GroupwiseSpec{4, 32, true};
    const GroupwiseSpec other = i == 1 ? GroupwiseSpec{4, 32, true} : GroupwiseSpec{8, 16, true};
    EXPECT_TRUE(same_bits(got, reference_grad(own))) << "unit " << u.id;
    EXPECT_FALSE(same_bits(got, reference_grad(other))) << "unit " << u.id;
  }
  // 4 bits: half a byte per element plus one fp32 scale per 32; 8 bits: a byte plus 1 / 16.
  EXPECT_EQ(paths.stats().saved_bytes_per_unit[0], size_t(n * d / 2 + n * d / 32 * 4));
  EXPECT_EQ(paths.stats().saved_bytes_per_unit[1], size_t(n * d + n * d / 16 * 4));
  EXPECT_EQ(paths.stats().units_recovery, 1);
  EXPECT_EQ(paths.stats().units_low, n_units - 1);
}

struct StepResult {
  float loss;
  std::vector<float> grads;
};

StepResult run_step(LlamaModel& model, const RoutingPlan& plan, int64_t step, const Batch& b) {
  model.zero_grads();
  model.set_routing(plan);
  model.set_step(step);
  StepResult r;
  r.loss = model.forward_backward(b.tokens.data(), b.targets.data(), 1.0f);
  r.grads = download(model.backend(), model.flat_grads());
  return r;
}

void set_weights(LlamaModel& model, const std::vector<float>& w) {
  Tensor t = model.flat_weights();
  model.backend().copy_from_host(t, w.data());
}

TEST(LlamaModelRouting, PlanFlippedEveryStepMatchesFreshModelsRunningEachPlan) {
  const ModelConfig c = small_config();
  const Batch b1 = random_batch(c.vocab_size, 21), b2 = random_batch(c.vocab_size, 22);
  for (const char* name : {"actq", "fp8mix", "int8"}) {
    SCOPED_TRACE(name);
    const PrecisionRecipe recipe =
        recipe_from_json({{"recipe", name}, {"stochastic_rounding", true}, {"low_group_size", 32}});
    auto be = make_cpu_backend(2);
    const int n_units = 7 * c.n_layers;
    const RoutingPlan plan_a = plan_from(n_units, 0x2A5Du), plan_b = plan_from(n_units, ~0x2A5Du);

    LlamaModel model(c, *be, kBatch, kSeq, recipe);
    model.init_weights(1);
    const StepResult s1 = run_step(model, plan_a, 1, b1);
    std::vector<float> w = download(*be, model.flat_weights());
    for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5f * s1.grads[i];  // SGD
    set_weights(model, w);
    const StepResult s2 = run_step(model, plan_b, 2, b2);

    LlamaModel fresh1(c, *be, kBatch, kSeq, recipe);
    fresh1.init_weights(1);
    const StepResult f1 = run_step(fresh1, plan_a, 1, b1);
    EXPECT_EQ(f1.loss, s1.loss);
    EXPECT_TRUE(same_bits(f1.grads, s1.grads));

    LlamaModel fresh2(c, *be, kBatch, kSeq, recipe);
    set_weights(fresh2, w);
    const StepResult f2 = run_step(fresh2, plan_b, 2, b2);
    EXPECT_EQ(f2.loss, s2.loss);
    EXPECT_TRUE(same_bits(f2.grads, s2.grads));
    // The plan matters: the same weights and batch under plan A give other gradients.
    const StepResult f2a = run_step(fresh2, plan_a, 2, b2);
    EXPECT_FALSE(same_bits(f2a.grads, s2.grads));
  }
}

TEST(LlamaModelRouting, SavedActivationsOf4BitUnitsTakeAtMost0_3OfBf16) {
  ModelConfig c;  // the tiny preset: dim 64, ffn 172 (groups of 64 and 86)
  c.max_seq_len = kSeq;
  auto be = make_cpu_backend(2);
  LlamaModel model(c, *be, kBatch, kSeq, recipe_by_name("actq"));
  const int64_t n = kBatch * kSeq;
  const RoutingStats& all_low = model.routing_stats();
  EXPECT_EQ(all_low.units_low, 7 * c.n_layers);
  size_t bf16_total = 0;
  for (const ProjectionUnit& u : model.units()) {
    const int64_t in = model.params()[u.param_index].shape[1];
    const size_t bf16_bytes = static_cast<size_t>(n * in * 2);
    bf16_total += bf16_bytes;
    EXPECT_LE(all_low.saved_bytes_per_unit[u.id], 0.3 * bf16_bytes) << "unit " << u.id;
  }
  EXPECT_LE(all_low.saved_activation_bytes, 0.3 * bf16_total);

  RoutingPlan plan = plan_from(7 * c.n_layers, 0);
  plan.path[unit_id(1, ProjectionKind::Down)] = Path::Recovery;  // input width 172, group 86
  model.set_routing(plan);
  EXPECT_EQ(model.routing_stats().units_recovery, 1);
  EXPECT_EQ(model.routing_stats().saved_bytes_per_unit[unit_id(1, ProjectionKind::Down)],
            size_t(n * 172 + n * 2 * 4));

  LlamaModel full(c, *be, kBatch, kSeq,
                  recipe_from_json({{"recipe", "actq"}, {"recovery_bits", 0}}));
  full.set_routing(plan);
  EXPECT_EQ(full.routing_stats().saved_bytes_per_unit[unit_id(1, ProjectionKind::Down)],
            size_t(n * 172 * 4));
}

TEST(LlamaModelRouting, Bf16WeightCacheGivesTheBitsOfPerCallRounding) {
  // Cached: bf16 set before construction, each weight rounded once per step. Uncached: set
  // after construction, the backend rounds on every GEMM. Two steps with two micro-steps each
  // and a weight update between them (the cache must be redone after zero_grads).
  const ModelConfig c = small_config();
  const Batch b1 = random_batch(c.vocab_size, 31), b2 = random_batch(c.vocab_size, 32);
  auto be_cached = make_cpu_backend(2), be_plain = make_cpu_backend(2);
  be_cached->set_gemm_precision(GemmPrecision::BF16);
  LlamaModel cached(c, *be_cached, kBatch, kSeq);
  LlamaModel plain(c, *be_plain, kBatch, kSeq);
  be_plain->set_gemm_precision(GemmPrecision::BF16);
  EXPECT_GT(be_cached->allocated_bytes(), be_plain->allocated_bytes());  // the cache
  for (LlamaModel* m : {&cached, &plain}) m->init_weights(4);
  std::vector<float> result[2];
  int index = 0;
  for (LlamaModel* m : {&cached, &plain}) {
    for (int step = 0; step < 2; ++step) {
      m->zero_grads();
      m->forward_backward(b1.tokens.data(), b1.targets.data(), 0.5f);
      m->forward_backward(b2.tokens.data(), b2.targets.data(), 0.5f);
      std::vector<float> w = download(m->backend(), m->flat_weights());
      const std::vector<float> g = download(m->backend(), m->flat_grads());
      for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5f * g[i];
      set_weights(*m, w);
    }
    result[index] = download(m->backend(), m->flat_grads());
    result[index].push_back(m->forward_loss(b1.tokens.data(), b1.targets.data()));
    ++index;
  }
  EXPECT_TRUE(same_bits(result[0], result[1]));
}

TEST(LlamaModelRouting, RecipesWithoutALowPathIgnoreThePlan) {
  const ModelConfig c = small_config();
  const Batch b = random_batch(c.vocab_size, 41);
  auto be = make_cpu_backend(2);
  LlamaModel model(c, *be, kBatch, kSeq, recipe_by_name("bf16"));
  model.init_weights(2);
  const StepResult low = run_step(model, plan_from(14, 0), 1, b);
  const StepResult high = run_step(model, plan_from(14, ~0u), 1, b);
  EXPECT_TRUE(same_bits(low.grads, high.grads));
  EXPECT_EQ(model.routing_stats().units_recovery, 14);
  EXPECT_EQ(model.routing_stats().units_low, 0);
}

TEST(LlamaModelRouting, PlanOfTheWrongSizeIsRejected) {
  const ModelConfig c = small_config();
  auto be = make_cpu_backend(1);
  LlamaModel model(c, *be, kBatch, kSeq, recipe_by_name("actq"));
  EXPECT_THROW(model.set_routing(plan_from(13, 0)), Error);
}

}  // namespace
}  // namespace gnmr
