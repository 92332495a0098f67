// A training session: everything one optimizer step needs (backend, model, optimizer,
// loaders, controller), built once from the config. `gnmr train` and `gnmr bench` both
// drive it; the step itself (docs/DESIGN.md §2) lives in run_step.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "controller/controller.h"
#include "data/loader.h"
#include "model/llama.h"
#include "parallel/communicator.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/overlapped_gradient_sum.h"
#include "train/zero_optimizer.h"

namespace gnmr {

struct StepResult {
  int64_t step = 0;  // 1-based index of the step just taken
  double loss = 0;   // mean training loss over the global batch
  double lr = 0;
  double grad_norm = 0;  // global L2 norm before clipping
  bool skipped = false;  // non-finite loss or gradient: no update
  // Host time between the calls that issue each part of the step; none of them waits for the
  // backend. The CPU backend runs every op before returning, so on it these are the work
  // itself; on an asynchronous backend they are enqueue times and the work shows up in
  // readback_ms, the wait in the step's one readback. controller_ms is host work either way.
  double forward_backward_ms = 0, norms_ms = 0, optimizer_ms = 0, readback_ms = 0,
         controller_ms = 0;
  // The oracle's (or log.recovery_gap's) two extra forward+backward passes before the step,
  // waited for: 0 without them.
  double recovery_gap_ms = 0;
  // Part of forward_backward_ms, with more than one rank: the host time from the end of the
  // last backward until the gradients are summed across ranks (dist.zero=1: reduce-scattered
  // into the shards; dist.bucket_mb = 0: the whole reduction; overlapped: what is left of it
  // once backward is done). On nccl with buckets it is the device's wait, not the host's
  // (Communicator::last_overlap_wait_ms), and not part of forward_backward_ms.
  double gradient_sum_wait_ms = 0;
  std::vector<float> unit_grad_norms;  // one per projection unit, before clipping
  int units_recovery = 0;              // units this step ran on the recovery path
  size_t saved_activation_bytes = 0;   // what the projections saved for their weight gradients
  nlohmann::json controller_fields;    // the controller's per-step telemetry
};

// Test hooks (config section "debug"): make a step's gradient non-finite (the whole update
// path sees it), or multiply one projection unit's measured gradient norm, as a transient
// spike appears to the controller, without changing the update.
struct DebugHooks {
  std::vector<int64_t> nonfinite_grad_steps;  // 1-based steps
  int spike_unit = -1;
  std::vector<int64_t> spike_steps;
  double spike_scale = 100.0;
  // After these steps' update the last rank moves one weight, or flips unit 0's path in the
  // next plan, so the replicas diverge and the dist.check_every check can be seen to fire.
  std::vector<int64_t> diverge_weights_steps, diverge_plan_steps;
  // At the start of step crash_step (1-based), rank crash_rank dies by SIGKILL, with no
  // cleanup, as a node failure looks to the other ranks (they must end, not hang).
  int crash_rank = -1;
  int64_t crash_step = 0;
};

class TrainingSession {
 public:
  // synthetic_data: train on counter-hashed random tokens instead of shards (bench only).
  TrainingSession(const RunConfig& config, bool synthetic_data);

  StepResult run_step(int64_t step_index /* 0-based */);
  bool has_validation() const { return bool(val_loader_); }  // data.val is set
  double evaluate(int64_t token_budget);  // mean validation loss; NaN without data.val
  // The tokens evaluate() scores: TOKEN_BUDGET rounded down to whole batches and to the
  // validation set (`gnmr eval --tokens` with this count scores the same windows).
  int64_t eval_tokens(int64_t token_budget) const;
  // The training shards as a resume compares them: "N shard(s), T tokens, files HHHHHHHH" (a
  // hash of their names and sizes); "" on synthetic tokens.
  std::string train_data_fingerprint() const;

  // The controller state goes into state().controller_state before a checkpoint and comes
  // back from it after a resume. A refused state is a Checkpoint error naming
  // CHECKPOINT_DIR/controller.bin and whether it is damaged or from other gnmr.* options.
  void save_controller_state() { state_.controller_state = controller_->save_state(); }
  void restore_controller_state(const std::string& checkpoint_dir);

