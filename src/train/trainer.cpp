#include "train/trainer.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <sstream>

#include "train/checkpoint.h"
#include "train/hf_format.h"
#include "train/metrics.h"
#include "train/session.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/log.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gnmr {

namespace {

std::atomic<int> g_stop_signal{0};

void on_stop_signal(int signal) { g_stop_signal.store(signal); }

bool holds_a_run(const fs::path& dir) {
  return fs::exists(dir / "config.json") || fs::exists(dir / "metrics.jsonl") ||
         fs::exists(dir / "checkpoints");
}

// Decides which checkpoint to resume from (or none) and prepares the directory.
std::string prepare_run_dir(const TrainOptions& options) {
  fs::path dir = options.out_dir;
  if (!options.resume.empty()) {
    if (options.force) throw Error(ErrorKind::Usage, "--resume and --force cannot be combined");
    if (options.resume != "auto") {
      if (!fs::exists(fs::path(options.resume) / "trainer.json")) {
        throw Error(ErrorKind::Checkpoint, "--resume " + options.resume + " is not a gnmr checkpoint directory");
      }
      return options.resume;
    }
    std::string latest = find_latest_checkpoint(dir.string());
    if (latest.empty()) {
      if (holds_a_run(dir)) {
        throw Error(ErrorKind::Checkpoint, "--resume auto: " + dir.string() +
                                               " holds a run but no complete checkpoint; use --force to restart it");
      }
      spdlog::info("--resume auto: no checkpoint in {}, starting a fresh run", dir.string());
    }
    return latest;
  }
  if (holds_a_run(dir)) {
    if (!options.force) {
      throw Error(ErrorKind::Checkpoint, "run directory " + dir.string() +
                                             " already holds a run; pass --resume auto to continue it or --force to replace it");
    }
    fs::remove_all(dir / "checkpoints");
    fs::remove(dir / "metrics.jsonl");
    fs::remove(dir / "config.json");
    fs::remove(dir / "log.txt");
  }
  return "";
}

int64_t peak_rss_bytes() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return int64_t(usage.ru_maxrss) * 1024;
}

std::string format_duration(double seconds) {
  int64_t s = int64_t(seconds);
  char text[32];
  std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60),
                (long long)(s % 60));
  return text;
}

}  // namespace

