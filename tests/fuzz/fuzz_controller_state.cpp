// Fuzz target: Controller::load_state (src/controller/controller_state.cpp), the controller.bin
// of a checkpoint. The input is the blob without its trailing FNV-1a checksum, which the
// target appends, so the fuzzer gets past the checksum to the records behind it. A restored
// controller then observes three steps, which touches every restored record. Every
// failure must be std::invalid_argument (the trainer turns it into a Checkpoint error).
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "controller/controller.h"
#include "seed_options.h"
#include "util/fnv1a.h"

namespace {

constexpr int kLayers = 2;

// last_step from the blob layout (controller_state.cpp), or -1 when the blob is too short.
int64_t recorded_last_step(const std::vector<uint8_t>& blob) {
  uint64_t options_size = 0;
  if (blob.size() < 20) return -1;
  std::memcpy(&options_size, blob.data() + 12, 8);
  const uint64_t at = 20 + options_size + 12 + 8;
  if (options_size > blob.size() || at + 8 > blob.size()) return -1;
  int64_t last_step = 0;
  std::memcpy(&last_step, blob.data() + at, 8);
  return last_step;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> blob(data, data + size);
  const uint64_t checksum = gnmr::fnv1a(data, size);
  for (int i = 0; i < 8; ++i) blob.push_back(static_cast<uint8_t>(checksum >> (8 * i)));
  gnmr::Controller controller(seed_options(), kLayers);
  try {
    controller.load_state(blob);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const int64_t last_step = recorded_last_step(blob);
  if (last_step < 0 || last_step > (int64_t(1) << 40)) return 0;
  const std::vector<float> norms[3] = {
      std::vector<float>(controller.n_units(), 1.0f),
      std::vector<float>(controller.n_units(), 50.0f),
      std::vector<float>(controller.n_units(), __builtin_nanf("")),
  };
  for (int i = 0; i < 3; ++i) {
    gnmr::RoutingPlan plan = controller.observe(last_step + 1 + i, norms[i]);
    if (plan.path.size() != static_cast<size_t>(controller.n_units())) __builtin_trap();
  }
  return 0;
}
