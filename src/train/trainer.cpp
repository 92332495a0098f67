#include "train/trainer.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "backend/cpu/blas_autotune.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/thread_placement.h"
#include "parallel/communicator.h"
#include "parallel/launch_env.h"
#include "train/bench.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/hf_format.h"
#include "train/metrics.h"
#include "train/run_dir.h"
#include "train/session.h"
#include "util/atomic_file.h"
#include "util/directory_lock.h"
#include "util/error.h"
#include "util/fnv1a.h"
#include "util/log.h"
#include "util/stop_signals.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gnmr {

namespace {

int64_t peak_rss_bytes() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return int64_t(usage.ru_maxrss) * 1024;
}

std::string format_duration(double seconds) {
  int64_t s = int64_t(seconds);
  char text[32];
  std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", (long long)(s / 3600),
                (long long)(s / 60 % 60), (long long)(s % 60));
  return text;
}

// Rank 0 decides; every rank gets the same string.
std::string broadcast_string(Communicator& comm, std::string text) {
  uint64_t size = text.size();
  comm.broadcast(&size, sizeof(size), 0);
  text.resize(size);
  comm.broadcast(text.data(), size, 0);
  return text;
}

TrainSummary train_loop(const RunConfig& config, const TrainOptions& options,
                        TrainingSession& session);

// What the AdamW moments cost this rank (README "Data parallel training and SLURM"): with
// dist.zero=1 a 1/world shard plus padding instead of a copy of everything.
void log_optimizer_state(TrainingSession& session) {
  const size_t bytes = session.optimizer_state_bytes();
  if (ZeroAdamW* zero = session.zero_optimizer()) {
    const ZeroShardLayout& layout = zero->layout();
    spdlog::info(
        "optimizer state: {} bytes per rank (ZeRO-1: shard of {} of {} flat elements over {} "
        "rank(s), {} padding elements)",
        bytes, layout.shard_elements, layout.flat_elements, layout.world_size,
        layout.padding_elements());
  } else {
    spdlog::info("optimizer state: {} bytes per rank (every rank holds all moments)", bytes);
  }
}

// The leaves of a config: "precision.low_format" -> its value, a list being one value (nlohmann's
// flatten() splits lists into "precision.recovery_layers.0" and makes [] null).
void config_leaves(const json& node, const std::string& prefix, std::map<std::string, json>& out) {
  if (!node.is_object()) {
    out[prefix] = node;
    return;
  }
  for (auto it = node.begin(); it != node.end(); ++it) {
    config_leaves(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  }
}

void log_settings_changed_since(const std::string& checkpoint_dir, const RunConfig& config) {
  std::map<std::string, json> before, now;
  config_leaves(read_checkpoint_config(checkpoint_dir), "", before);
  config_leaves(config.resolved, "", now);
  std::string changes;
  auto add = [&changes](const std::string& key, const std::string& from, const std::string& to) {
    changes += (changes.empty() ? "" : ", ") + key + " " + from + " -> " + to;
  };
  for (const auto& [key, value] : now) {
    const auto old = before.find(key);
    if (old == before.end()) {
      add(key, "(unset)", value.dump());
    } else if (old->second != value) {
      add(key, old->second.dump(), value.dump());
    }
  }
  for (const auto& [key, value] : before) {
    if (now.count(key) == 0) add(key, value.dump(), "(unset)");
  }
  if (!changes.empty()) spdlog::info("settings changed since {}: {}", checkpoint_dir, changes);
}

}  // namespace

TrainSummary run_training(const RunConfig& config, const TrainOptions& options) {
  if (options.out_dir.empty()) throw Error(ErrorKind::Usage, "--out DIR is required");
  // From the start, not only around the steps: SLURM's time-limit signal (sent up to a minute
  // early) or a scancel during a long set-up or checkpoint load once killed the ranks, and the
  // job script saw a failure. A signal before the first step stops the run after it.
  // SIGUSR1 (a scheduler's notice) may come again; a second SIGTERM, SIGINT or SIGHUP ends a
  // run (or a set-up) that does not stop at once.
  StopSignals stop_signals({SIGUSR1}, {SIGTERM, SIGINT, SIGHUP});
  TrainingSession session(config, /*synthetic_data=*/false);
  return run_or_end_job(session.comm(), [&] { return train_loop(config, options, session); });
}