  Communicator& comm() { return *comm_; }
  Backend& backend() { return *backend_; }
  Controller& controller() { return *controller_; }
  LlamaModel& model() { return *model_; }
  // The plain optimizer (dist.zero = 0) or the ZeRO-1 one (dist.zero = 1, else null).
  AdamW& optimizer();
  ZeroAdamW* zero_optimizer() { return zero_optimizer_.get(); }
  size_t optimizer_state_bytes() const;  // this rank's AdamW moments
  TrainerState& state() { return state_; }
  const RunConfig& config() const { return config_; }
  int accumulation_steps() const { return accumulation_steps_; }
  int64_t tokens_per_step() const;
  // Mean ms of the norm pass alone (every parameter's squared gradient norm, the clip factor),
  // the backend synchronized before and after each of `repeats`: its device time, which a
  // step's norms_ms is not on an asynchronous backend. Overwrites the last step's norms and
  // clip factor: for bench, after its steps.
  double time_norm_pass(int64_t repeats);

 private:
  // Everything the constructor does once the communicator exists: checks that every rank has
  // the same config, then builds model, optimizer, buckets, controller, step buffers, loaders. Run
  // under run_or_end_job, so one rank's failure ends the job instead of leaving the others in a
  // collective.
  void set_up_on_communicator();
  void fill_batch(int64_t step_index, int micro_step);
  // How many validation batches TOKEN_BUDGET buys; an Error (Config: the budget is under one
  // batch; Data: the shards hold under one batch) otherwise. Checked at setup too.
  int64_t eval_batches(int64_t token_budget) const;
  // The step's fused norm pass: squared norms into grad_sum_squares_, clip factor and finite
  // flag into grad_clip_ (enqueued; nothing waits).
  void issue_norm_pass();
  // The controller's plan plus the layers precision.recovery_layers pins to recovery.
  RoutingPlan with_fixed_recovery(RoutingPlan plan) const;
  // debug.diverge_*_steps, then the dist.check_every check (replica_check.h).
  void check_replicas(int64_t step);
  // log.recovery_gap / the oracle (README "The oracle selector"): the step's batches through
  // forward+backward with every unit Low, then every unit on Recovery, at the step's weights;
  // per unit ||g_low - g_recovery|| / ||g_recovery|| of its weight gradient. Leaves the
  // gradients to the step's own pass, which zeroes them first.
  std::vector<float> measure_recovery_gaps(int64_t step_index);
  void unit_gradients_on(Path path, int64_t step_index, std::vector<std::vector<float>>& grads);

  RunConfig config_;
  bool synthetic_data_;
  DebugHooks debug_;
  std::unique_ptr<Backend> backend_;
  // After the backend, so destroyed before it: the nccl communicator queues on its stream.
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<ZeroAdamW> zero_optimizer_;
  std::unique_ptr<TokenLoader> train_loader_;
  std::unique_ptr<TokenLoader> val_loader_;
  std::unique_ptr<Controller> controller_;
  // With more than one rank and dist.bucket_mb > 0: the reduction that overlaps backward (the
  // sum, or with dist.zero=1 the reduce-scatter into the shards).
  std::unique_ptr<OverlappedGradientSum> overlapped_sum_;
  RoutingPlan plan_;  // the path of every projection unit for the next step
  TrainerState state_;
  int accumulation_steps_ = 1;
  std::vector<int32_t> tokens_, targets_;
  std::vector<Tensor> grads_;
  // The step's scalars, computed and consumed in backend memory and read back once per step
  // (after the update is issued): f64 [1 + params] = the loss summed over micro-steps, then
  // each parameter's squared gradient norm. loss_sum_ and grad_sum_squares_ are views of it.
  Tensor step_scalars_, loss_sum_, grad_sum_squares_;
  Tensor grad_clip_;  // f32 [2]: clip factor, finite flag (Backend::global_norm_clip)
  std::vector<double> host_step_scalars_;
  bool measure_gaps_ = false;  // log.recovery_gap or gnmr.controller = oracle
  Tensor gap_loss_;            // f64 [1]: the measurement passes' loss, unused
  std::vector<std::vector<float>> low_grads_, recovery_grads_;  // [unit][element], host
};

}  // namespace gnmr
