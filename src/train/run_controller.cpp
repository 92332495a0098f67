// make_run_controller and load_controller_state (run_controller.h).
#include "train/run_controller.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "controller/units.h"
#include "util/error.h"

namespace gnmr {

namespace {

// Settings that are valid one by one but together do nothing, or not what their names say:
// each is a warning at start, so a run that cannot do what it was set up to do says so.
void warn_about_settings_that_do_nothing(const RunConfig& config, const Controller& controller,
                                         bool about_train_steps) {
  const ControllerKind kind = controller.kind();
  const bool dynamic = kind != ControllerKind::StaticLow && kind != ControllerKind::StaticHigh;
  if (dynamic && config.precision.has_low_path) {
    int smallest = controller.n_units();
    for (int d = 0; d < controller.decision_units().n_decision_units(); ++d)
      smallest = std::min(smallest, int(controller.decision_units().members(d).size()));
    if (controller.budget() == 0 && config.gnmr.max_active > 0) {
      spdlog::warn(
          "gnmr.max_active {} of {} units rounds down to a budget of 0: the controller "
          "will recover nothing (give at least 1 unit)",
          config.gnmr.max_active, controller.n_units());
    } else if (controller.budget() > 0 && controller.budget() < smallest) {
      spdlog::warn(
          "gnmr.max_active gives a budget of {} unit(s), less than the smallest "
          "decision unit of gnmr.granularity {} ({} units): the controller will "
          "recover nothing",
          controller.budget(), config.gnmr.granularity, smallest);
    }
    // The plan made at step t runs at step t + 1 (the last plan of the run never runs), or at
    // step t itself for the oracle under gnmr.oracle_same_step (session.cpp's run_step).
    const ControllerOptions& g = config.gnmr;
    const bool same_step = kind == ControllerKind::Oracle && g.oracle_same_step;
    const int64_t last_planned = config.train.steps - (same_step ? 0 : 1);
    const int64_t first = controller.first_selecting_step();
    if (about_train_steps && controller.budget() > 0 && first > last_planned) {
      spdlog::warn(
          "gnmr: the controller can first select a unit at step {} (gnmr.warmup_steps {}{}), and "
          "a plan made at step t runs at step {}: in train.steps {} it will recover nothing",
          first, g.warmup_steps,
          first > std::max(g.warmup_steps, 1)  // the scores, not the warm-up, come last
              ? "; its scores need gnmr.history_start " + std::to_string(g.history_start) +
                    ", one norm of history and gnmr.window " + std::to_string(g.window) +
                    " GNMR values"
              : std::string(),
          same_step ? "t (gnmr.oracle_same_step)" : "t + 1", config.train.steps);
    }
  }
  const PathSpec& low = config.precision.low;
  const PathSpec& high = config.precision.recovery;
  if (config.precision.has_low_path && low.kind == high.kind && low.describe() == high.describe()) {
    spdlog::warn(
        "the recovery path is the low path ({}): routing a unit to recovery changes "
        "nothing (set precision.recovery_format or recovery_bits finer than the low one)",
        low.describe());
  }
  if (low.kind == PathKind::kFineGrainedFp && high.kind == PathKind::kFineGrainedFp &&
      fp_format_bits(high.format) < fp_format_bits(low.format)) {
    spdlog::warn(
        "precision.recovery_format {} has fewer bits than precision.low_format {}: "
        "the recovery path is the coarser one",
        fp_format_name(high.format), fp_format_name(low.format));
  }
  // recovery_bits 0 keeps the recovery path full precision (a kBackendGemm path).
  if (low.kind == PathKind::kSavedIntGroupwise && high.kind == PathKind::kSavedIntGroupwise &&
      high.saved.bits < low.saved.bits) {
    spdlog::warn(
        "precision.recovery_bits {} is below precision.low_bits {}: the recovery path "
        "is the coarser one",
        high.saved.bits, low.saved.bits);
  }
  const ControllerOptions& g = config.gnmr;
  const bool moved = (std::isfinite(g.alpha_final) && g.alpha_final != g.alpha) ||
                     (std::isfinite(g.beta_final) && g.beta_final != g.beta);
  if (g.threshold_schedule == "constant" && moved) {
    spdlog::warn(
        "gnmr.alpha_final / beta_final are not used: gnmr.threshold_schedule is "
        "\"constant\" (set it to \"linear\" or \"cosine\" to move the thresholds)");
  }
  if (about_train_steps && config.train.warmup_steps >= config.train.steps) {
    spdlog::warn(
        "train.warmup_steps {} is not below train.steps {}: the learning rate never reaches "
        "train.lr {} (the warm-up is counted in optimizer steps, whatever the world size)",
        config.train.warmup_steps, config.train.steps, config.train.lr);
  }
}

}  // namespace

std::unique_ptr<Controller> make_run_controller(const RunConfig& config, int world_size,
                                                SettingsWarnings warnings) {
  std::unique_ptr<Controller> controller;
  try {
    controller = std::make_unique<Controller>(config.gnmr, config.model.n_layers,
                                              config.precision.recovery_layers);
  } catch (const std::invalid_argument& e) {
    throw Error(ErrorKind::Config, std::string("config: ") + e.what());
  }
  if (warnings != SettingsWarnings::kNone) {
    warn_about_settings_that_do_nothing(config, *controller, warnings == SettingsWarnings::kAll);
  }
  if ((config.log.recovery_gap || controller->needs_recovery_gaps()) && world_size > 1) {
    throw Error(ErrorKind::Config,
                "config: log.recovery_gap and gnmr.controller = \"oracle\" run on one rank "
                "(the gap is measured on one rank's batches; this job has " +
                    std::to_string(world_size) + " ranks)");
  }
  return controller;
}

void load_controller_state(Controller& controller, const std::vector<uint8_t>& state,
                           const std::string& checkpoint_dir) {
  const std::string file = "checkpoint " + checkpoint_dir + ": controller.bin";
  try {
    controller.load_state(state);
  } catch (const ControllerStateDamaged& e) {
    throw Error(ErrorKind::Checkpoint,
                file + " is damaged (" + e.what() + "); resume from an earlier checkpoint");
  } catch (const ControllerStateVersion& e) {
    throw Error(ErrorKind::Checkpoint,
                file + " was written by another gnmr (" + e.what() +
                    "); resume it with a gnmr build that reads that version");
  } catch (const ControllerStateMismatch& e) {
    throw Error(ErrorKind::Checkpoint,
                file + " was saved under other gnmr.* options or another model (" + e.what() +
                    "); the gnmr.* options must match the checkpointed run (its config.json)");
  }
}

}  // namespace gnmr
