// dist.zero=1 (ZeRO-1, docs/DESIGN.md §7) end to end under mpirun: the same training as plain
// data parallelism on 2 and 3 ranks, the same routing, the same bits whether the reduce-scatter
// is bucketed and overlapped with backward or not, bit-exact resume on the same world, and
// checkpoints that move to another world size only through `gnmr checkpoint consolidate`.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "cli_fixture.h"
#include "train/safetensors.h"

namespace fs = std::filesystem;
using gnmr_test::run_gnmr;

namespace {

bool have_mpi() {
  return !std::string(GNMR_MPIEXEC).empty();
}

gnmr_test::CommandResult run_mpi(int ranks, const std::string& args) {
  return gnmr_test::run_gnmr_mpi(GNMR_MPIEXEC, ranks, args);
}

// 6 steps of the tiny model; 384 tokens split over 2 ranks (3 micro-steps) and 3 (2). The gnmr
// controller keeps a history from step 1 and decides from step 3, so units get routed. Buckets
// of 0.05 MiB (13107 floats): each layer of the tiny model is several, so ZeRO-1 reduce-scatters
// many buckets during backward, some inside a shard and some across a shard edge.
std::string zero_config(const std::string& dir) {
  return gnmr_test::write_tiny_config(dir, R"({
    "dist": {"bucket_mb": 0.05},
    "train": {"steps": 6, "threads": 1, "micro_batch": 2, "global_batch_tokens": 384},
    "precision": {"recipe": "actq", "low_bits": 4, "recovery_bits": 8},
    "gnmr": {"controller": "gnmr", "max_active": 0.25, "alpha": 1.0, "beta": 1.0, "window": 2,
             "lock_steps": 1, "warmup_steps": 2, "history_start": 1},
    "eval": {"every": 0, "tokens": 256}, "checkpoint": {"every": 3, "keep": 5},
    "log": {"every": 1}})");
}

std::vector<nlohmann::json> train_lines(const std::string& run_dir) {
  std::vector<nlohmann::json> lines;
  for (const auto& l : gnmr_test::read_metrics(run_dir + "/metrics.jsonl")) {
    if (l["kind"] == "train") lines.push_back(l);
  }
  return lines;
}

// The routing a step ran with and what the controller decided from its norms.
nlohmann::json routing_fields(const nlohmann::json& line) {
  nlohmann::json r;
  for (const char* key : {"units_recovery", "active_units", "candidate_units", "gnmr_exceedances",
                          "delta_exceedances", "switches"}) {
    r[key] = line.at(key);
  }
  return r;
}

