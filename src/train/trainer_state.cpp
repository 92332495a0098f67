#include "train/trainer_state.h"

#include <limits>

#include "util/error.h"
#include "util/json_integer.h"

using nlohmann::json;

namespace gnmr {

namespace {

constexpr int kCheckpointFormat = 1;

// trainer[key] as an integer in [0, max]; anything else (absent, a string, a fraction, a
// negative or too large count) names the field.
int64_t counter(const json& trainer, const char* key, int64_t max, const std::string& path) {
  const auto it = trainer.find(key);
  const std::optional<int64_t> value = it != trainer.end() ? json_int64(*it) : std::nullopt;
  if (!value || *value < 0 || *value > max) {
    throw Error(ErrorKind::Checkpoint,
                path + ": \"" + key + "\" must be an integer in [0, " + std::to_string(max) +
                    "], got " + (it == trainer.end() ? std::string("nothing") : it->dump()));
  }
  return *value;
}

}  // namespace

json trainer_state_to_json(const TrainerState& state) {
  return {{"format", kCheckpointFormat},
          {"step", state.step},
          {"tokens_seen", state.tokens_seen},
          {"consecutive_nonfinite", state.consecutive_nonfinite},
          {"skipped_steps", state.skipped_steps},
          {"world_size", state.world_size},
          {"numerics", state.numerics},
          {"data", state.data}};
}

TrainerState trainer_state_from_json(const std::string& text, const std::string& path) {
  const json trainer = json::parse(text, nullptr, false);
  if (trainer.is_discarded() || !trainer.is_object()) {
    throw Error(ErrorKind::Checkpoint, path + ": not a JSON object (damaged checkpoint?)");
  }
  const auto format = trainer.find("format");
  if (format == trainer.end() || *format != kCheckpointFormat) {
    throw Error(ErrorKind::Checkpoint,
                path + ": missing or unsupported format " +
                    (format == trainer.end() ? std::string("(none)") : format->dump()) +
                    " (this build reads " + std::to_string(kCheckpointFormat) + ")");
  }
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  TrainerState state;
  state.step = counter(trainer, "step", kInt64Max, path);
  state.tokens_seen = counter(trainer, "tokens_seen", kInt64Max, path);
  state.consecutive_nonfinite = static_cast<int>(
      counter(trainer, "consecutive_nonfinite", std::numeric_limits<int>::max(), path));
  state.skipped_steps = counter(trainer, "skipped_steps", kInt64Max, path);
  if (trainer.contains("world_size")) {
    state.world_size = counter(trainer, "world_size", std::numeric_limits<int>::max(), path);
  }
  if (const auto numerics = trainer.find("numerics");
      numerics != trainer.end() && numerics->is_string()) {
    state.numerics = numerics->get<std::string>();
  }
  if (const auto data = trainer.find("data"); data != trainer.end() && data->is_string()) {
    state.data = data->get<std::string>();
  }
  return state;
}

}  // namespace gnmr