TrainSummary run_training(const RunConfig& config, const TrainOptions& options) {
  if (options.out_dir.empty()) throw Error(ErrorKind::Usage, "--out DIR is required");
  std::string resume_from = prepare_run_dir(options);
  fs::create_directories(options.out_dir);
  add_log_file((fs::path(options.out_dir) / "log.txt").string());
  write_file_atomic((fs::path(options.out_dir) / "config.json").string(), config.resolved.dump(2) + "\n");

  TrainingSession session(config, /*synthetic_data=*/false);
  TrainerState& state = session.state();
  if (!resume_from.empty()) {
    state = load_checkpoint(resume_from, config, session.backend(), session.model(), session.optimizer());
    session.restore_controller_state();
    spdlog::info("resumed from {} at step {}", resume_from, state.step);
  } else if (!options.init.empty()) {
    load_model_weights(options.init, session.backend(), session.model());
    spdlog::info("initialised weights from {}", options.init);
  }

  MetricsWriter metrics;
  metrics.open((fs::path(options.out_dir) / "metrics.jsonl").string(), state.step);
  MetricsWriter trace;
  if (config.log.gnmr_trace) trace.open((fs::path(options.out_dir) / "gnmr_trace.jsonl").string(), state.step);

  g_stop_signal.store(0);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);

  const TrainConfig& train = config.train;
  const double flops_per_token = double(session.model().flops_per_token());
  spdlog::info("model {}: {} layers, dim {}, {} projection units; {} steps × {} tokens ({} micro-steps of {}×{})",
               config.model.name, config.model.n_layers, config.model.dim, session.model().units().size(),
               train.steps, train.global_batch_tokens, session.accumulation_steps(), train.micro_batch,
               config.data.seq_len);

  TrainSummary summary;
  auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = state.step;
  double window_loss = 0;
  int window_count = 0;
  for (int64_t s = state.step; s < train.steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    StepResult r = session.run_step(s);
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
                 {"backend_bytes", session.backend().allocated_bytes()},
                 {"peak_rss_bytes", peak_rss_bytes()},
                 {"units_recovery", r.units_recovery},
                 {"controller_ms", r.controller_ms}};
    line.update(r.controller_fields);
    metrics.write(line);
    if (config.log.gnmr_trace) {
      std::ostringstream text;
      session.controller().write_trace_line(text);
      trace.write_line(text.str());
    }
    summary.final_loss = r.loss;

    if (r.skipped) {
      spdlog::warn("step {}: non-finite loss or gradient (loss {}, grad norm {}); update skipped ({} in a row)",
                   r.step, r.loss, r.grad_norm, state.consecutive_nonfinite);
      if (state.consecutive_nonfinite >= train.max_nonfinite_steps) {
        std::string last = find_latest_checkpoint(options.out_dir);
        throw Error(ErrorKind::Diverged,
                    "training stopped: " + std::to_string(state.consecutive_nonfinite) +
                        " consecutive non-finite steps (train.max_nonfinite_steps); last good checkpoint: " +
                        (last.empty() ? "none" : last));
      }
    } else {
      window_loss += r.loss;
      window_count += 1;
    }

    if (r.step % config.log.every == 0 || r.step == train.steps) {
      double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      double per_step = elapsed / double(r.step - first_step);
      spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | {:.1f} ms | ETA {}",
                   r.step, train.steps, window_count ? window_loss / window_count : NAN, r.lr, r.grad_norm,
                   tokens_per_s, step_s * 1e3, format_duration(per_step * double(train.steps - r.step)));
      window_loss = 0;
      window_count = 0;
    }

    const bool last = r.step == train.steps;
    if ((config.eval.every > 0 && r.step % config.eval.every == 0) || last) {
      double val_loss = session.evaluate(config.eval.tokens);
      if (std::isfinite(val_loss)) {
        metrics.write({{"kind", "eval"}, {"step", r.step}, {"val_loss", val_loss}, {"val_ppl", std::exp(val_loss)}});
        spdlog::info("step {:>6} | val loss {:.4f} | val ppl {:.2f}", r.step, val_loss, std::exp(val_loss));
        summary.final_val_loss = val_loss;
      }
    }
    const bool stop = g_stop_signal.load() != 0 || r.step == options.stop_at;
    if ((config.checkpoint.every > 0 && r.step % config.checkpoint.every == 0) || last || stop) {
      session.save_controller_state();
      save_checkpoint(options.out_dir, config, session.backend(), session.model(), session.optimizer(), state);
    }
    summary.steps_done = r.step;
    if (stop && !last) {
      spdlog::warn("stopped after step {} ({}); checkpointed, continue with --resume auto", r.step,
                   g_stop_signal.load() ? "signal " + std::to_string(g_stop_signal.load()) : std::string("--stop-at"));
      summary.stopped_by_signal = true;
      break;
    }
  }
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGUSR1, SIG_DFL);
  json controller_summary = session.controller().summary();
  write_file_atomic((fs::path(options.out_dir) / "gnmr_summary.json").string(), controller_summary.dump(2) + "\n");
  spdlog::info("controller {}: active fraction {:.4f}, threshold exceedance rate {:.4f}%, {:.1f} switches per 1000 steps",
               controller_summary.value("controller", ""), controller_summary.value("active_fraction", 0.0),
               100.0 * controller_summary.value("exceedance_rate", 0.0),
               controller_summary.value("switches_per_1000_steps", 0.0));
  return summary;
}

}  // namespace gnmr
