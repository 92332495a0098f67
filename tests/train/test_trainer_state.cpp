// trainer.json: the counters round-trip, and every damaged record found by the fuzz target
// (tests/fuzz/fuzz_trainer_json.cpp) is a Checkpoint error naming the field.
#include <gtest/gtest.h>

#include "expect_error.h"
#include "train/trainer_state.h"

using gnmr::ErrorKind;
using gnmr::trainer_state_from_json;
using gnmr::TrainerState;

namespace {

void expect_damaged(const std::string& text, const std::string& needle) {
  gnmr_test::expect_error([&] { trainer_state_from_json(text, "ckpt/trainer.json"); },
                          ErrorKind::Checkpoint, {"ckpt/trainer.json", needle});
}

}  // namespace

TEST(TrainerState, RoundTripsEveryCounter) {
  TrainerState state;
  state.step = 9'000'000'000;
  state.tokens_seen = 123'456'789'012;
  state.consecutive_nonfinite = 2;
  state.skipped_steps = 7;
  const TrainerState back =
      trainer_state_from_json(gnmr::trainer_state_to_json(state).dump(), "trainer.json");
  EXPECT_EQ(back.step, state.step);
  EXPECT_EQ(back.tokens_seen, state.tokens_seen);
  EXPECT_EQ(back.consecutive_nonfinite, state.consecutive_nonfinite);
  EXPECT_EQ(back.skipped_steps, state.skipped_steps);
}

// Found by fuzz_trainer_json: a missing counter escaped as a json::out_of_range (exit 1).
TEST(TrainerState, MissingCounterIsACheckpointErrorNamingIt) {
  expect_damaged("{\"format\": 1, \"step\": 200}\n", "\"tokens_seen\"");
}

TEST(TrainerState, NonObjectOrWrongFormatIsACheckpointError) {
  expect_damaged("[1]", "not a JSON object");
  expect_damaged("7", "not a JSON object");
  expect_damaged("{\"format\": \"1\"}", "unsupported format \"1\"");
  expect_damaged("{\"format\": 2}", "unsupported format 2");
  expect_damaged("{}", "unsupported format (none)");
}

TEST(TrainerState, CounterOfWrongTypeOrRangeIsACheckpointErrorNamingIt) {
  const std::string rest =
      ", \"tokens_seen\": 0, \"consecutive_nonfinite\": 0, \"skipped_steps\": 0}";
  expect_damaged("{\"format\": 1, \"step\": \"200\"" + rest, "\"step\" must be an integer");
  expect_damaged("{\"format\": 1, \"step\": 2.5" + rest, "\"step\" must be an integer");
  expect_damaged("{\"format\": 1, \"step\": 1e300" + rest, "\"step\" must be an integer");
  expect_damaged("{\"format\": 1, \"step\": -1" + rest, "got -1");
  expect_damaged("{\"format\": 1, \"step\": 9223372036854775808" + rest, "\"step\"");
  expect_damaged(
      "{\"format\": 1, \"step\": 1, \"tokens_seen\": 0, \"consecutive_nonfinite\": 4294967296, "
      "\"skipped_steps\": 0}",
      "\"consecutive_nonfinite\"");
}
