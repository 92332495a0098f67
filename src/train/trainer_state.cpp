#include "train/trainer_state.h"

#include "util/error.h"

using nlohmann::json;

namespace gnmr {

namespace {

constexpr int kCheckpointFormat = 1;

}  // namespace

json trainer_state_to_json(const TrainerState& state) {
  return {{"format", kCheckpointFormat},
          {"step", state.step},
          {"tokens_seen", state.tokens_seen},
          {"consecutive_nonfinite", state.consecutive_nonfinite},
          {"skipped_steps", state.skipped_steps}};
}

TrainerState trainer_state_from_json(const std::string& text, const std::string& path) {
  json trainer = json::parse(text, nullptr, false);
  if (trainer.is_discarded() || trainer.value("format", 0) != kCheckpointFormat) {
    throw Error(ErrorKind::Checkpoint, path + ": missing or unsupported format");
  }
  TrainerState state;
  state.step = trainer.at("step");
  state.tokens_seen = trainer.at("tokens_seen");
  state.consecutive_nonfinite = trainer.at("consecutive_nonfinite");
  state.skipped_steps = trainer.at("skipped_steps");
  return state;
}

}  // namespace gnmr
