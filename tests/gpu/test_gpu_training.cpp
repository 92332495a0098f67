// The CUDA backend end to end: short training runs of the tiny-gpu model (every dimension a
// multiple of 128, so fp8mix runs real block-scaled FP8 GEMMs on sm_90) on the GPU against
// the same runs on the CPU backend, per recipe; one wait for the GPU per optimizer step and no
// device allocation in a step (everything is planned before step 1); the same bits on a
// second run and with every activation and scratch buffer poisoned with NaN (GNMR_POISON=1: a
// read of memory no op wrote would change the losses); the op timing of `gnmr bench`. Skip
// without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "gpu_test_util.h"
#include "kernels/attention_ops.cuh"
#include "kernels/cuda_check.cuh"
#include "model/llama.h"
#include "precision/scale_layout.h"
#include "test_paths.h"
#include "train/make_backend.h"
#include "train/session.h"

#ifdef GNMR_CUDA_EMULATED
#include "emulated_cuda/emulated_cuda.h"
#endif

namespace gnmr {
namespace {

constexpr int kSteps = 5;

RunConfig config_for(const std::string& backend, const std::vector<std::string>& recipe) {
  std::vector<std::string> overrides = {
      "backend=" + backend,
      "data.seq_len=128",
      "train.micro_batch=2",
      "train.global_batch_tokens=512",  // two micro-steps per optimizer step
      "train.steps=5",
      "train.warmup_steps=1",
      "train.lr=0.003",
      "train.threads=2",
      "gnmr.controller=static_low"};
  overrides.insert(overrides.end(), recipe.begin(), recipe.end());
  return load_run_config(gnmr_test::source_path("configs/models/tiny-gpu.json"), overrides);
}

struct TrainedRun {
  std::vector<double> losses, grad_norms;
  std::vector<int64_t> syncs_per_step;
  std::vector<size_t> bytes_allocated_per_step;      // device memory a step added (none: planned)
  std::vector<int64_t> pinned_allocations_per_step;  // cudaMallocHost calls (emulation only)
  size_t saved_activation_bytes = 0;  // what the projections kept for the backward (step 1)
};

// The first `steps` steps of the run.
TrainedRun train(const RunConfig& config, int64_t steps = kSteps) {
  TrainingSession session(config, /*synthetic_data=*/true);
  TrainedRun run;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t before = session.backend().sync_count();
    const size_t allocated_before = session.backend().memory_use().total();
#ifdef GNMR_CUDA_EMULATED
    const int64_t pinned_before = cuda::emulated_pinned_host_allocations();
#endif
    const StepResult r = session.run_step(s);
#ifdef GNMR_CUDA_EMULATED
    run.pinned_allocations_per_step.push_back(cuda::emulated_pinned_host_allocations() -
                                              pinned_before);
#endif
    run.syncs_per_step.push_back(session.backend().sync_count() - before);
    run.bytes_allocated_per_step.push_back(session.backend().memory_use().total() -
                                           allocated_before);
    run.losses.push_back(r.loss);
    run.grad_norms.push_back(r.grad_norm);
    if (s == 0) run.saved_activation_bytes = r.saved_activation_bytes;
  }
  return run;
}

struct Recipe {
  const char* name;
  std::vector<std::string> overrides;
  // |loss_gpu - loss_cpu| / loss_cpu allowed: at step 1 (the same weights: only the GEMMs'
  // summation order and, for the quantized recipes, the odd code rounded the other way at a
  // tie-breaking boundary differ) and over the later steps (the updates compound it).
  double first_step, later_steps;
};

const std::vector<Recipe>& recipes() {
  static const std::vector<Recipe> r = {
      // fp32 GEMMs (no TF32) against OpenBLAS: ~k * 2^-24 per output, k <= 768.
      {"fp32", {"precision.recipe=fp32"}, 1e-5, 1e-4},
      // bf16 operands are the same bits on both and only the fp32 accumulation order differs,
      // but every GEMM input rounded to bf16 (dy included) turns those differences into whole
      // bf16 steps on some elements, and backward compounds them. Measured over these 5 steps:
      // two CPU runs that differ only in train.threads (1, 2) differ by up to 4.5e-5 in loss
      // and 5.7e-4 in gradient norm; the CUDA backend on the host emulation (fp32 sums in
      // another order) by up to 2.2e-3 in gradient norm. Hence actq's tolerances. The fp32
      // flash kernels, so that these bounds hold the GEMMs alone (auto would take the bf16
      // tensor-core attention under bf16 GEMMs: bf16_flash_bf16 below).
      {"bf16",
       {"precision.recipe=bf16", "train.gemm_precision=bf16", "model.attention=flash"},
       1e-4,
       1e-3},
      // Saved int4 codes: a value at a rounding boundary may land on the neighbouring code.
      {"actq", {"precision.recipe=actq"}, 1e-4, 1e-3},
      // Block-scaled FP8 on sm_90 (Hopper accumulates FP8 products in ~14 bits, promoted to fp32
      // every 128: DeepSeek-V3 §3.3.2), emulated elsewhere.
      {"fp8mix", {"precision.recipe=fp8mix"}, 2e-3, 5e-3},
      {"int8", {"precision.recipe=int8"}, 1e-4, 1e-3},
      // bf16 with attention on the bf16 tensor-core flash kernels, against the CPU's fp32
      // attention: q, k, v, P, dO and dS rounded to bf16 (2^-9 relative each) is a smaller
      // perturbation than fp8mix's e4m3 rounding (2^-4) of every projection operand.
      {"bf16_flash_bf16",
       {"precision.recipe=bf16", "train.gemm_precision=bf16", "model.attention=flash_bf16"},
       2e-3,
       5e-3},
      // The same kernels on sm_90a's wgmma (skipped where they do not run): the same roundings.
      {"bf16_flash_wgmma",
       {"precision.recipe=bf16", "train.gemm_precision=bf16", "model.attention=flash_wgmma"},
       2e-3,
       5e-3},
  };
  return r;
}

class GpuTraining : public ::testing::TestWithParam<int> {};

// Whether `recipe`'s first step times the tensor-core flash kernels' variants: on a GPU (the
// emulation keeps the default tiles: CudaBackendOptions::flash_tiles) where it runs them.
bool times_flash_variants(const Recipe& recipe) {
#ifdef GNMR_CUDA_EMULATED
  (void)recipe;
  return false;
#else
  for (const std::string& o : recipe.overrides) {
    if (o == "model.attention=flash_bf16" || o == "model.attention=flash_wgmma") return true;
  }
  return false;
#endif
}

// Why `recipe` does not run on this GPU ("" where it does): the wgmma kernels need sm_90a.
std::string why_not_here(const Recipe& recipe) {
  for (const std::string& o : recipe.overrides) {
    if (o != "model.attention=flash_wgmma") continue;
    int device = 0;
    GNMR_CUDA_CHECK(cudaGetDevice(&device));
    const std::string unavailable = gnmr::cuda::flash_wgmma_unavailable(device);
    if (!unavailable.empty()) return "the wgmma kernels do not run here: " + unavailable;
  }
  return "";
}

TEST_P(GpuTraining, MatchesTheCpuBackendWithOneWaitPerStep) {
  SKIP_WITHOUT_GPU();
  const Recipe& recipe = recipes()[size_t(GetParam())];
  if (const std::string why = why_not_here(recipe); !why.empty()) GTEST_SKIP() << why;
  // The CPU keeps its own attention (materialized fp32), the reference every GPU attention is
  // held to: it refuses the flash choices, so the recipe's model.attention is the GPU's only.
  std::vector<std::string> cpu_overrides;
  for (const std::string& o : recipe.overrides) {
    if (o.rfind("model.attention=", 0) != 0) cpu_overrides.push_back(o);
  }
  const TrainedRun cpu = train(config_for("cpu", cpu_overrides));
  const TrainedRun gpu = train(config_for("cuda", recipe.overrides));
  for (int s = 0; s < kSteps; ++s) {
    const double tolerance = s == 0 ? recipe.first_step : recipe.later_steps;
    EXPECT_TRUE(std::isfinite(gpu.losses[size_t(s)])) << recipe.name << " step " << s + 1;
    EXPECT_LE(std::fabs(gpu.losses[size_t(s)] - cpu.losses[size_t(s)]),
              tolerance * cpu.losses[size_t(s)])
        << recipe.name << " step " << s + 1 << ": gpu " << gpu.losses[size_t(s)] << ", cpu "
        << cpu.losses[size_t(s)];
    EXPECT_NEAR(gpu.grad_norms[size_t(s)], cpu.grad_norms[size_t(s)],
                10 * tolerance * cpu.grad_norms[size_t(s)])
        << recipe.name << " grad norm, step " << s + 1;
    if (s == 0 && times_flash_variants(recipe)) {  // the variants timed: a few more waits, once
      EXPECT_GT(gpu.syncs_per_step[size_t(s)], 1) << recipe.name << " step " << s + 1;
    } else {
      EXPECT_EQ(gpu.syncs_per_step[size_t(s)], 1) << recipe.name << " step " << s + 1;
    }
    EXPECT_EQ(gpu.bytes_allocated_per_step[size_t(s)], 0u) << recipe.name << " step " << s + 1;
#ifdef GNMR_CUDA_EMULATED
    // Nor pinned memory: the staging slots are sized with the token tensors. On a GPU each
    // cudaMallocHost would wait for the device, gradient sums in flight included.
    EXPECT_EQ(gpu.pinned_allocations_per_step[size_t(s)], 0) << recipe.name << " step " << s + 1;
#endif
  }
  // Where every path's backward reads a copy its forward kept (kept_copies_replace_x), the GPU
  // keeps that copy of the inputs of q, k, v (one for the three), gate, up (one) and down in
  // place of fp32 x: bf16 (2 bytes an element), or under fp8mix's all-low plan x^T's e3m2 codes
  // (1 byte) and their scales. o's x (attention's out) stays fp32. Elsewhere the CPU's bytes.
  const int64_t tokens = 2 * 128, layers = 2, dim = 256, ffn = 768;  // tiny-gpu, config_for
  const std::string name = recipe.name;
  auto x_t_copy = [&](int64_t in) {
    return size_t(tokens * in) + sizeof(float) * size_t(vec128_scale_count(in, tokens));
  };
  size_t fewer = 0;
  if (name.rfind("bf16", 0) == 0) fewer = size_t(2 * tokens * layers * (2 * dim + ffn));
  if (name == "fp8mix") {
    fewer = size_t(layers) *
            (size_t(4 * tokens * (2 * dim + ffn)) - (2 * x_t_copy(dim) + x_t_copy(ffn)));
  }
  EXPECT_EQ(gpu.saved_activation_bytes, cpu.saved_activation_bytes - fewer) << recipe.name;
}

TEST_P(GpuTraining, IsDeterministicAndReadsNoUnwrittenMemory) {
  SKIP_WITHOUT_GPU();
  const Recipe& recipe = recipes()[size_t(GetParam())];
  if (const std::string why = why_not_here(recipe); !why.empty()) GTEST_SKIP() << why;
  const RunConfig config = config_for("cuda", recipe.overrides);
  const TrainedRun first = train(config);
  const TrainedRun second = train(config);
  ASSERT_EQ(setenv("GNMR_POISON", "1", 1), 0);
  const TrainedRun poisoned = train(config);
  unsetenv("GNMR_POISON");
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(std::memcmp(&first.losses[size_t(s)], &second.losses[size_t(s)], sizeof(double)), 0)
        << recipe.name << " step " << s + 1 << ": " << first.losses[size_t(s)] << " then "
        << second.losses[size_t(s)];
    EXPECT_EQ(std::memcmp(&first.losses[size_t(s)], &poisoned.losses[size_t(s)], sizeof(double)), 0)
        << recipe.name << " step " << s + 1 << " poisoned: " << poisoned.losses[size_t(s)];
  }
}

