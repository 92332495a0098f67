// LlamaModel: gradients against central differences of an independent double reference,
// directional derivative of its own loss, determinism, initial loss, bf16 mode, parameter
// table, shape validation and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_tensors.h"
#include "model/llama.h"
#include "model/reference_llama.h"
#include "util/error.h"

namespace gnmr {
namespace {

using testing::download;

using testing::Matrix;
using testing::reference_loss;

constexpr int kBatch = 2, kSeq = 8;

ModelConfig tiny_config() {
  ModelConfig c;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;  // grouped-query attention
  c.ffn_dim = 40;
  c.vocab_size = 64;
  c.max_seq_len = 16;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.init_std = 0.02f;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(const ModelConfig& c, uint32_t seed, int64_t n = kBatch * kSeq) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);
  Batch b;
  for (int64_t i = 0; i < n; ++i) {
    b.tokens.push_back(token(rng));
    b.targets.push_back(token(rng));
  }
  return b;
}

// Weights large enough that every gradient is well above float noise: matrices N(0, 0.3^2),
// norm gains 1 + N(0, 0.1^2). Returns them in double, by parameter index.
std::vector<Matrix> set_random_weights(LlamaModel& model, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<Matrix> weights;
  for (const ParamInfo& p : model.params()) {
    std::vector<float> host(static_cast<size_t>(p.weight.numel()));
    for (float& w : host) {
      w = static_cast<float>(p.shape.size() >= 2 ? 0.3 * normal(rng) : 1.0 + 0.1 * normal(rng));
    }
    Tensor t = p.weight;
    model.backend().copy_from_host(t, host.data());
    weights.emplace_back(host.begin(), host.end());
  }
  return weights;
}

TEST(LlamaModel, GradientsMatchCentralDifferencesOfDoubleReference) {
  const ModelConfig c = tiny_config();
  auto be = make_cpu_backend(2);
  LlamaModel model(c, *be, kBatch, kSeq);
  std::vector<Matrix> weights = set_random_weights(model, 7);
  Batch batch = random_batch(c, 8);
  batch.targets[3] = -1;  // an ignored position
  model.zero_grads();
  const float loss = model.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f);

  const ParamTable table = build_param_table(c);
  const double ref = reference_loss(c, table, weights, batch.tokens, batch.targets, kBatch, kSeq);
  // fp32 forward of a loss ~4: a few ulps of 4 (~5e-7) per layer of rounding; 1e-5 absolute.
  EXPECT_NEAR(loss, ref, 1e-5);

  // Central differences in double with h = 1e-5: truncation O(h^2) ~ 1e-10, rounding
  // O(1e-16 * 4 / h) ~ 4e-11, so the differences are exact to ~1e-9 and what remains is the
  // fp32 error of the analytic gradient: ~1e-6 relative per op over ~30 ops in sequence.
  // Bound: 2e-4 of the largest gradient of that parameter (+1e-7 for near-empty ones); a wrong
  // term (missing rope, wrong GQA head, missing residual) is O(1) relative.
  const double h = 1e-5;
  for (size_t pi = 0; pi < model.params().size(); ++pi) {
    const ParamInfo& p = model.params()[pi];
    const std::vector<float> grad = download(*be, p.grad);
    double scale = 0.0;
    for (float g : grad) scale = std::max(scale, double(std::fabs(g)));
    ASSERT_GT(scale, 1e-6) << p.name << " has no gradient at all";
    const size_t stride = std::max<size_t>(1, grad.size() / 24);  // 24 elements per tensor
    for (size_t i = (pi * 7) % stride; i < grad.size(); i += stride) {
      const double saved = weights[pi][i];
      weights[pi][i] = saved + h;
      const double plus =
          reference_loss(c, table, weights, batch.tokens, batch.targets, kBatch, kSeq);
      weights[pi][i] = saved - h;
      const double minus =
          reference_loss(c, table, weights, batch.tokens, batch.targets, kBatch, kSeq);
      weights[pi][i] = saved;
      const double numeric = (plus - minus) / (2 * h);
      ASSERT_NEAR(grad[i], numeric, 2e-4 * scale + 1e-7) << p.name << "[" << i << "]";
    }
  }
}