std::vector<float> all_weights(const std::string& checkpoint) {
  gnmr::SafetensorsFile file(checkpoint + "/model.safetensors");
  std::vector<float> all, one;
  for (const std::string& name : file.names()) {
    int64_t n = 1;
    for (int64_t d : file.shape(name)) n *= d;
    one.resize(size_t(n));
    file.read_f32(name, file.shape(name), one.data());
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

std::string train_args(const std::string& config, const std::string& out, int zero) {
  return "train --config " + config + " --out " + out + " --set dist.zero=" + std::to_string(zero);
}

}  // namespace

TEST(CliZero, MatchesPlainDataParallelWithTheSameRoutingOnTwoAndThreeRanks) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  const std::string dir = gnmr_test::scratch_dir("cli_zero_vs_plain");
  const std::string config = zero_config(dir);
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const std::string plain = dir + "/plain" + std::to_string(ranks);
    const std::string zero = dir + "/zero" + std::to_string(ranks);
    auto a = run_mpi(ranks, train_args(config, plain, 0));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    auto b = run_mpi(ranks, train_args(config, zero, 1));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("optimizer state: "), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("ZeRO-1: shard of"), std::string::npos) << b.output;
    const auto plain_lines = train_lines(plain), zero_lines = train_lines(zero);
    ASSERT_EQ(plain_lines.size(), 6u);
    ASSERT_EQ(zero_lines.size(), 6u);
    int routed = 0;
    for (size_t s = 0; s < plain_lines.size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(s + 1));
      EXPECT_EQ(routing_fields(zero_lines[s]), routing_fields(plain_lines[s]));
      routed += zero_lines[s]["units_recovery"].get<int>();
      const double plain_loss = plain_lines[s]["loss"], zero_loss = zero_lines[s]["loss"];
      const double plain_norm = plain_lines[s]["grad_norm"], zero_norm = zero_lines[s]["grad_norm"];
      if (ranks == 2) {
        // Two addends sum to the same bits in either order, so the gradients equal the
        // plain path's; only the squared norm of a parameter cut by the shard boundary is
        // added in another order (two partial doubles), ~1e-16 relative.
        EXPECT_EQ(zero_loss, plain_loss);
        EXPECT_NEAR(zero_norm, plain_norm, 1e-12 * plain_norm);
      } else {
        // Three addends: rank order here, MPI's order in the plain path, so gradients may
        // differ in the last bit (2^-23 relative) and the weights after them; six steps of
        // that move the loss by far less than 1e-5 relative.
        EXPECT_NEAR(zero_loss, plain_loss, 1e-5 * plain_loss);
        EXPECT_NEAR(zero_norm, plain_norm, 1e-4 * plain_norm);
      }
    }
    EXPECT_GT(routed, 0) << "the controller never routed a unit: the routing check is vacuous";
    const auto plain_weights = all_weights(plain + "/checkpoints/step_00000006");
    const auto zero_weights = all_weights(zero + "/checkpoints/step_00000006");
    ASSERT_EQ(plain_weights.size(), zero_weights.size());
    if (ranks == 2) {
      EXPECT_EQ(zero_weights, plain_weights);
    } else {
      // AdamW moves a weight by about lr (3e-3) per step whatever the gradient's size, so a
      // gradient element near zero whose last bit differs can change one weight by up to
      // ~2 lr per step; everywhere else the difference stays at fp32 rounding.
      double max_diff = 0;
      for (size_t i = 0; i < plain_weights.size(); ++i) {
        max_diff = std::max(max_diff, double(std::fabs(zero_weights[i] - plain_weights[i])));
      }
      EXPECT_LT(max_diff, 2 * 3e-3 * 6);
    }
  }
}

// ZeRO-1 with the reduce-scatter of each bucket overlapped with backward against one
// reduce-scatter after it: the same rank-order sum per element (mpi_pending_reduce_scatters.h),
// so the same bits on any world size: losses, norms, routing, weights and optimizer shards. (The
// test above compares the bucketed ZeRO-1 run with plain data parallelism.)
TEST(CliZero, BucketedReduceScatterTrainsTheUnbucketedBitsOnTwoAndThreeRanks) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  const std::string dir = gnmr_test::scratch_dir("cli_zero_buckets");
  const std::string config = zero_config(dir);
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const std::string once = dir + "/once" + std::to_string(ranks);
    const std::string bucketed = dir + "/bucketed" + std::to_string(ranks);
    auto a = run_mpi(ranks, train_args(config, once, 1) + " --set dist.bucket_mb=0");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    auto b = run_mpi(ranks, train_args(config, bucketed, 1));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    const std::string said = "gradient reduce-scatter over " + std::to_string(ranks) + " ranks: ";
    const size_t at = b.output.find(said);
    ASSERT_NE(at, std::string::npos) << b.output;
    EXPECT_GT(std::stoi(b.output.substr(at + said.size())), 2) << b.output;
    EXPECT_EQ(a.output.find(said), std::string::npos) << a.output;
    const auto once_lines = train_lines(once), bucketed_lines = train_lines(bucketed);
    ASSERT_EQ(once_lines.size(), 6u);
    ASSERT_EQ(bucketed_lines.size(), 6u);
    int routed = 0;
    for (size_t s = 0; s < once_lines.size(); ++s) {
      EXPECT_EQ(gnmr_test::without_timing(bucketed_lines[s]),
                gnmr_test::without_timing(once_lines[s]))
          << "step " << s + 1;
      routed += once_lines[s]["units_recovery"].get<int>();
    }
    EXPECT_GT(routed, 0) << "the controller never routed a unit: the routing check is vacuous";
    const std::string step6 = "/checkpoints/step_00000006/";
    EXPECT_TRUE(gnmr_test::read_bytes(once + step6 + "model.safetensors") ==
                gnmr_test::read_bytes(bucketed + step6 + "model.safetensors"));
    for (int r = 0; r < ranks; ++r) {
      const std::string shard =
          "optimizer.shard_" + std::to_string(r) + "_of_" + std::to_string(ranks) + ".safetensors";
      EXPECT_TRUE(gnmr_test::read_bytes(once + step6 + shard) ==
                  gnmr_test::read_bytes(bucketed + step6 + shard))
          << shard;
    }
  }
}

