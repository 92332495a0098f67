#include "train/session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <filesystem>

#include "controller/units.h"
#include "data/counter_hash.h"
#include "train/data_checks.h"
#include "train/lr_schedule.h"
#include "train/make_backend.h"
#include "train/replica_check.h"
#include "train/run_controller.h"
#include "util/error.h"
#include "util/fnv1a.h"
#include "util/json_integer.h"

using nlohmann::json;

namespace gnmr {

namespace {

// Whether VALUE is the same on every rank (a collective).
bool agree_on_value(Communicator& comm, const json& value) {
  const std::string text = value.dump();
  return comm.all_agree(fnv1a(text.data(), text.size()));
}

// The settings whose values differ between the ranks, "train.lr, data.train": each key of
// the config schema, two levels deep, agreed on in the schema's order, which every rank's
// binary shares (a collective per section, and per key of a differing section).
std::string settings_that_differ(Communicator& comm, const json& resolved) {
  std::string differ;
  for (const auto& [section, keys] : default_config_json().items()) {
    const json mine = resolved.value(section, json());
    if (agree_on_value(comm, mine)) continue;
    if (!keys.is_object()) {
      differ += (differ.empty() ? "" : ", ") + section;
      continue;
    }
    for (const auto& [key, unused] : keys.items()) {
      const json value = mine.is_object() ? mine.value(key, json()) : json();
      if (!agree_on_value(comm, value))
        differ += (differ.empty() ? "" : ", ") + section + "." + key;
    }
  }
  return differ.empty() ? "settings outside the schema" : differ;
}

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since)
      .count();
}

// section[key] as step numbers, each a JSON integer (util/json_integer.h).
std::vector<int64_t> debug_steps(const json& section, const char* key) {
  std::vector<int64_t> steps;
  for (const json& step : section.at(key)) {
    const std::optional<int64_t> value = json_int64(step);
    if (!value) {
      throw Error(ErrorKind::Config, std::string("config: \"debug.") + key +
                                         "\" must hold integer steps, got " + step.dump());
    }
    steps.push_back(*value);
  }
  return steps;
}

// section[key] as an integer in [min, max] (util/json_integer.h): 4294967296 is not unit 0.
int64_t debug_integer(const json& section, const char* key, int64_t min, int64_t max) {
  const json& value = section.at(key);
  const std::optional<int64_t> read = json_int64(value);
  if (!read || *read < min || *read > max) {
    throw Error(ErrorKind::Config, std::string("config: \"debug.") + key +
                                       "\" must be an integer in [" + std::to_string(min) + ", " +
                                       std::to_string(max) + "], got " + value.dump());
  }
  return *read;
}

DebugHooks debug_hooks_from(const json& section) {
  DebugHooks h;
  try {
    h.nonfinite_grad_steps = debug_steps(section, "nonfinite_grad_steps");
    h.spike_unit = int(debug_integer(section, "spike_unit", -1, INT_MAX));
    h.spike_steps = debug_steps(section, "spike_steps");
    h.spike_scale = section.at("spike_scale");
    h.diverge_weights_steps = debug_steps(section, "diverge_weights_steps");
    h.diverge_plan_steps = debug_steps(section, "diverge_plan_steps");
    h.crash_rank = int(debug_integer(section, "crash_rank", -1, INT_MAX));
    h.crash_step = debug_integer(section, "crash_step", 0, INT64_MAX);
  } catch (const json::exception&) {  // the integers above throw their own errors
    throw Error(ErrorKind::Config, "config: a \"debug\" field is missing or of the wrong type");
  }
  return h;
}

bool contains(const std::vector<int64_t>& list, int64_t value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

}  // namespace

TrainingSession::TrainingSession(const RunConfig& config, bool synthetic_data)
    : config_(config), synthetic_data_(synthetic_data) {
  debug_ = debug_hooks_from(config.resolved.at("debug"));
  if (debug_.spike_unit >= kKindsPerLayer * config.model.n_layers) {
    throw Error(ErrorKind::Config,
                "config: \"debug.spike_unit\" (" + std::to_string(debug_.spike_unit) +
                    ") is not a unit id: the model has " +
                    std::to_string(kKindsPerLayer * config.model.n_layers) + " projection units");
  }
  // Before the communicator: a backend this binary lacks stops the run before any rank joins.
  // The model's attention shape goes with it, for a trial the backend runs before its context.
  backend_ = make_backend(
      config, llama_attention_shape(config.model, config.train.micro_batch, config.data.seq_len));
  comm_ = make_communicator(config, *backend_);
  run_or_end_job(*comm_, [this] { set_up_on_communicator(); });
}