TEST(LlamaModel, GradientPredictsItsOwnLossChange) {
  // Directional derivative of the fp32 model itself along the normalized gradient d:
  // (L(w + e d) - L(w - e d)) / 2e = |g|. With e = 1e-2, loss rounding (~5e-7) contributes
  // ~2.5e-5 absolute and the cubic term e^2 L''' ~ 1e-4 relative; 1% relative tolerance.
  const ModelConfig c = tiny_config();
  auto be = make_cpu_backend(2);
  LlamaModel model(c, *be, kBatch, kSeq);
  set_random_weights(model, 9);
  const Batch batch = random_batch(c, 10);
  model.zero_grads();
  model.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f);
  const std::vector<float> g = download(*be, model.flat_grads());
  const std::vector<float> w = download(*be, model.flat_weights());
  double norm = 0.0;
  for (float x : g) norm += double(x) * x;
  norm = std::sqrt(norm);
  const double e = 1e-2;
  auto loss_at = [&](double sign) {
    std::vector<float> moved(w.size());
    for (size_t i = 0; i < w.size(); ++i)
      moved[i] = static_cast<float>(w[i] + sign * e * g[i] / norm);
    Tensor flat = model.flat_weights();
    be->copy_from_host(flat, moved.data());
    return double(model.forward_loss(batch.tokens.data(), batch.targets.data()));
  };
  const double slope = (loss_at(1.0) - loss_at(-1.0)) / (2 * e);
  EXPECT_NEAR(slope, norm, 1e-2 * norm);
}

TEST(LlamaModel, TwoRunsGiveIdenticalBits) {
  const ModelConfig c = tiny_config();
  std::vector<float> grads[2];
  float losses[2];
  for (int run = 0; run < 2; ++run) {
    auto be = make_cpu_backend(2);
    LlamaModel model(c, *be, kBatch, kSeq);
    model.init_weights(1234);
    model.zero_grads();
    const Batch batch = random_batch(c, 11);
    model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f);
    losses[run] = model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f);
    grads[run] = download(*be, model.flat_grads());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

// An evaluation model (ModelGradients::kNone) holds no gradient buffer, 4 bytes a parameter
// less, and one layer's activations whatever its depth, and gives a training model's
// forward_loss bits; a backward on it is refused.
TEST(LlamaModel, AModelWithoutGradientsEvaluatesAsOneWithThem) {
  const ModelConfig c = tiny_config();
  const Batch batch = random_batch(c, 23);
  auto with_be = make_cpu_backend(2), without_be = make_cpu_backend(2);
  LlamaModel with(c, *with_be, kBatch, kSeq);
  LlamaModel without(c, *without_be, kBatch, kSeq, PrecisionRecipe{}, SavedInputSharing::kShared, 1,
                     ModelGradients::kNone);
  with.init_weights(5);
  without.init_weights(5);
  EXPECT_EQ(without.forward_loss(batch.tokens.data(), batch.targets.data()),
            with.forward_loss(batch.tokens.data(), batch.targets.data()));
  EXPECT_EQ(without_be->memory_use()[MemoryRole::Gradients], 0u);
  EXPECT_GE(with_be->memory_use().total() - without_be->memory_use().total(),
            sizeof(float) * size_t(with.num_params()));
  EXPECT_EQ(without.flat_grads().data, nullptr);
  ModelConfig deeper = c;
  deeper.n_layers = 5;
  auto deeper_be = make_cpu_backend(2);
  LlamaModel deeper_model(deeper, *deeper_be, kBatch, kSeq, PrecisionRecipe{},
                          SavedInputSharing::kShared, 1, ModelGradients::kNone);
  EXPECT_EQ(deeper_be->memory_use()[MemoryRole::SavedActivations],
            without_be->memory_use()[MemoryRole::SavedActivations])
      << "the layers share one set of activations";
  EXPECT_LT(without_be->memory_use()[MemoryRole::SavedActivations],
            with_be->memory_use()[MemoryRole::SavedActivations]);
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { without.zero_grads(); },
           [&] { without.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f); }}) {
    try {
      call();
      ADD_FAILURE() << "a model without gradients ran a backward";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("built without gradients"), std::string::npos)
          << e.what();
    }
  }
}