// `gnmr bench`'s breakdown (Backend::set_op_timing): with timing on, a step's ops fall in their
// families, each family the step runs has time (not `swiglu` or `residual`: fused), and together
// they fit in the step; with timing off nothing is recorded; and the timed steps give the untimed
// steps' bits (the events only mark the stream).
TEST(GpuTrainingOpTiming, SplitsTheDeviceTimeOfAStepByOpFamilyAndChangesNoBit) {
  SKIP_WITHOUT_GPU();
  const RunConfig config = config_for("cuda", {"precision.recipe=fp8mix"});
  constexpr int64_t kTimedSteps = 2;
  const TrainedRun untimed = train(config, kTimedSteps);
  TrainingSession session(config, /*synthetic_data=*/true);
  session.backend().set_op_timing(true);
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> losses;
  for (int64_t s = 0; s < kTimedSteps; ++s) losses.push_back(session.run_step(s).loss);
  const std::map<std::string, double> ms = session.backend().op_times_ms();
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  double total = 0;
  for (const char* family :
       {"embedding", "rmsnorm", "prep W", "prep x", "prep x (dW)", "prep dy (dW+dx)", "gemm",
        "rope", "attention", "cross_entropy", "norms", "optimizer"}) {
    ASSERT_EQ(ms.count(family), 1u) << family;
    EXPECT_GT(ms.at(family), 0.0) << family;
  }
  // fp8mix runs the SwiGLU, forward and backward, inside the pair kernels of its projections,
  // and every residual add in the RMSNorm kernel after it.
  EXPECT_EQ(ms.count("swiglu"), 0u);
  EXPECT_EQ(ms.count("residual"), 0u);
  for (const auto& [family, family_ms] : ms) total += family_ms;
  EXPECT_LE(total, wall_ms) << "the spans do not overlap, so they fit in the steps' time";
  for (size_t s = 0; s < losses.size(); ++s) {
    EXPECT_EQ(std::memcmp(&losses[s], &untimed.losses[s], sizeof(double)), 0) << "step " << s + 1;
  }
  session.backend().set_op_timing(false);
  session.run_step(kTimedSteps);
  EXPECT_TRUE(session.backend().op_times_ms().empty());
}

