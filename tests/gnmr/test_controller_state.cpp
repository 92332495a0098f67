// Controller state round trip (the controller's part of a checkpoint): a restored controller
// continues bit-exactly, and a blob from another model/options or a damaged one is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "controller_test_util.h"
#include "gnmr/controller.h"

namespace gnmr {
namespace {

using testing::all_controllers;
using testing::quick_options;

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

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
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
  EXPECT_NE(error_of(smaller, blob).find("made for 3 layers (21 units)"), std::string::npos)
      << error_of(smaller, blob);

  ControllerOptions other = quick_options();
  other.alpha = 2.0;
  Controller other_alpha(other, kLayers);
  EXPECT_NE(error_of(other_alpha, blob).find("gnmr.alpha differs"), std::string::npos)
      << error_of(other_alpha, blob);

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

}  // namespace
}  // namespace gnmr