TEST(LlamaModel, InitWeightsDoNotDependOnThreadCount) {
  const ModelConfig c = tiny_config();
  std::vector<float> weights[2];
  for (int threads : {1, 2}) {
    auto be = make_cpu_backend(threads);
    LlamaModel model(c, *be, kBatch, kSeq);
    model.init_weights(99);
    weights[threads - 1] = download(*be, model.flat_weights());
  }
  EXPECT_EQ(weights[0], weights[1]);
  // and are N(0, init_std) on the embedding, 1 on norms
  auto be = make_cpu_backend(1);
  LlamaModel model(c, *be, kBatch, kSeq);
  model.init_weights(99);
  const auto embed = download(*be, model.params()[0].weight);
  double sum_sq = 0.0;
  for (float x : embed) sum_sq += double(x) * x;
  // 1024 samples: the sample std is within ~3 / sqrt(2 * 1024) = 7% of 0.02
  EXPECT_NEAR(std::sqrt(sum_sq / embed.size()), 0.02, 0.0014);
  for (const ParamInfo& p : model.params()) {
    if (p.shape.size() == 1) {
      EXPECT_EQ(download(*be, p.weight), std::vector<float>(p.shape[0], 1.0f)) << p.name;
    }
  }
}

TEST(LlamaModel, GradientAccumulationSumsMicroSteps) {
  const ModelConfig c = tiny_config();
  auto be = make_cpu_backend(2);
  LlamaModel model(c, *be, kBatch, kSeq);
  set_random_weights(model, 12);
  const Batch batch = random_batch(c, 13);
  model.zero_grads();
  model.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f);
  const auto once = download(*be, model.flat_grads());
  model.zero_grads();
  model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.25f);
  model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.75f);
  const auto twice = download(*be, model.flat_grads());
  double max_g = 0.0;
  for (float g : once) max_g = std::max(max_g, double(std::fabs(g)));
  // the same sum in a different fp32 order: a few ulps of the largest gradient
  for (size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(twice[i], once[i], 1e-6 * max_g) << i;
}

TEST(LlamaModel, InitialLossIsLogVocab) {
  // With std 0.02 the logits are ~N(0, (0.02 * sqrt(dim))^2) = N(0, 0.11^2) at dim 32,
  // so the loss exceeds ln(V) by about var / 2 ~ 0.006; 0.03 bounds it with sampling noise.
  ModelConfig c = tiny_config();
  c.dim = 32;
  c.vocab_size = 512;
  auto be = make_cpu_backend(2);
  LlamaModel model(c, *be, kBatch, kSeq);
  model.init_weights(5);
  const Batch batch = random_batch(c, 14);
  const float loss = model.forward_loss(batch.tokens.data(), batch.targets.data());
  EXPECT_NEAR(loss, std::log(512.0), 0.03);
}