void TrainingSession::set_up_on_communicator() {
  const RunConfig& config = config_;
  // The first collective: ranks started with different configs (a stale file on one node)
  // would make collectives of different sizes, so they stop here, all at once.
  if (!agree_on_value(*comm_, config.resolved)) {
    throw Error(ErrorKind::Usage,
                "the ranks of this job were started with different configs (they differ in " +
                    settings_that_differ(*comm_, config.resolved) + ")");
  }
  const int seq_len = config.data.seq_len;
  const int micro_batch = config.train.micro_batch;
  accumulation_steps_ = accumulation_steps_for(config, comm_->world_size());
  // ZeRO-1 cuts the flat buffers into equal shards, so they are padded to world × 64 elements.
  const bool zero = config.dist.zero == 1;
  model_ = std::make_unique<LlamaModel>(config.model, *backend_, micro_batch, seq_len,
                                        config.precision, SavedInputSharing::kShared,
                                        zero ? int64_t(comm_->world_size()) * kZeroShardAlign : 1);
  model_->init_weights(config.train.seed);
  if (zero) {
    zero_optimizer_ = std::make_unique<ZeroAdamW>(*backend_, *comm_, *model_, config.train);
  } else {
    optimizer_ = std::make_unique<AdamW>(*backend_, model_->params(), config.train);
  }
  if (comm_->world_size() > 1 && config.dist.bucket_mb > 0) {
    // ZeRO-1 reduce-scatters each bucket into the ranks' shards, plain data parallelism sums it.
    overlapped_sum_ = std::make_unique<OverlappedGradientSum>(
        *comm_, *model_, config.dist.bucket_mb,
        zero ? GradientReduction::kReduceScatter : GradientReduction::kAllReduce);
    if (comm_->rank() == 0) {  // one human log per job
      spdlog::info(
          "gradient {} over {} ranks: {} buckets of up to {} MiB, overlapped with backward",
          zero ? "reduce-scatter" : "sum", comm_->world_size(), overlapped_sum_->buckets().size(),
          config.dist.bucket_mb);
    }
  }
  const SettingsWarnings warnings = comm_->rank() != 0 ? SettingsWarnings::kNone
                                    : synthetic_data_  ? SettingsWarnings::kAllButTrainSteps
                                                       : SettingsWarnings::kAll;
  controller_ = make_run_controller(config, comm_->world_size(), warnings);
  measure_gaps_ = config.log.recovery_gap || controller_->needs_recovery_gaps();
  if (measure_gaps_) {
    gap_loss_ = backend_->allocate("recovery_gap_loss", {1}, DType::F64, MemoryRole::Scratch);
    spdlog::info(
        "recovery gap: every step also runs its batches with all units low, then all on "
        "recovery (two extra forward+backward passes, about 3x the step's cost; research "
        "only){}",
        config.gnmr.oracle_same_step ? "; the oracle recovers on the step it measured" : "");
  }
  plan_ = with_fixed_recovery(controller_->initial_plan());
  for (const auto& p : model_->params()) grads_.push_back(p.grad);
  if (!zero_optimizer_) backend_->plan_sum_squares(grads_);  // ZeroAdamW plans its own
  const int64_t num_params = int64_t(grads_.size());
  step_scalars_ =
      backend_->allocate("step_scalars", {1 + num_params}, DType::F64, MemoryRole::Scratch);
  loss_sum_ = tensor_view(step_scalars_, {1}, 0);
  grad_sum_squares_ = tensor_view(step_scalars_, {num_params}, 1);
  grad_clip_ = backend_->allocate("grad_clip", {2}, DType::F32, MemoryRole::Scratch);
  host_step_scalars_.resize(size_t(1 + num_params));
  tokens_.resize(size_t(micro_batch) * seq_len);
  targets_.resize(tokens_.size());

  if (!synthetic_data_) {
    TrainingData data =
        open_training_data(config, comm_->rank(), comm_->world_size(), accumulation_steps_);
    train_loader_ = std::move(data.train);
    val_loader_ = std::move(data.val);
  }
}

