#include "train/checkpoint.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>

#include "train/checkpoint_manifest.h"
#include "train/safetensors.h"
#include "train/zero_checkpoint.h"
#include "util/atomic_file.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gnmr {

namespace {

// Checkpoints are written to RUN_DIR/checkpoints/.tmp_step_NNNNNNNN_<pid> and renamed.
constexpr const char* kTempPrefix = ".tmp_";

std::vector<float> tensor_to_host(Backend& backend, const Tensor& t) {
  std::vector<float> host(size_t(t.numel()));
  backend.copy_to_host(t, host.data());
  return host;
}

using Metadata = std::map<std::string, std::string>;
using OptimizerWriter = std::function<void(const fs::path& dir, const Metadata& meta)>;

Metadata checkpoint_metadata(const TrainerState& state) {
  return {{"format", "gnmr-checkpoint"}, {"step", std::to_string(state.step)}};
}

// optimizer.safetensors: every parameter's moments.
void write_adamw_state(const fs::path& dir, const Metadata& meta, Backend& backend,
                       const LlamaModel& model, AdamW& optimizer) {
  const auto& params = model.params();
  std::vector<std::vector<float>> moments;
  std::vector<SafetensorsTensor> moment_tensors;
  moments.reserve(2 * params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    moments.push_back(tensor_to_host(backend, optimizer.first_moment(i)));
    moment_tensors.push_back(
        {"m." + params[i].name, "F32", params[i].shape, moments.back().data()});
    moments.push_back(tensor_to_host(backend, optimizer.second_moment(i)));
    moment_tensors.push_back(
        {"v." + params[i].name, "F32", params[i].shape, moments.back().data()});
  }
  write_safetensors((dir / "optimizer.safetensors").string(), moment_tensors, meta);
}

// The files of one checkpoint, written into DIR (the temporary directory).
void write_checkpoint_files(const fs::path& dir, const RunConfig& config, Backend& backend,
                            const LlamaModel& model, const OptimizerWriter& write_optimizer,
                            const TrainerState& state) {
  const auto& params = model.params();
  std::vector<std::vector<float>> weights = model_weights_to_host(backend, model);
  std::vector<SafetensorsTensor> model_tensors;
  for (size_t i = 0; i < params.size(); ++i) {
    model_tensors.push_back({params[i].name, "F32", params[i].shape, weights[i].data()});
  }
  const Metadata meta = checkpoint_metadata(state);
  write_safetensors((dir / "model.safetensors").string(), model_tensors, meta);
  write_optimizer(dir, meta);

  write_file_atomic((dir / "trainer.json").string(), trainer_state_to_json(state).dump(2) + "\n");
  write_file_atomic((dir / "controller.bin").string(), state.controller_state.data(),
                    state.controller_state.size());
  write_file_atomic((dir / "config.json").string(), config.resolved.dump(2) + "\n");
  if (!config.data.tokenizer.empty() && fs::exists(config.data.tokenizer)) {
    fs::copy_file(config.data.tokenizer, dir / "tokenizer.model");
  }
}

}  // namespace

