// Fuzz target: reading a checkpoint's trainer.json (src/train/trainer_state.cpp). The input
// is the file's text. Every failure must be an Error(Checkpoint); a record that parses must
// write back to the same record.
#include <cstdint>
#include <string>

#include "fuzz_scratch.h"
#include "train/trainer_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    gnmr::TrainerState state = gnmr::trainer_state_from_json(text, "trainer.json");
    const std::string written = gnmr::trainer_state_to_json(state).dump();
    gnmr::TrainerState again = gnmr::trainer_state_from_json(written, "trainer.json");
    if (again.step != state.step || again.tokens_seen != state.tokens_seen ||
        again.consecutive_nonfinite != state.consecutive_nonfinite ||
        again.skipped_steps != state.skipped_steps || again.world_size != state.world_size) {
      __builtin_trap();
    }
  } catch (const gnmr::Error& e) {
    gnmr_fuzz::check_error(e, gnmr::ErrorKind::Checkpoint);
  }
  return 0;
}