std::string TrainingSession::train_data_fingerprint() const {
  if (!train_loader_) return "";
  uint64_t h = kFnv1aOffsetBasis;
  for (const std::string& path : train_loader_->shard_paths()) {
    std::error_code ec;
    const std::string entry = std::filesystem::path(path).filename().string() + ":" +
                              std::to_string(std::filesystem::file_size(path, ec)) + ";";
    h = fnv1a(entry.data(), entry.size(), h);
  }
  return fmt::format("{} shard(s), {} tokens, files {:016x}", train_loader_->shard_paths().size(),
                     train_loader_->total_tokens(), h);
}

RoutingPlan TrainingSession::with_fixed_recovery(RoutingPlan plan) const {
  const DecisionUnits& units = controller_->decision_units();
  for (int d = 0; d < units.n_decision_units(); ++d) {
    if (!controller_->pinned()[d]) continue;
    for (UnitId unit : units.members(d)) plan.path[size_t(unit)] = Path::Recovery;
  }
  return plan;
}

AdamW& TrainingSession::optimizer() {
  GNMR_CHECK(optimizer_ != nullptr, "dist.zero=1: the optimizer is zero_optimizer()");
  return *optimizer_;
}

size_t TrainingSession::optimizer_state_bytes() const {
  if (zero_optimizer_) return zero_optimizer_->state_bytes();
  size_t bytes = 0;
  for (const auto& p : model_->params()) bytes += 2 * size_t(p.weight.bytes());
  return bytes;
}

int64_t TrainingSession::tokens_per_step() const {
  return config_.train.global_batch_tokens;
}

void TrainingSession::fill_batch(int64_t step_index, int micro_step) {
  if (train_loader_) {
    train_loader_->next_batch_at(step_index, micro_step, config_.train.micro_batch, tokens_.data(),
                                 targets_.data());
    return;
  }
  // Synthetic tokens for throughput measurement: values do not change the work done.
  const uint64_t vocab = uint64_t(config_.model.vocab_size);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    tokens_[i] = int32_t(
        hash_values({uint64_t(comm_->rank()), uint64_t(step_index), uint64_t(micro_step), i}) %
        vocab);
  }
  for (size_t i = 0; i < tokens_.size(); ++i) targets_[i] = tokens_[(i + 1) % tokens_.size()];
}

void TrainingSession::restore_controller_state(const std::string& checkpoint_dir) {
  load_controller_state(*controller_, state_.controller_state, checkpoint_dir);
  plan_ = with_fixed_recovery(controller_->current_plan());
}

void TrainingSession::issue_norm_pass() {
  if (zero_optimizer_) {
    zero_optimizer_->sum_squares(grad_sum_squares_);
  } else {
    backend_->sum_squares(grads_, grad_sum_squares_);
  }
  backend_->global_norm_clip(grad_sum_squares_, loss_sum_, config_.train.grad_clip, grad_clip_);
}

double TrainingSession::time_norm_pass(int64_t repeats) {
  double total_ms = 0;
  for (int64_t i = 0; i < repeats; ++i) {
    backend_->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    issue_norm_pass();
    comm_->wait_for_collectives();  // dist.zero=1: the norms' sum across ranks
    backend_->synchronize();
    total_ms += elapsed_ms(t0);
  }
  return total_ms / double(repeats);
}