namespace {

TrainSummary train_loop(const RunConfig& config, const TrainOptions& options,
                        TrainingSession& session) {
  Communicator& comm = session.comm();
  const bool writer = comm.rank() == 0;  // only rank 0 writes the run directory
  // Every rank decides alone whether a step is its last: ranks given different --stop-at
  // values (an MPMD launch) parted there, one into the checkpoint and one into the next step,
  // and waited for each other for ever. Like a config that differs, they stop here together.
  if (comm.world_size() > 1 && !comm.all_agree(uint64_t(options.stop_at))) {
    throw Error(ErrorKind::Usage, "the ranks of this job were started with different --stop-at");
  }
  if (!writer) spdlog::set_level(spdlog::level::warn);  // one human log per job, not per rank
  // Rank 0 decides what the run directory means; nothing in it changes until the checkpoint
  // (or the --init weights) has loaded, so a refused run leaves the directory as it was.
  RunDirPlan plan;
  DirectoryLock lock;  // rank 0's, for the whole run: before the plan where RUN_DIR exists
  std::string resume_from;
  TrainerState& state = session.state();
  {
    // Rank 0 reads every byte of the checkpoint it verifies while the others wait, then every
    // rank reads it: waits on a filesystem, not on a dead peer, so they get the checkpoint
    // deadline (the barrier ends them all together).
    CommunicatorTimeoutScope file_waits(comm, config.dist.checkpoint_timeout_s);
    std::error_code ec;
    if (writer && fs::is_directory(options.out_dir, ec))
      lock = DirectoryLock(options.out_dir, "run directory", ErrorKind::Checkpoint);
    if (writer) plan = plan_run_dir(options);
    resume_from = broadcast_string(comm, plan.resume_from);
    if (!resume_from.empty()) {
      if (ZeroAdamW* zero = session.zero_optimizer()) {
        state = load_checkpoint(resume_from, config, session.backend(), session.model(), *zero);
      } else {
        state = load_checkpoint(resume_from, config, session.backend(), session.model(),
                                session.optimizer());
      }
      session.restore_controller_state(resume_from);
    } else if (!options.init.empty()) {
      if (writer && !is_hf_model_dir(options.init)) {
        verify_checkpoint(options.init, CheckpointUse::Weights);
      }
      if (writer) check_init_source(options.init, config);
      load_model_weights(options.init, session.backend(), session.model());
    }
    if (comm.world_size() > 1) comm.barrier();
  }

  if (writer) {
    apply_run_dir_plan(plan);
    if (!lock.tried())
      lock = DirectoryLock(options.out_dir, "run directory",
                           ErrorKind::Checkpoint);  // a directory the plan just made
    add_log_file((fs::path(options.out_dir) / "log.txt").string());
    remove_stale_checkpoint_temps(options.out_dir, lock.held());
    write_file_atomic((fs::path(options.out_dir) / "config.json").string(),
                      config.resolved.dump(2) + "\n");
  }
  for (const std::string& skipped : plan.skipped_checkpoints) spdlog::warn("{}", skipped);
  if (!plan.note.empty()) spdlog::info("{}", plan.note);
  if (!resume_from.empty()) {
    spdlog::info("resumed from {} at step {}", resume_from, state.step);
    if (writer && state.world_size > 0 && state.world_size != comm.world_size()) {
      spdlog::warn(
          "{} was written by {} rank(s), this job has {}: the ranks read other slices "
          "of the data (with data.sampling = random, other batches) than the job that "
          "wrote it would have",
          resume_from, state.world_size, comm.world_size());
    }
    // config.json is rewritten with this start's settings: the ones that changed since the
    // checkpoint (a lower lr after a spike, another precision) are said, so the log tells
    // which steps ran with which.
    if (writer) log_settings_changed_since(resume_from, config);
    if (!options.init.empty()) {
      spdlog::info("--init {} not used: the run continues from its checkpoint", options.init);
    }
  } else if (!options.init.empty()) {
    spdlog::info("initialised weights from {}", options.init);
  }
  state.world_size = comm.world_size();  // recorded in this run's checkpoints
  BlasReport blas;  // the CPU backend's, asked once: its log line, numerics, the metrics header
  {
    // A resume on another BLAS kernel or thread count (a requeue onto another CPU type, an
    // override of train.threads, GNMR_BLAS_AUTOTUNE=0) or another GPU is correct, not
    // bit-exact: say so where it happens.
    std::string numerics = config.backend + ": " + session.backend().device();
    if (config.backend == "cpu") {
      const int gemm_threads = cpu_backend_threads(config.train.threads);
      blas = blas_report(gemm_threads);
      numerics = "cpu: " + blas.library + " " + blas.version + " kernel " + blas.kernel +
                 ", GEMM rows split over " + std::to_string(gemm_threads) + " thread(s)";
      spdlog::info("BLAS: {} on {} core(s)", describe_blas(blas), gemm_threads);
    }
    if (writer && !resume_from.empty() && !state.numerics.empty() && state.numerics != numerics) {
      spdlog::warn(
          "{} was written with {}; this job runs with {}: the run goes on correctly, but its "
          "bits may now differ from an uninterrupted run's (they do where the BLAS kernel tiles "
          "rows or the GPU differs: README \"Same bits, same settings\")",
          resume_from, state.numerics, numerics);
    }
    state.numerics = numerics;
    // Shards replaced or added under the same glob change the batches from the resumed step
    // on (deliberately, in a continued pretraining; by accident, after a new prepare).
    const std::string data = session.train_data_fingerprint();
    if (writer && !resume_from.empty() && !state.data.empty() && state.data != data) {
      spdlog::warn(
          "{} was trained on other data.train shards ({}) than this job reads ({}): the run "
          "goes on with other batches than an uninterrupted run's",
          resume_from, state.data, data);
    }
    state.data = data;
  }

  MetricsWriter metrics, trace;
  if (writer) {
    metrics.open((fs::path(options.out_dir) / "metrics.jsonl").string(), state.step);
    if (config.log.gnmr_trace)
      trace.open((fs::path(options.out_dir) / "gnmr_trace.jsonl").string(), state.step);
  }
  // The BLAS (logged with the numerics above) as a header line at each (re)start of the metrics: a
  // weaker kernel than the CPU runs explains a slow run (README "Benchmarks").
  const bool cpu = config.backend == "cpu";
  if (cpu) {
    const int gemm_threads = cpu_backend_threads(config.train.threads);
    const std::string crowded = thread_oversubscription_warning(
        current_thread_placement(gemm_threads, read_launch_env().local_size));
    if (!crowded.empty()) spdlog::warn("{}", crowded);
  }
  if (writer) {
    json header = {{"kind", "run"},
                   {"step", state.step},
                   {"gnmr", options.build_id},
                   {"backend", config.backend},
                   {"device", session.backend().device()},
                   {"world_size", comm.world_size()},
                   {"numerics", state.numerics}};
    if (cpu) header.update(blas_json(blas));
    metrics.write(header);
  }

  const TrainConfig& train = config.train;
  const double flops_per_token = double(session.model().flops_per_token());
  // MFU in the metrics is against this machine's measured GEMM peak (a short measurement; a
  // GPU needs 4096^3, 128 MiB for a moment, to fill its SMs: 1024^3 is 64 output tiles).
  const double gemm_peak_gflops =
      measure_gemm_peak_gflops(config, config.backend == "cuda" ? 4096 : 1024, 3);
  spdlog::info(
      "model {}: {} layers, dim {}, {} projection units; {} steps × {} tokens ({} micro-steps of "
      "{}×{})",
      config.model.name, config.model.n_layers, config.model.dim, session.model().units().size(),
      train.steps, train.global_batch_tokens, session.accumulation_steps(), train.micro_batch,
      config.data.seq_len);

  log_optimizer_state(session);

  if (!cpu) {
    spdlog::info("attention: {}", session.model().attention_kernel());
    // Which GEMMs run for real and which are emulated, and why (the cpu emulates them all).
    const json impls = projection_gemm_impls(session.model(), session.backend());
    for (auto it = impls.begin(); it != impls.end(); ++it) {
      spdlog::info("GEMMs of {}: {}", it.key(), it.value().dump());
    }
  }

  TrainSummary summary;
  summary.steps_done = state.step;
  if (writer && options.stop_at > train.steps) {
    spdlog::warn("--stop-at {} is past train.steps {}: the run ends at step {}", options.stop_at,
                 train.steps, train.steps);
  }
  // --stop-at bounds the steps this job trains, also when it resumes at or past it (a job sized
  // to a time slot must not run on).
  const int64_t end_step =
      options.stop_at > 0 ? std::min(train.steps, options.stop_at) : train.steps;
  if (state.step >= end_step && state.step < train.steps) {
    if (writer) {
      spdlog::warn("--stop-at {}: the run is already at step {}; nothing to train", options.stop_at,
                   state.step);
    }
    metrics.write({{"kind", "end"},
                   {"step", state.step},
                   {"reason", "stopped"},
                   {"stopped_by", "--stop-at"}});
    summary.stopped_by_signal = true;
  }
  auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = state.step;
  double window_loss = 0;
  int window_count = 0;
  for (int64_t s = state.step; s < end_step; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    StepResult r = session.run_step(s);
    const double step_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tokens_per_s = double(session.tokens_per_step()) / step_s;
    json line = {{"kind", "train"},
                 {"step", r.step},
                 {"loss", r.loss},
                 {"lr", r.lr},
                 {"grad_norm", r.grad_norm},
                 {"skipped", r.skipped},
                 {"tokens", state.tokens_seen},
                 {"tokens_per_s", tokens_per_s},
                 {"step_ms", step_s * 1e3},
                 {"gflops_per_s", flops_per_token * tokens_per_s * 1e-9},
                 // per device: the job's tokens are shared by its ranks
                 {"mfu", flops_per_token * tokens_per_s * 1e-9 / double(comm.world_size()) /
                             gemm_peak_gflops},
                 {"backend_bytes", session.backend().allocated_bytes()},
                 {"peak_rss_bytes", peak_rss_bytes()},
                 {"units_low", int(session.model().units().size()) - r.units_recovery},
                 {"units_recovery", r.units_recovery},
                 {"saved_activation_bytes", r.saved_activation_bytes},
                 {"controller_ms", r.controller_ms}};
    if (r.recovery_gap_ms > 0) line["recovery_gap_ms"] = r.recovery_gap_ms;
    line.update(r.controller_fields);
    metrics.write(line);
    if (writer && config.log.gnmr_trace) {
      std::ostringstream text;
      session.controller().write_trace_line(text);
      trace.write_line(text.str());
    }
    summary.final_loss = r.loss;

    if (r.skipped) {
      // The loss and the norm are the job's (summed over the ranks): rank 0's line speaks for it.
      spdlog::log(writer ? spdlog::level::warn : spdlog::level::info,
                  "step {}: non-finite loss or gradient (loss {}, grad norm {}); update skipped "
                  "({} in a row)",
                  r.step, r.loss, r.grad_norm, state.consecutive_nonfinite);
      if (state.consecutive_nonfinite >= train.max_nonfinite_steps) {
        metrics.write({{"kind", "end"}, {"step", r.step}, {"reason", "diverged"}});
        std::string last = find_latest_checkpoint(options.out_dir);
        throw Error(ErrorKind::Diverged,
                    "training stopped: " + std::to_string(state.consecutive_nonfinite) +
                        " consecutive non-finite steps (train.max_nonfinite_steps); last good "
                        "checkpoint: " +
                        (last.empty() ? "none" : last));
      }
    } else {
      window_loss += r.loss;
      window_count += 1;
    }

    if (r.step % config.log.every == 0 || r.step == train.steps) {
      double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      double per_step = elapsed / double(r.step - first_step);
      spdlog::info(
          "step {:>6}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | {:.1f} ms | "
          "ETA {}",
          r.step, train.steps, window_count ? window_loss / window_count : NAN, r.lr, r.grad_norm,
          tokens_per_s, step_s * 1e3, format_duration(per_step * double(train.steps - r.step)));
      window_loss = 0;
      window_count = 0;
    }

    const bool last = r.step == train.steps;
    if (session.has_validation() &&
        ((config.eval.every > 0 && r.step % config.eval.every == 0) || last)) {
      double val_loss = session.evaluate(config.eval.tokens);
      // A non-finite loss is written too (JSON null): a dashboard waiting for the eval line
      // must not take a diverged model for a stalled run.
      metrics.write({{"kind", "eval"},
                     {"step", r.step},
                     {"val_loss", val_loss},
                     {"val_ppl", std::exp(val_loss)},
                     {"val_tokens", session.eval_tokens(config.eval.tokens)}});
      if (std::isfinite(val_loss)) {
        spdlog::info("step {:>6} | val loss {:.4f} | val ppl {:.2f}", r.step, val_loss,
                     std::exp(val_loss));
      } else {
        spdlog::warn("step {:>6} | val loss {} is not finite", r.step, val_loss);
      }
      summary.final_val_loss = val_loss;
    }
    // Ranks may receive a signal at different steps: they stop together at the first step
    // any of them saw it.
    double signalled = StopSignals::received() != 0 ? 1.0 : 0.0;
    if (comm.world_size() > 1) comm.allreduce_sum(&signalled, 1);
    const bool stop = signalled > 0 || r.step == options.stop_at;
    if ((config.checkpoint.every > 0 && r.step % config.checkpoint.every == 0) || last || stop) {
      // The other ranks wait while rank 0 writes: the checkpoint deadline, not a collective's.
      CommunicatorTimeoutScope file_waits(comm, config.dist.checkpoint_timeout_s);
      if (comm.world_size() > 1) {
        std::vector<std::vector<float>> weights =
            model_weights_to_host(session.backend(), session.model());
        uint64_t h = kFnv1aOffsetBasis;
        for (const auto& w : weights) h = fnv1a(w.data(), w.size() * sizeof(float), h);
        if (!comm.all_agree(h)) {
          throw Error(ErrorKind::Runtime,
                      "step " + std::to_string(r.step) +
                          ": the ranks' weights differ; refusing to checkpoint a diverged replica");
        }
      }
      session.save_controller_state();
      // The metrics and the trace through this step reach the disk with the checkpoint: a
      // machine that crashes after it keeps no checkpoint whose steps they lack.
      if (writer) {
        metrics.sync();
        trace.sync();
      }
      if (ZeroAdamW* zero = session.zero_optimizer()) {
        save_checkpoint(options.out_dir, config, session.backend(), session.model(), *zero, comm,
                        state);  // every rank: the shards travel to rank 0
      } else if (writer) {
        save_checkpoint(options.out_dir, config, session.backend(), session.model(),
                        session.optimizer(), state);
      }
      comm.barrier();  // every rank may rely on the checkpoint existing from here on
    }
    summary.steps_done = r.step;
    if (stop && !last) {
      const int own_signal = StopSignals::received();
      const std::string by = own_signal != 0 ? "signal " + std::to_string(own_signal) + " (" +
                                                   std::string(strsignal(own_signal)) + ")"
                             : signalled > 0 ? std::string("a signal to another rank")
                                             : std::string("--stop-at");
      // Rank 0's line speaks for the job (the other ranks log warnings only: theirs repeated it).
      spdlog::log(writer ? spdlog::level::warn : spdlog::level::info,
                  "stopped after step {} ({}); checkpointed, continue with --resume auto", r.step,
                  by);
      metrics.write({{"kind", "end"}, {"step", r.step}, {"reason", "stopped"}, {"stopped_by", by}});
      summary.stopped_by_signal = true;
      break;
    }
  }
  if (state.step == train.steps) {
    metrics.write({{"kind", "end"}, {"step", state.step}, {"reason", "complete"}});
  }
  // Also a signal in the last step, or after it: Ctrl-C still ends the process by it.
  summary.stop_signal = StopSignals::received();
  json controller_summary = session.controller().summary();
  if (writer) {
    write_file_atomic((fs::path(options.out_dir) / "gnmr_summary.json").string(),
                      controller_summary.dump(2) + "\n");
  }
  // Under a recipe without a low path (fp32, bf16) the plan changes no GEMM: its figures are
  // the controller's choices, not precision switches.
  spdlog::info(
      "controller {}: active fraction {:.4f}, threshold exceedance rate {:.4f}%, {:.1f} switches "
      "per 1000 steps{}",
      controller_summary.value("controller", ""), controller_summary.value("active_fraction", 0.0),
      100.0 * controller_summary.value("exceedance_rate", 0.0),
      controller_summary.value("switches_per_1000_steps", 0.0),
      config.precision.has_low_path
          ? ""
          : " (precision.recipe " + config.precision.name +
                " has no low path: every unit ran the same GEMMs whatever the plan)");
  return summary;
}

}  // namespace
}  // namespace gnmr
