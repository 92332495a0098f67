// The run's GNMR controller (src/controller) as a training job makes and restores it, shared
// by the session and `gnmr train --check` (which makes it without a model, so a job's controller
// errors and warnings come before it queues).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "controller/controller.h"

namespace gnmr {

// Which start-up warnings make_run_controller logs: one rank of a job says them (kNone on the
// others), and `gnmr bench`, which runs its own --steps, leaves out those about train.steps.
enum class SettingsWarnings { kNone, kAllButTrainSteps, kAll };

// The controller of `config` for a job of `world_size` ranks: options it refuses are an
// Error(Config) naming the key, as is log.recovery_gap or the oracle (both measure recovery gaps
// on one rank's batches) under more than one rank. Settings that are valid one by one but
// together do nothing are warnings, as `warnings` says.
std::unique_ptr<Controller> make_run_controller(const RunConfig& config, int world_size,
                                                SettingsWarnings warnings);

// Restores `controller` from the controller.bin bytes of CHECKPOINT_DIR: an Error(Checkpoint)
// naming the file for damaged bytes or a state saved under other gnmr.* options.
void load_controller_state(Controller& controller, const std::vector<uint8_t>& state,
                           const std::string& checkpoint_dir);

}  // namespace gnmr