StepResult TrainingSession::run_step(int64_t step_index) {
  StepResult r;
  r.step = step_index + 1;
  if (debug_.crash_rank == comm_->rank() && debug_.crash_step == r.step) raise(SIGKILL);
  r.lr = learning_rate_at(config_.train, step_index);
  model_->set_step(step_index);
  if (measure_gaps_) {
    const auto gap_start = std::chrono::steady_clock::now();
    controller_->set_recovery_gaps(measure_recovery_gaps(step_index));
    r.recovery_gap_ms = elapsed_ms(gap_start);
    if (config_.gnmr.oracle_same_step)
      plan_ = with_fixed_recovery(controller_->oracle_plan(r.step));
  }
  model_->set_routing(plan_);
  r.units_recovery = model_->routing_stats().units_recovery;
  r.saved_activation_bytes = model_->routing_stats().saved_activation_bytes;

  // Everything up to the readback is issued without waiting for the backend (docs/DESIGN.md §6).
  auto t0 = std::chrono::steady_clock::now();
  model_->zero_grads();
  backend_->fill_zero(loss_sum_);
  const float loss_scale = 1.0f / float(accumulation_steps_);
  for (int m = 0; m < accumulation_steps_; ++m) {
    fill_batch(step_index, m);
    // Only the last micro-step's backward finishes gradients: that is when buckets may go.
    if (overlapped_sum_ && m == accumulation_steps_ - 1) {
      model_->set_gradient_ready_listener(overlapped_sum_.get());
    }
    model_->forward_backward(tokens_.data(), targets_.data(), loss_scale, loss_sum_);
    model_->set_gradient_ready_listener(nullptr);
  }
  if (zero_optimizer_) {
    // ZeRO-1: each rank ends with the mean gradient of its own shard (zero_optimizer.h).
    const auto wait_start = std::chrono::steady_clock::now();
    if (overlapped_sum_) {
      overlapped_sum_->finish();
    } else {
      zero_optimizer_->reduce_gradients();
    }
    r.gradient_sum_wait_ms = elapsed_ms(wait_start);
    zero_optimizer_->average_gradients();
    comm_->allreduce_sum(loss_sum_);
  } else if (comm_->world_size() > 1) {
    // Data parallel: every rank ends with the mean gradient and the loss sum of the global
    // batch, bit-identical on all ranks, so every rank's controller and update agree.
    const auto wait_start = std::chrono::steady_clock::now();
    Tensor grads = model_->flat_grads();
    if (overlapped_sum_) {
      overlapped_sum_->finish();
    } else {
      comm_->allreduce_sum(grads);
    }
    r.gradient_sum_wait_ms = elapsed_ms(wait_start);
    backend_->scale(grads, 1.0f / float(comm_->world_size()));
    comm_->allreduce_sum(loss_sum_);
  }
  if (contains(debug_.nonfinite_grad_steps, r.step)) backend_->scale(grads_[0], NAN);
  r.forward_backward_ms = elapsed_ms(t0);

  // One fused pass gives every parameter's squared gradient norm: the global norm for
  // clipping and each projection unit's norm for the controller come from it. The clip
  // factor and the finite flag (loss and norm) stay in backend memory for the optimizer,
  // which skips a non-finite step by itself.
  t0 = std::chrono::steady_clock::now();
  issue_norm_pass();
  r.norms_ms = elapsed_ms(t0);
  t0 = std::chrono::steady_clock::now();
  if (zero_optimizer_) {
    zero_optimizer_->step(r.lr, grad_clip_, r.step);
    zero_optimizer_->gather_weights();
  } else {
    optimizer_->step(r.lr, grad_clip_, r.step);
  }
  r.optimizer_ms = elapsed_ms(t0);

  // The step's one readback: the loss and the squared norms. The host recomputes the norm and
  // the skip decision from them in the order global_norm_clip used, so they agree with it.
  t0 = std::chrono::steady_clock::now();
  comm_->wait_for_collectives();  // the readback's wait has no deadline; this one does
  backend_->copy_to_host(step_scalars_, host_step_scalars_.data());
  r.readback_ms = elapsed_ms(t0);
  if (overlapped_sum_) {
    // nccl: the host did not wait for the overlapped reduction, the device did; its time.
    const double device_wait_ms = comm_->last_overlap_wait_ms();
    if (device_wait_ms >= 0) r.gradient_sum_wait_ms = device_wait_ms;
  }
  double loss_sum = host_step_scalars_[0];
  if (comm_->world_size() > 1) loss_sum /= comm_->world_size();
  r.loss = loss_sum / accumulation_steps_;
  const double* sum_squares = host_step_scalars_.data() + 1;
  double total = 0;
  for (size_t i = 0; i < grads_.size(); ++i) total += sum_squares[i];
  r.grad_norm = std::sqrt(total);
  const auto& units = model_->units();
  r.unit_grad_norms.resize(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    r.unit_grad_norms[u] = float(std::sqrt(sum_squares[size_t(units[u].param_index)]));
  }
  if (debug_.spike_unit >= 0 && contains(debug_.spike_steps, r.step)) {
    r.unit_grad_norms[size_t(debug_.spike_unit)] *= float(debug_.spike_scale);
  }

  // The controller sees every step's norms, non-finite ones included (it treats them as
  // maximally risky without letting them into its history), and plans the next step; the
  // update it follows has already been issued.
  t0 = std::chrono::steady_clock::now();
  plan_ = with_fixed_recovery(controller_->observe(r.step, r.unit_grad_norms));
  r.controller_ms = elapsed_ms(t0);
  r.controller_fields = controller_->last_telemetry().metrics_fields();
  check_replicas(r.step);

  state_.step = r.step;
  state_.tokens_seen += tokens_per_step();
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    r.skipped = true;
    state_.consecutive_nonfinite += 1;
    state_.skipped_steps += 1;
    return r;
  }
  state_.consecutive_nonfinite = 0;
  return r;
}

