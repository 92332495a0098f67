// Controller state round trip (the controller's part of a checkpoint): a restored controller
// continues bit-exactly, and a blob from another model/options or a damaged one is refused.
#include <gtest/gtest.h>

#include <string>

#include "controller/controller.h"
#include "controller_test_util.h"
#include "util/fnv1a.h"

namespace gnmr {
namespace {

using testing::all_controllers;
using testing::quick_options;
using testing::same_bits;

constexpr int kLayers = 3;
constexpr int kUnits = 21;

std::string error_of(Controller& c, const std::vector<uint8_t>& blob) {
  try {
    c.load_state(blob);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

void expect_same_step(const StepTelemetry& a, const StepTelemetry& b, int step) {
  EXPECT_EQ(a.metrics_fields(), b.metrics_fields()) << step;
  ASSERT_EQ(a.units.size(), b.units.size());
  for (size_t u = 0; u < a.units.size(); ++u) {
    EXPECT_TRUE(same_bits(a.units[u].gnmr, b.units[u].gnmr)) << step << " unit " << u;
    EXPECT_TRUE(same_bits(a.units[u].delta, b.units[u].delta)) << step << " unit " << u;
    EXPECT_TRUE(same_bits(a.units[u].risk, b.units[u].risk)) << step << " unit " << u;
    EXPECT_EQ(a.units[u].lock, b.units[u].lock);
    EXPECT_EQ(a.units[u].path, b.units[u].path);
  }
}

std::vector<ControllerOptions> variants() {
  std::vector<ControllerOptions> list;
  for (const std::string& controller : all_controllers()) {
    list.push_back(quick_options(controller, 3));
  }
  ControllerOptions o = quick_options("gnmr", 0.3);
  o.granularity = "group";
  o.history = "capped";
  o.threshold_schedule = "cosine";
  o.schedule_steps = 80;
  o.alpha_final = 1.1;
  o.window = 5;
  o.lock_steps = 7;
  o.warmup_steps = 12;
  o.per_kind_cap = {{"down", 1}};
  list.push_back(o);
  // history_start: one run saved mid-history (from step 20), one saved before its history
  // starts (at 60) so the restored controller crosses history_start itself.
  for (int64_t history_start : {20, 60}) {
    ControllerOptions late = quick_options("gnmr", 3);
    late.history_start = history_start;
    list.push_back(late);
  }
  return list;
}

TEST(ControllerState, RunOf100EqualsRunOf50SavedLoadedAndRunAnother50) {
  const auto stream = testing::noisy_stream(kUnits, 100, 5);
  for (const ControllerOptions& o : variants()) {
    SCOPED_TRACE(controller_options_to_json(o).dump());
    Controller straight(o, kLayers), before(o, kLayers), after(o, kLayers);
    for (int step = 0; step < 50; ++step) {
      straight.observe(step, stream[step]);
      before.observe(step, stream[step]);
    }
    const std::vector<uint8_t> blob = before.save_state();
    after.load_state(blob);
    EXPECT_EQ(after.save_state(), blob);
    EXPECT_EQ(after.current_plan(), straight.current_plan());
    for (int step = 50; step < 100; ++step) {
      ASSERT_EQ(after.observe(step, stream[step]), straight.observe(step, stream[step])) << step;
      expect_same_step(after.last_telemetry(), straight.last_telemetry(), step);
    }
    EXPECT_EQ(after.summary(), straight.summary());
    EXPECT_EQ(after.save_state(), straight.save_state());
    EXPECT_THROW(after.observe(99, stream[0]), std::invalid_argument);  // step restored too
  }
}

TEST(ControllerState, LoadRefusesOtherUnitCountsOtherOptionsAndDamagedBlobs) {
  Controller source(quick_options(), kLayers);
  const auto stream = testing::noisy_stream(kUnits, 10, 9);
  for (int step = 0; step < 10; ++step) source.observe(step, stream[step]);
  const std::vector<uint8_t> blob = source.save_state();

  Controller smaller(quick_options(), 2);
  EXPECT_NE(error_of(smaller, blob).find("made for 3 layers (21 units, 21 decision units)"),
            std::string::npos)
      << error_of(smaller, blob);

  ControllerOptions other = quick_options();
  other.granularity = "group";  // other decision units: named as the option, not as a count
  Controller grouped(other, kLayers);
  EXPECT_NE(error_of(grouped, blob).find("gnmr.granularity differs"), std::string::npos)
      << error_of(grouped, blob);

  other = quick_options();
  other.alpha = 2.0;
  Controller other_alpha(other, kLayers);
  EXPECT_NE(error_of(other_alpha, blob).find("gnmr.alpha differs"), std::string::npos)
      << error_of(other_alpha, blob);

  other = quick_options();
  other.history_start = 4;
  Controller other_start(other, kLayers);
  EXPECT_NE(error_of(other_start, blob).find("gnmr.history_start differs (state 0, config 4)"),
            std::string::npos)
      << error_of(other_start, blob);
  Controller late_source(other, kLayers);
  for (int step = 0; step < 10; ++step) late_source.observe(step, stream[step]);
  Controller from_start(quick_options(), kLayers);
  EXPECT_NE(error_of(from_start, late_source.save_state()).find("gnmr.history_start differs"),
            std::string::npos);

  Controller target(quick_options(), kLayers);
  std::vector<uint8_t> flipped = blob;
  flipped[flipped.size() / 2] ^= 0x10;
  EXPECT_NE(error_of(target, flipped).find("checksum"), std::string::npos);
  std::vector<uint8_t> truncated(blob.begin(), blob.begin() + blob.size() / 2);
  EXPECT_NE(error_of(target, truncated), "");
  EXPECT_NE(error_of(target, {}).find("bad magic"), std::string::npos);
  // A refused load leaves the controller untouched.
  EXPECT_EQ(target.save_state(), Controller(quick_options(), kLayers).save_state());
}

TEST(ControllerState, DamagedBlobsAreToldApartFromOtherOptions) {
  Controller source(quick_options(), kLayers);
  const auto stream = testing::noisy_stream(kUnits, 10, 9);
  for (int step = 0; step < 10; ++step) source.observe(step, stream[step]);
  const std::vector<uint8_t> blob = source.save_state();

  std::vector<uint8_t> flipped = blob, bad_magic = blob;
  flipped[flipped.size() / 3] ^= 0x01;
  bad_magic[0] = 'X';
  const std::vector<uint8_t> truncated(blob.begin(), blob.end() - 9);
  Controller target(quick_options(), kLayers);
  for (const auto& damaged : {flipped, bad_magic, truncated, std::vector<uint8_t>{}}) {
    EXPECT_THROW(target.load_state(damaged), ControllerStateDamaged);
  }
  // An intact blob of another format version (the u32 after the magic; checksum redone) is not
  // called damaged: resuming from an earlier checkpoint would not help.
  std::vector<uint8_t> version_2(blob.begin(), blob.end() - 8);
  version_2[8] = 2;
  const uint64_t checksum = fnv1a(version_2.data(), version_2.size());
  for (int i = 0; i < 8; ++i) version_2.push_back(static_cast<uint8_t>(checksum >> (8 * i)));
  EXPECT_THROW(target.load_state(version_2), ControllerStateVersion);
  EXPECT_NE(error_of(target, version_2).find("format version 2, this build reads version 1"),
            std::string::npos)
      << error_of(target, version_2);

  ControllerOptions other = quick_options();
  other.granularity = "group";  // other decision units: named as the option, not as a count
  Controller grouped(other, kLayers);
  EXPECT_NE(error_of(grouped, blob).find("gnmr.granularity differs"), std::string::npos)
      << error_of(grouped, blob);

  other = quick_options();
  other.alpha = 2.0;
  Controller other_alpha(other, kLayers);
  EXPECT_THROW(other_alpha.load_state(blob), ControllerStateMismatch);
  Controller smaller(quick_options(), 2);
  EXPECT_THROW(smaller.load_state(blob), ControllerStateMismatch);
}

// Found by fuzz_controller_state: the "made for N layers (7N units)" message computed 7N in
// int, which overflowed (UB) for a damaged layer count.
TEST(ControllerState, HugeLayerCountInADamagedBlobIsRefusedByName) {
  Controller source(quick_options(), kLayers);
  std::vector<uint8_t> blob = source.save_state();
  uint64_t options_size = 0;
  for (int i = 0; i < 8; ++i) options_size |= static_cast<uint64_t>(blob[12 + i]) << (8 * i);
  const size_t n_layers_at = 20 + options_size;  // magic, version, length, options
  for (int i = 0; i < 4; ++i) blob[n_layers_at + i] = i == 3 ? 0x7f : 0xff;  // INT32_MAX
  blob.resize(blob.size() - 8);
  const uint64_t checksum = fnv1a(blob.data(), blob.size());
  for (int i = 0; i < 8; ++i) blob.push_back(static_cast<uint8_t>(checksum >> (8 * i)));
  Controller target(quick_options(), kLayers);
  EXPECT_NE(error_of(target, blob).find("made for 2147483647 layers (15032385529 units"),
            std::string::npos)
      << error_of(target, blob);
}

// The blob as a build from before `key` existed wrote it: the key dropped from the options
// record, length and checksum redone (layout: controller_state.cpp).
std::vector<uint8_t> without_option(const std::vector<uint8_t>& blob, const std::string& key) {
  auto u64_at = [&blob](size_t pos) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(blob[pos + i]) << (8 * i);
    return v;
  };
  auto put_u64 = [](std::vector<uint8_t>& out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  constexpr size_t kHeader = 8 + 4;  // magic, version
  const size_t options_size = u64_at(kHeader);
  const size_t options_begin = kHeader + 8;
  nlohmann::json options = nlohmann::json::parse(blob.begin() + options_begin,
                                                 blob.begin() + options_begin + options_size);
  EXPECT_EQ(options.erase(key), 1u);
  const std::string text = options.dump();
  std::vector<uint8_t> out(blob.begin(), blob.begin() + kHeader);
  put_u64(out, text.size());
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), blob.begin() + options_begin + options_size, blob.end() - 8);
  put_u64(out, fnv1a(out.data(), out.size()));
  return out;
}

TEST(ControllerState, StateFromBeforeHistoryStartExistedLoadsOnlyWithTheDefault) {
  Controller source(quick_options(), kLayers);
  const auto stream = testing::noisy_stream(kUnits, 20, 3);
  for (int step = 0; step < 10; ++step) source.observe(step, stream[step]);
  const std::vector<uint8_t> old_blob = without_option(source.save_state(), "history_start");

  Controller resumed(quick_options(), kLayers);
  ASSERT_EQ(error_of(resumed, old_blob), "");
  EXPECT_EQ(resumed.save_state(), source.save_state());  // the key is written again
  for (int step = 10; step < 20; ++step) {
    ASSERT_EQ(resumed.observe(step, stream[step]), source.observe(step, stream[step])) << step;
  }

  ControllerOptions late = quick_options();
  late.history_start = 5;
  Controller other(late, kLayers);
  EXPECT_NE(error_of(other, old_blob)
                .find("gnmr.history_start differs (state absent, i.e. the default 0, config 5)"),
            std::string::npos)
      << error_of(other, old_blob);
}

}  // namespace
}  // namespace gnmr