TEST(CliZero, ResumesBitExactOnTheSameWorldAndMovesWorldsOnlyWhenConsolidated) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI (GNMR_MPI=OFF)";
  const std::string dir = gnmr_test::scratch_dir("cli_zero_resume");
  const std::string config = zero_config(dir);
  const std::string whole = dir + "/whole", split = dir + "/split";
  auto uninterrupted = run_mpi(2, train_args(config, whole, 1));
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  auto first = run_mpi(2, train_args(config, split, 1) + " --stop-at 3");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string step3 = split + "/checkpoints/step_00000003";
  EXPECT_TRUE(fs::exists(step3 + "/optimizer_shards.json"));
  EXPECT_TRUE(fs::exists(step3 + "/optimizer.shard_1_of_2.safetensors"));
  EXPECT_FALSE(fs::exists(step3 + "/optimizer.safetensors"));
  auto second = run_mpi(2, train_args(config, split, 1) + " --resume auto");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(gnmr_test::read_bytes(split + "/checkpoints/step_00000006/model.safetensors"),
            gnmr_test::read_bytes(whole + "/checkpoints/step_00000006/model.safetensors"));
  EXPECT_EQ(gnmr_test::read_bytes(split +
                                  "/checkpoints/step_00000006/optimizer.shard_0_of_2.safetensors"),
            gnmr_test::read_bytes(whole +
                                  "/checkpoints/step_00000006/optimizer.shard_0_of_2.safetensors"));
  const auto whole_lines = train_lines(whole), split_lines = train_lines(split);
  ASSERT_EQ(split_lines.size(), whole_lines.size());
  for (size_t s = 0; s < whole_lines.size(); ++s) {
    EXPECT_EQ(gnmr_test::without_timing(split_lines[s]), gnmr_test::without_timing(whole_lines[s]));
  }

  // Another world size, or the plain optimizer, is refused with both sizes and the fix.
  auto three = run_mpi(3, train_args(config, dir + "/three", 1) + " --resume " + step3);
  EXPECT_EQ(three.exit_code, 5) << three.output;
  EXPECT_NE(three.output.find("sharded over 2 ranks; this run has 3 rank(s)"), std::string::npos)
      << three.output;
  EXPECT_NE(three.output.find("gnmr checkpoint consolidate " + step3), std::string::npos)
      << three.output;
  auto plain = run_gnmr(train_args(config, dir + "/plain", 0) + " --resume " + step3);
  EXPECT_EQ(plain.exit_code, 5) << plain.output;
  EXPECT_NE(plain.output.find("consolidate"), std::string::npos) << plain.output;

  // Consolidated, it resumes on 3 ranks under ZeRO-1 and on 1 without, and exports.
  auto consolidate = run_gnmr("checkpoint consolidate " + split);  // the run's newest: step 6
  ASSERT_EQ(consolidate.exit_code, 0) << consolidate.output;
  auto early = run_gnmr("checkpoint consolidate " + step3);
  ASSERT_EQ(early.exit_code, 0) << early.output;
  const std::string consolidated = step3 + "_consolidated";
  // The sharded one refused again, the way on is the copy beside it (it once said to
  // consolidate again, which an existing copy refuses).
  auto beside = run_gnmr(train_args(config, dir + "/plain_again", 0) + " --resume " + step3);
  EXPECT_EQ(beside.exit_code, 5) << beside.output;
  EXPECT_NE(beside.output.find("Its consolidated copy exists: resume from it under any world "
                               "size with --resume " +
                               consolidated),
            std::string::npos)
      << beside.output;
  EXPECT_TRUE(fs::exists(consolidated + "/optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(split + "/checkpoints/step_00000006_consolidated/optimizer.safetensors"));
  // Never overwrites. A trailing slash names the same checkpoint (it once put the copy at
  // step_N/_consolidated, inside the checkpoint that keep= later removes).
  auto again = run_gnmr("checkpoint consolidate " + step3 + "/");
  EXPECT_EQ(again.exit_code, 5) << again.output;  // as export's existing --out
  EXPECT_NE(again.output.find(consolidated + " already exists"), std::string::npos) << again.output;
  EXPECT_FALSE(fs::exists(step3 + "/_consolidated"));
  // An --out with a trailing slash once made the folder, then refused to replace it.
  auto slash = run_gnmr("checkpoint consolidate " + step3 + " --out " + dir + "/co/");
  EXPECT_EQ(slash.exit_code, 0) << slash.output;
  EXPECT_TRUE(fs::exists(dir + "/co/optimizer.safetensors"));
  auto on_three =
      run_mpi(3, train_args(config, dir + "/three_ok", 1) + " --resume " + consolidated);
  ASSERT_EQ(on_three.exit_code, 0) << on_three.output;
  EXPECT_EQ(train_lines(dir + "/three_ok").size(), 3u);
  auto on_one = run_gnmr(train_args(config, dir + "/one_ok", 0) + " --resume " + consolidated);
  ASSERT_EQ(on_one.exit_code, 0) << on_one.output;
  // The consolidated moments are the shards' moments: the plain resume on 2 ranks continues
  // exactly as the sharded one did (two-rank sums are the same bits, see the test above).
  auto on_two_plain =
      run_mpi(2, train_args(config, dir + "/two_plain", 0) + " --resume " + consolidated);
  ASSERT_EQ(on_two_plain.exit_code, 0) << on_two_plain.output;
  EXPECT_EQ(all_weights(dir + "/two_plain/checkpoints/step_00000006"),
            all_weights(whole + "/checkpoints/step_00000006"));
  auto exported = run_gnmr("export --checkpoint " + consolidated + " --out " + dir + "/hf/");
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_TRUE(fs::exists(dir + "/hf/model.safetensors"));
  auto exported_sharded = run_gnmr("export --checkpoint " + step3 + " --out " + dir + "/hf2");
  EXPECT_EQ(exported_sharded.exit_code, 0) << exported_sharded.output;
}

TEST(CliZero, OneRankIsTheSameRunAsWithoutZero) {
  const std::string dir = gnmr_test::scratch_dir("cli_zero_one_rank");
  const std::string config = zero_config(dir);
  auto plain = run_gnmr(train_args(config, dir + "/plain", 0) + " --set train.steps=3");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  auto zero = run_gnmr(train_args(config, dir + "/zero", 1) + " --set train.steps=3");
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/zero/checkpoints/step_00000003/model.safetensors"),
            gnmr_test::read_bytes(dir + "/plain/checkpoints/step_00000003/model.safetensors"));
  const auto plain_lines = train_lines(dir + "/plain"), zero_lines = train_lines(dir + "/zero");
  ASSERT_EQ(zero_lines.size(), plain_lines.size());
  for (size_t s = 0; s < zero_lines.size(); ++s) {
    EXPECT_EQ(gnmr_test::without_timing(zero_lines[s]), gnmr_test::without_timing(plain_lines[s]));
  }
  auto bad = run_gnmr(train_args(config, dir + "/bad", 2));
  EXPECT_EQ(bad.exit_code, 3) << bad.output;
  EXPECT_NE(bad.output.find("dist.zero"), std::string::npos) << bad.output;
}