void TrainingSession::unit_gradients_on(Path path, int64_t step_index,
                                        std::vector<std::vector<float>>& grads) {
  const auto& units = model_->units();
  RoutingPlan plan;
  plan.path.assign(units.size(), path);
  model_->set_routing(plan);
  model_->zero_grads();
  backend_->fill_zero(gap_loss_);
  const float loss_scale = 1.0f / float(accumulation_steps_);
  for (int m = 0; m < accumulation_steps_; ++m) {
    fill_batch(step_index, m);
    model_->forward_backward(tokens_.data(), targets_.data(), loss_scale, gap_loss_);
  }
  grads.resize(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    const Tensor& grad = grads_[size_t(units[u].param_index)];
    grads[u].resize(size_t(grad.numel()));
    backend_->copy_to_host(grad, grads[u].data());
  }
}

std::vector<float> TrainingSession::measure_recovery_gaps(int64_t step_index) {
  unit_gradients_on(Path::Low, step_index, low_grads_);
  unit_gradients_on(Path::Recovery, step_index, recovery_grads_);
  std::vector<float> gaps(low_grads_.size());
  for (size_t u = 0; u < gaps.size(); ++u) {
    double difference = 0, reference = 0;
    for (size_t i = 0; i < low_grads_[u].size(); ++i) {
      const double low = low_grads_[u][i], recovery = recovery_grads_[u][i];
      difference += (low - recovery) * (low - recovery);
      reference += recovery * recovery;
    }
    // A zero recovery gradient: no gap if the low one is zero too, else an unbounded one.
    gaps[u] = reference > 0 ? float(std::sqrt(difference / reference))
                            : (difference > 0 ? INFINITY : 0.0f);
  }
  return gaps;
}

void TrainingSession::check_replicas(int64_t step) {
  if (comm_->rank() == comm_->world_size() - 1) {
    if (contains(debug_.diverge_weights_steps, step)) {
      Tensor first = tensor_view(model_->flat_weights(), {1}, 0);
      float value = 0;
      backend_->copy_to_host(first, &value);
      value += 1.0f;
      backend_->copy_from_host(first, &value);
      model_->weights_changed();
    }
    if (contains(debug_.diverge_plan_steps, step)) {
      plan_.path[0] = plan_.path[0] == Path::Low ? Path::Recovery : Path::Low;
    }
  }
  const int64_t every = config_.dist.check_every;
  if (comm_->world_size() > 1 && every > 0 && step % every == 0) {
    check_replicas_agree(*comm_, *backend_, *model_, plan_, step);
  }
}

int64_t TrainingSession::eval_batches(int64_t token_budget) const {
  return eval_batch_count(config_, *val_loader_, token_budget);
}

int64_t TrainingSession::eval_tokens(int64_t token_budget) const {
  return eval_batches(token_budget) * config_.train.micro_batch * config_.data.seq_len;
}

double TrainingSession::evaluate(int64_t token_budget) {
  if (!val_loader_) return NAN;
  const int micro_batch = config_.train.micro_batch;
  const int64_t batches = eval_batches(token_budget);
  // Rank r evaluates batches r, r + world, ...; the sum is reduced across ranks.
  double sums[2] = {0.0, 0.0};  // loss sum, batch count
  for (int64_t b = comm_->rank(); b < batches; b += comm_->world_size()) {
    for (int row = 0; row < micro_batch; ++row) {
      const size_t offset = size_t(row) * size_t(config_.data.seq_len);
      val_loader_->eval_window(b * micro_batch + row, tokens_.data() + offset,
                               targets_.data() + offset);
    }
    sums[0] += model_->forward_loss(tokens_.data(), targets_.data());
    sums[1] += 1.0;
  }
  comm_->allreduce_sum(sums, 2);
  return sums[0] / sums[1];
}

}  // namespace gnmr
