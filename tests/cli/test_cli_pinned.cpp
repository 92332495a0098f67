// Pinned results: the tiny model trained 30 steps under every precision recipe, with the
// static_low controller and with gnmr, must give the same final weights and the same loss at
// every step as when these hashes were recorded. A refactor of the model, the backend seam or
// the controller that is meant to change no arithmetic must leave every row passing.
//
// The hashes are of this CPU build: the GEMMs run on OpenBLAS's generic x86-64 kernel
// (OPENBLAS_CORETYPE=Prescott, autotune off) on 2 threads so that the machine's own kernel
// choice does not enter. A change that is meant to alter the arithmetic (a new rounding, a new
// reduction order) re-records them: run with GNMR_PINNED_PRINT=1 and copy the printed rows.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>

#include "cli_fixture.h"
#include "util/fnv1a.h"

using gnmr_test::run_gnmr;

namespace {

uint64_t fnv1a_of(const std::string& bytes) {
  return gnmr::fnv1a(bytes.data(), bytes.size());
}

std::string hex(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

struct PinnedRun {
  const char* recipe;      // the precision section
  const char* controller;  // "static_low" or "gnmr"
  const char* weights;     // fnv1a of the final model.safetensors
  const char* losses;      // fnv1a of the 30 train losses, each as "%.9g\n"
};

const char* recipe_json(const std::string& name) {
  if (name == "fp32") return R"({"recipe": "fp32"})";
  if (name == "bf16") return R"({"recipe": "bf16"})";
  if (name == "actq") return R"({"recipe": "actq", "low_bits": 4, "recovery_bits": 8})";
  if (name == "actq-sr")
    return R"({"recipe": "actq", "low_bits": 4, "recovery_bits": 8, "stochastic_rounding": true})";
  if (name == "fp8mix")
    return R"({"recipe": "fp8mix", "low_format": "e3m2", "recovery_format": "e4m3"})";
  if (name == "fp8mix-fp4")
    return R"({"recipe": "fp8mix", "low_format": "e2m1", "recovery_format": "e4m3"})";
  if (name == "int8") return R"({"recipe": "int8"})";
  return nullptr;
}

// gnmr with a history from step 1 and decisions from step 6, so 30 steps route units.
const char* controller_json(const std::string& name) {
  if (name == "static_low") return R"({"controller": "static_low"})";
  return R"({"controller": "gnmr", "max_active": 0.25, "alpha": 1.0, "beta": 1.0, "window": 4,
             "lock_steps": 3, "warmup_steps": 6, "history_start": 1})";
}

struct Hashes {
  std::string weights, losses;
};

Hashes run_and_hash(const std::string& recipe, const std::string& controller) {
  std::string dir = gnmr_test::scratch_dir("cli_pinned_" + recipe + "_" + controller);
  std::string extra = std::string(R"({"precision": )") + recipe_json(recipe) + R"(, "gnmr": )" +
                      controller_json(controller) +
                      R"(, "train": {"steps": 30, "threads": 2, "gemm_precision": ")" +
                      (recipe == "bf16" ? "bf16" : "fp32") +
                      R"("}, "eval": {"every": 0}, "checkpoint": {"every": 30, "keep": 1},
                          "log": {"every": 1}})";
  std::string config = gnmr_test::write_tiny_config(dir, extra);
  auto r = run_gnmr("train --config " + config + " --out " + dir + "/run",
                    "GNMR_BLAS_AUTOTUNE=0 OPENBLAS_CORETYPE=Prescott OPENBLAS_NUM_THREADS=2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  Hashes got;
  got.weights = hex(
      fnv1a_of(gnmr_test::read_bytes(dir + "/run/checkpoints/step_00000030/model.safetensors")));
  std::string loss_text;
  int train_lines = 0;
  for (const auto& line : gnmr_test::read_metrics(dir + "/run/metrics.jsonl")) {
    if (line.value("kind", "") != "train") continue;
    char s[32];
    std::snprintf(s, sizeof s, "%.9g\n", line.at("loss").get<double>());
    loss_text += s;
    ++train_lines;
  }
  EXPECT_EQ(train_lines, 30) << recipe << " / " << controller;
  got.losses = hex(fnv1a_of(loss_text));
  return got;
}

// Recorded at the commit before the GPU-ready seam (issue 10).
const PinnedRun kPinned[] = {
#include "pinned_runs.inc"
};

void PrintTo(const PinnedRun& run, std::ostream* os) {
  *os << run.recipe << " / " << run.controller;
}

class CliPinned : public ::testing::TestWithParam<PinnedRun> {};

TEST_P(CliPinned, WeightsAndLossesMatchTheRecordedRun) {
  const PinnedRun& want = GetParam();
  Hashes got = run_and_hash(want.recipe, want.controller);
  if (std::getenv("GNMR_PINNED_PRINT")) {
    std::printf("    {\"%s\", \"%s\", \"%s\", \"%s\"},\n", want.recipe, want.controller,
                got.weights.c_str(), got.losses.c_str());
  }
  EXPECT_EQ(got.weights, want.weights)
      << want.recipe << " / " << want.controller << ": final weights";
  EXPECT_EQ(got.losses, want.losses) << want.recipe << " / " << want.controller << ": losses";
}

std::string run_name(const ::testing::TestParamInfo<PinnedRun>& info) {
  std::string name = std::string(info.param.recipe) + "_" + info.param.controller;
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(EveryRecipe, CliPinned, ::testing::ValuesIn(kPinned), run_name);

}  // namespace