TEST(LlamaModel, Bf16GemmsStayCloseToFp32) {
  const ModelConfig c = tiny_config();
  auto be = make_cpu_backend(2);
  LlamaModel model(c, *be, kBatch, kSeq);
  set_random_weights(model, 15);
  const Batch batch = random_batch(c, 16);
  float loss[2];
  std::vector<float> grad[2];
  for (int mode = 0; mode < 2; ++mode) {
    be->set_gemm_precision(mode == 0 ? GemmPrecision::FP32 : GemmPrecision::BF16);
    model.zero_grads();
    loss[mode] = model.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f);
    grad[mode] = download(*be, model.flat_grads());
  }
  // bf16 inputs carry <= 2^-9 relative error each; through 2 layers x 3 GEMMs in sequence plus
  // lm_head the loss (~4, logits O(3)) moves by O(1e-2) at most and the gradient by a few
  // percent of its norm. Bounds 0.05 absolute and 10% relative; both must differ at all.
  EXPECT_NE(loss[0], loss[1]);
  EXPECT_NEAR(loss[0], loss[1], 0.05);
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < grad[0].size(); ++i) {
    diff += double(grad[0][i] - grad[1][i]) * (grad[0][i] - grad[1][i]);
    norm += double(grad[0][i]) * grad[0][i];
  }
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(std::sqrt(diff / norm), 0.1);
}

TEST(LlamaModel, ParamTableFollowsHuggingFaceNamesAndUnits) {
  const ModelConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  LlamaModel model(c, *be, kBatch, kSeq);
  const auto& params = model.params();
  ASSERT_EQ(params.size(), 1u + 9u * c.n_layers + 2u);
  EXPECT_EQ(params.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(params[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(params[2].shape, (std::vector<int64_t>{8, 16}));  // k_proj: [Hkv * hd, dim]
  EXPECT_EQ(params[7].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(params[8].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(params[9].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(params[params.size() - 2].name, "model.norm.weight");
  EXPECT_EQ(params.back().name, "lm_head.weight");
  EXPECT_TRUE(params.front().weight_decay);
  EXPECT_FALSE(params[8].weight_decay);
  const auto& units = model.units();
  ASSERT_EQ(units.size(), 7u * c.n_layers);
  for (size_t i = 0; i < units.size(); ++i) {
    const ProjectionUnit& u = units[i];
    EXPECT_EQ(u.id, static_cast<int>(i));
    EXPECT_EQ(u.id, u.layer * 7 + static_cast<int>(u.kind));
    EXPECT_EQ(params[u.param_index].unit, u.id);
    EXPECT_NE(params[u.param_index].name.find(std::string(projection_kind_name(u.kind)) + "_proj"),
              std::string::npos);
  }
  const int64_t d = 16, kv = 8, f = 40, v = 64;
  const int64_t per_layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d;
  EXPECT_EQ(model.num_params(), 2 * v * d + 2 * per_layer + d);
  EXPECT_EQ(llama_parameter_count(c), model.num_params());  // the count without a model
  const int64_t matmul = 2 * (2 * d * d + 2 * d * kv + 3 * d * f) + v * d;
  EXPECT_EQ(model.flops_per_token(), 6 * matmul + 12 * 2 * d * kSeq);
}

void expect_config_error(ModelConfig c, int seq_len, const std::string& field) {
  auto be = make_cpu_backend(1);
  try {
    LlamaModel model(c, *be, kBatch, seq_len);
    FAIL() << "expected an error naming " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(LlamaModel, RejectsInconsistentShapesNamingTheField) {
  ModelConfig c = tiny_config();
  expect_config_error(c, 17, "model.max_seq_len");
  c = tiny_config();
  c.n_kv_heads = 3;
  expect_config_error(c, kSeq, "model.n_kv_heads");
  c = tiny_config();
  c.dim = 18;
  expect_config_error(c, kSeq, "model.n_heads");
}

TEST(LlamaModel, RejectsTokensOutsideTheVocabulary) {
  const ModelConfig c = tiny_config();
  auto be = make_cpu_backend(1);
  LlamaModel model(c, *be, kBatch, kSeq);
  Batch batch = random_batch(c, 17);
  batch.tokens[5] = 64;
  try {
    model.forward_loss(batch.tokens.data(), batch.targets.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Data);
    EXPECT_NE(std::string(e.what()).find("position 5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gnmr