// An evaluation model (ModelGradients::kNone: no gradients, its layers sharing one set of
// activations and one attention state) gives a training model's forward_loss bits on the GPU:
// under fp32 GEMMs (gnmr eval's, the fp32 flash kernels) and under bf16 (the tensor-core ones,
// whose state keeps bf16 copies of q, k and v).
TEST(GpuEvaluationModel, GivesTheTrainingModelsLossBits) {
  SKIP_WITHOUT_GPU();
  const RunConfig fp32 = config_for("cuda", {});
  const int batch = fp32.train.micro_batch, seq = fp32.data.seq_len;
  std::vector<int32_t> tokens(size_t(batch) * seq), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int32_t((i * 2654435761u) % uint32_t(fp32.model.vocab_size));
    targets[i] = int32_t((i * 40503u + 7) % uint32_t(fp32.model.vocab_size));
  }
  for (const char* precision : {"fp32", "bf16"}) {
    const RunConfig config = config_for("cuda", {std::string("train.gemm_precision=") + precision});
    float loss[2];
    for (const ModelGradients gradients : {ModelGradients::kHeld, ModelGradients::kNone}) {
      std::unique_ptr<Backend> be = make_backend(config);
      LlamaModel model(config.model, *be, batch, seq, PrecisionRecipe{}, SavedInputSharing::kShared,
                       1, gradients);
      model.init_weights(7);
      loss[gradients == ModelGradients::kNone] = model.forward_loss(tokens.data(), targets.data());
    }
    EXPECT_EQ(std::memcmp(&loss[0], &loss[1], sizeof(float)), 0)
        << precision << ": " << loss[0] << " (training model) against " << loss[1];
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuTraining, ::testing::Range(0, int(recipes().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(recipes()[size_t(info.param)].name);
                         });

}  // namespace
}  // namespace gnmr