std::vector<int64_t> checkpoint_steps(const std::string& run_dir) {
  std::vector<int64_t> steps;
  fs::path dir = fs::path(run_dir) / "checkpoints";
  if (!fs::exists(dir)) return steps;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    if (name.size() == 13 && name.rfind("step_", 0) == 0 && entry.is_directory()) {
      steps.push_back(std::stoll(name.substr(5)));
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string checkpoint_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

std::vector<std::vector<float>> model_weights_to_host(Backend& backend, const LlamaModel& model) {
  std::vector<std::vector<float>> out;
  for (const auto& p : model.params()) out.push_back(tensor_to_host(backend, p.weight));
  return out;
}

namespace {

std::string save_checkpoint_files(const std::string& run_dir, const RunConfig& config,
                                  Backend& backend, const LlamaModel& model,
                                  const OptimizerWriter& write_optimizer,
                                  const TrainerState& state) {
  fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  fs::path final_dir = root / checkpoint_dir_name(state.step);
  fs::path tmp_dir =
      root / (kTempPrefix + checkpoint_dir_name(state.step) + "_" + std::to_string(::getpid()));
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  try {
    write_checkpoint_files(tmp_dir, config, backend, model, write_optimizer, state);
    write_checkpoint_manifest(tmp_dir.string());  // last: it covers every file above
    // Only a resumed run that re-reaches a saved step finds it saved: a damaged one that
    // --resume auto skipped. (Going back to an older checkpoint moves the later ones aside
    // first: run_dir.h.) The run writing now is the run the directory holds, so whatever is
    // there is replaced, never kept in place of this run's bits.
    if (fs::exists(final_dir)) {
      const std::string old_problem = checkpoint_problem(final_dir.string());
      spdlog::warn("replacing checkpoint {} ({})", final_dir.string(),
                   old_problem.empty() ? "written before this run reached its step" : old_problem);
      // Aside under a temporary's name until the new one is in place, and back if publishing
      // fails. (Killed in between, both are temporaries that the next start removes: the
      // step is lost, the older checkpoints stay.)
      const fs::path replaced =
          root / (kTempPrefix + std::string("replaced_") + checkpoint_dir_name(state.step) + "_" +
                  std::to_string(::getpid()));
      fs::remove_all(replaced);
      fs::rename(final_dir, replaced);
      try {
        publish_directory(tmp_dir.string(), final_dir.string());
      } catch (...) {
        std::error_code ec;
        fs::rename(replaced, final_dir, ec);
        throw;
      }
      fs::remove_all(replaced);
    } else {
      publish_directory(tmp_dir.string(), final_dir.string());
    }
  } catch (...) {
    // A failed write (disk full) leaves nothing behind; the newest complete checkpoint stays.
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    throw;
  }

  spdlog::info("checkpoint {}", final_dir.string());
  // checkpoint.keep counts the run's checkpoints up to this step. A later one is a damaged
  // checkpoint that --resume auto skipped, replaced above when the run reaches its step:
  // counting it would delete the checkpoints the run can resume from, this one included.
  std::vector<int64_t> steps;
  for (int64_t step : checkpoint_steps(run_dir)) {
    if (step <= state.step) steps.push_back(step);
  }
  while (int(steps.size()) > config.checkpoint.keep) {
    fs::remove_all(root / checkpoint_dir_name(steps.front()));
    spdlog::info("removed checkpoint {} (checkpoint.keep = {})",
                 (root / checkpoint_dir_name(steps.front())).string(), config.checkpoint.keep);
    steps.erase(steps.begin());
  }
  return final_dir.string();
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const RunConfig& config, Backend& backend,
                            const LlamaModel& model, AdamW& optimizer, const TrainerState& state) {
  return save_checkpoint_files(
      run_dir, config, backend, model,
      [&](const fs::path& dir, const Metadata& meta) {
        write_adamw_state(dir, meta, backend, model, optimizer);
      },
      state);
}

std::string save_checkpoint(const std::string& run_dir, const RunConfig& config, Backend& backend,
                            const LlamaModel& model, ZeroAdamW& optimizer, Communicator& comm,
                            const TrainerState& state) {
  if (comm.rank() != 0) {
    write_zero_optimizer_state(comm, backend, optimizer, "", checkpoint_metadata(state));
    return "";
  }
  return save_checkpoint_files(
      run_dir, config, backend, model,
      [&](const fs::path& dir, const Metadata& meta) {
        write_zero_optimizer_state(comm, backend, optimizer, dir.string(), meta);
      },
      state);
}

void remove_stale_checkpoint_temps(const std::string& run_dir, bool run_dir_locked) {
  // The trainer's own temporaries, .tmp_[replaced_]step_NNNNNNNN_<pid>: written only under the
  // run directory's lock. (`checkpoint consolidate` writes .tmp_step_N_consolidated_<pid>
  // beside them without that lock: its pid decides.)
  auto trainers_own = [](const std::string& name) {
    std::string rest = name.substr(std::string(kTempPrefix).size());
    if (rest.rfind("replaced_", 0) == 0) rest = rest.substr(9);
    if (rest.size() < 15 || rest.rfind("step_", 0) != 0 || rest[13] != '_') return false;
    const std::string digits = rest.substr(5, 8) + rest.substr(14);
    return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  remove_stale_temp_dirs(
      (fs::path(run_dir) / "checkpoints").string(), kTempPrefix,
      run_dir_locked ? std::function<bool(const std::string&)>(trainers_own) : nullptr);
}

std::string find_latest_checkpoint(const std::string& run_dir) {
  std::vector<int64_t> steps = checkpoint_steps(run_dir);
  if (steps.empty()) return "";
  return (fs::path(run_dir) / "checkpoints" / checkpoint_dir_name(steps.back())).string();
}

std::string newest_intact_checkpoint(const std::string& run_dir,
                                     std::vector<std::string>& skipped) {
  std::vector<int64_t> steps = checkpoint_steps(run_dir);
  std::string newest_problem;
  for (auto step = steps.rbegin(); step != steps.rend(); ++step) {
    const std::string dir =
        (fs::path(run_dir) / "checkpoints" / checkpoint_dir_name(*step)).string();
    const std::string problem = checkpoint_problem(dir);
    if (problem.empty()) return dir;
    skipped.push_back("--resume auto: skipping checkpoint " + dir + ": " + problem);
    if (newest_problem.empty()) newest_problem = dir + ": " + problem;
  }
  if (steps.empty()) return "";
  // Damage to the optimizer state alone leaves weights to start from: say so, before --force,
  // which deletes them.
  const std::string newest =
      (fs::path(run_dir) / "checkpoints" / checkpoint_dir_name(steps.back())).string();
  const std::string weights_note =
      checkpoint_problem(newest, CheckpointUse::Weights).empty()
          ? "; its weights are intact: `gnmr train --init " + newest +
                " --out NEW_DIR` trains on from them with a new optimizer state, and gnmr eval "
                "and export read them"
          : "";
  throw Error(ErrorKind::Checkpoint,
              "--resume auto: no intact checkpoint in " + run_dir +
                  "/checkpoints (newest: " + newest_problem + weights_note +
                  "); --force restarts the run from step 0 and deletes its checkpoints");
}

void require_existing_model_dir(const std::string& dir) {
  if (fs::exists(dir)) return;
  throw Error(ErrorKind::Checkpoint,
              dir +
                  " does not exist (on a multi-node job every rank reads it, so it must be on "
                  "a filesystem all nodes share)");
}

json read_checkpoint_config(const std::string& checkpoint_dir) {
  fs::path path = fs::path(checkpoint_dir) / "config.json";
  require_existing_model_dir(checkpoint_dir);
  if (!fs::exists(path)) {
    throw Error(ErrorKind::Checkpoint,
                checkpoint_dir + " is not a gnmr checkpoint (no config.json)");
  }
  json j = json::parse(read_file(path.string()), nullptr, false);
  if (j.is_discarded()) throw Error(ErrorKind::Checkpoint, path.string() + ": invalid JSON");
  return j;
}

void check_checkpoint_model(const std::string& checkpoint_dir, const RunConfig& config) {
  const json saved_config = read_checkpoint_config(checkpoint_dir);
  if (!saved_config.contains("model")) {
    throw Error(ErrorKind::Checkpoint, checkpoint_dir + "/config.json has no model section");
  }
  const json& saved = saved_config["model"];
  const json& current = config.resolved["model"];
  const json& defaults = default_config_json()["model"];
  for (auto it = current.begin(); it != current.end(); ++it) {
    // The attention kernel is a runtime choice, as for --init (with_any_attention_kernel): the
    // weights are the same; the log names the change (log_settings_changed_since).
    if (it.key() == "name" || it.key() == "attention") continue;
    // A key the checkpoint lacks was added to the schema after that gnmr wrote it: its default
    // is what that gnmr did (docs/DESIGN.md §5), so the checkpoint was trained with it. The
    // shape keys were there from the first checkpoint: one without them is not of a model.
    const bool absent = !saved.contains(it.key());
    const bool shape_key = it.key() == "dim" || it.key() == "n_layers" || it.key() == "n_heads" ||
                           it.key() == "n_kv_heads" || it.key() == "ffn_dim" ||
                           it.key() == "vocab_size";
    if (absent && shape_key) {
      throw Error(ErrorKind::Checkpoint,
                  "checkpoint " + checkpoint_dir + "/config.json has no model." + it.key());
    }
    const json& trained_with = absent ? defaults.at(it.key()) : saved[it.key()];
    if (trained_with != *it) {
      throw Error(ErrorKind::Checkpoint,
                  "checkpoint " + checkpoint_dir + " was trained with model." + it.key() + "=" +
                      trained_with.dump() +
                      (absent ? " (its config.json predates the key: the default)" : "") +
                      ", the config says " + it->dump());
    }
  }
}

std::vector<uint8_t> read_controller_state(const std::string& checkpoint_dir) {
  const std::string bytes = read_file((fs::path(checkpoint_dir) / "controller.bin").string());
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

namespace {

// Weights and trainer state (shared by both optimizers); the moments are the caller's.
TrainerState load_weights_and_state(const std::string& checkpoint_dir, const RunConfig& config,
                                    Backend& backend, LlamaModel& model) {
  check_checkpoint_model(checkpoint_dir, config);

  fs::path trainer_path = fs::path(checkpoint_dir) / "trainer.json";
  TrainerState state =
      trainer_state_from_json(read_file(trainer_path.string()), trainer_path.string());

  SafetensorsFile weights((fs::path(checkpoint_dir) / "model.safetensors").string());
  const auto& params = model.params();
  std::vector<float> host;
  for (size_t i = 0; i < params.size(); ++i) {
    host.resize(size_t(params[i].weight.numel()));
    weights.read_f32(params[i].name, params[i].shape, host.data());
    Tensor w = params[i].weight;
    backend.copy_from_host(w, host.data());
  }

  state.controller_state = read_controller_state(checkpoint_dir);
  return state;
}

}  // namespace

TrainerState load_checkpoint(const std::string& checkpoint_dir, const RunConfig& config,
                             Backend& backend, LlamaModel& model, AdamW& optimizer) {
  const int sharded_over = zero_checkpoint_world_size(checkpoint_dir);
  if (sharded_over > 0) {
    throw Error(ErrorKind::Checkpoint, zero_resume_refusal(checkpoint_dir, sharded_over, 0, 0));
  }
  TrainerState state = load_weights_and_state(checkpoint_dir, config, backend, model);
  SafetensorsFile moments((fs::path(checkpoint_dir) / "optimizer.safetensors").string());
  const auto& params = model.params();
  std::vector<float> host;
  for (size_t i = 0; i < params.size(); ++i) {
    host.resize(size_t(params[i].weight.numel()));
    moments.read_f32("m." + params[i].name, params[i].shape, host.data());
    backend.copy_from_host(optimizer.first_moment(i), host.data());
    moments.read_f32("v." + params[i].name, params[i].shape, host.data());
    backend.copy_from_host(optimizer.second_moment(i), host.data());
  }
  return state;
}

TrainerState load_checkpoint(const std::string& checkpoint_dir, const RunConfig& config,
                             Backend& backend, LlamaModel& model, ZeroAdamW& optimizer) {
  // Before any weight is read: a world-size mismatch is refused with nothing changed.
  const int sharded_over = zero_checkpoint_world_size(checkpoint_dir);
  if (sharded_over > 0 && sharded_over != optimizer.layout().world_size) {
    throw Error(ErrorKind::Checkpoint, zero_resume_refusal(checkpoint_dir, sharded_over, 1,
                                                           optimizer.layout().world_size));
  }
  TrainerState state = load_weights_and_state(checkpoint_dir, config, backend, model);
  read_zero_optimizer_state(checkpoint_dir, model.params(), backend, optimizer);
  return state;
}

}  // namespace gnmr
