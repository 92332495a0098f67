#include "train/bench.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "backend/cpu/blas_autotune.h"
#include "backend/cpu/cpu_backend.h"
#include "train/make_backend.h"
#include "train/session.h"
#include "util/error.h"
#ifdef GNMR_WITH_CUDA
#include "backend/cuda/gemm_peak.h"
#endif

using nlohmann::json;

namespace gnmr {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double datasheet_bf16_tflops(const std::string& device) {
  auto has = [&](const char* part) { return device.find(part) != std::string::npos; };
  if (has("H100")) return has("PCIe") ? 756.0 : has("NVL") ? 835.0 : 989.4;
  if (has("H200")) return has("NVL") ? 835.0 : 989.4;
  if (has("A100")) return 312.0;
  return 0.0;
}

nlohmann::json projection_gemm_impls(const LlamaModel& model, const Backend& backend) {
  const PrecisionRecipe& recipe = model.recipe();
  auto shape_of = [&](const ParamInfo& p) {
    return ProjectionShape{model.tokens_per_micro_batch(), p.shape[1], p.shape[0], false};
  };
  json out = json::object();
  for (const ProjectionUnit& unit : model.units()) {
    if (unit.layer != 0) continue;
    const ProjectionShape shape = shape_of(model.params()[size_t(unit.param_index)]);
    json paths = {{"recovery", backend.describe_projection(shape, recipe.recovery)}};
    if (recipe.has_low_path) paths["low"] = backend.describe_projection(shape, recipe.low);
    out[projection_kind_name(unit.kind)] = paths;
  }
  for (const ParamInfo& p : model.params()) {
    if (p.name != "lm_head.weight") continue;
    ProjectionShape head = shape_of(p);
    head.backward_may_overwrite_dy = true;
    out["lm_head"] = {{"recovery", backend.describe_projection(head, PathSpec{})}};
  }
  return out;
}

double measure_gemm_peak_gflops(const RunConfig& config, int64_t size, int repeats) {
#ifdef GNMR_WITH_CUDA
  // A GPU trains on bf16 tensor cores: its peak is cuBLASLt's bf16 GEMM (fp32 accumulation),
  // timed on the device without conversions or launch gaps (backend/cuda/gemm_peak.h).
  if (config.backend == "cuda") {
    return bf16_gemm_peak_gflops(cuda_device_of_this_process(), size, repeats);
  }
#endif
  // The CPU's is the fp32 sgemm its GEMMs run.
  std::unique_ptr<Backend> backend = make_backend(config);
  const int64_t m = size, n = size, k = size;
  Tensor x = backend->allocate("peak.x", {m, k}, DType::F32, MemoryRole::Scratch);
  Tensor w = backend->allocate("peak.w", {n, k}, DType::F32, MemoryRole::Scratch);
  Tensor y = backend->allocate("peak.y", {m, n}, DType::F32, MemoryRole::Scratch);
  std::vector<float> host(size_t(std::max(m, n) * k));
  for (size_t i = 0; i < host.size(); ++i) host[i] = float((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  backend->copy_from_host(x, host.data());
  backend->copy_from_host(w, host.data());
  double best = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    backend->matmul_forward(x, w, y, GemmPrecision::FP32);
    backend->synchronize();
    best = std::max(best, 2.0 * double(m) * double(n) * double(k) / seconds_since(t0) * 1e-9);
  }
  return best;
}

json blas_json(const BlasReport& r) {
  return {{"blas", r.library + " " + r.version},
          {"blas_kernel", r.kernel},
          {"blas_kernel_isa", r.kernel_isa},
          {"blas_kernel_chosen_by", r.chosen_by},
          {"blas_best_kernel", r.best_kernel},
          {"blas_kernel_weaker_than_cpu", r.weaker_than_cpu},
          {"blas_threads_per_gemm", r.threads_per_gemm},
          {"gemm_threads", r.cores},
          {"cpu_clock_ghz", r.clock_ghz},
          {"blas_kernel_nominal_gflops", r.kernel_nominal_gflops},
          {"blas_best_nominal_gflops", r.best_nominal_gflops}};
}

double gradient_sum_hidden_fraction(double blocking_sum_ms, double wait_ms) {
  if (!(blocking_sum_ms > 0)) return 0.0;
  return std::clamp(1.0 - wait_ms / blocking_sum_ms, 0.0, 1.0);
}

namespace {

// Mean ms of a blocking reduction of the whole gradient across the ranks, nothing else
// running: the sum, or with dist.zero=1 the reduce-scatter into the shards (what a step with
// dist.bucket_mb = 0 waits for). The barrier first so no rank's time includes waiting for another
// to arrive. The gradient it reduces is the last step's, already used: the values do not
// matter, the bytes moved do.
double time_blocking_gradient_sum(TrainingSession& session, int64_t repeats) {
  Communicator& comm = session.comm();
  Tensor grads = session.model().flat_grads();
  const bool zero = session.zero_optimizer() != nullptr;
  double total_ms = 0;
  for (int64_t i = 0; i < repeats; ++i) {
    comm.barrier();
    auto t0 = std::chrono::steady_clock::now();
    if (zero) {
      comm.reduce_scatter_sum(grads);
    } else {
      comm.allreduce_sum(grads);
    }
    comm.wait_for_collectives();  // nccl only queues the reduction on the device
    total_ms += seconds_since(t0) * 1e3;
  }
  return total_ms / double(repeats);
}

// The bench on a session that is set up: steps, timings, memory, the JSON.
json bench_session(const RunConfig& config, const BenchOptions& options, TrainingSession& session) {
  const bool cuda = config.backend == "cuda";
  // The peak is measured before and after the steps and the better one kept: on a shared
  // machine one measurement can land in a slow moment, and an MFU above 100% (achieved over
  // a peak taken while a neighbour ran) says nothing. Their spread is reported.
  const int64_t peak_size = cuda ? 8192 : 2048;
  const double peak_before = measure_gemm_peak_gflops(config, peak_size);
  if (session.comm().rank() != 0) spdlog::set_level(spdlog::level::warn);  // one log per job
  const double flops_per_token = double(session.model().flops_per_token());

  double total_s = 0, fb_ms = 0, norms_ms = 0, controller_ms = 0, optimizer_ms = 0, readback_ms = 0,
         sum_wait_ms = 0, gap_ms = 0;
  for (int64_t s = 0; s < options.warmup_steps + options.steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    StepResult r = session.run_step(s);
    const double step_s = seconds_since(t0);
    if (s < options.warmup_steps) continue;
    total_s += step_s;
    fb_ms += r.forward_backward_ms;
    norms_ms += r.norms_ms;
    controller_ms += r.controller_ms;
    gap_ms += r.recovery_gap_ms;
    optimizer_ms += r.optimizer_ms;
    readback_ms += r.readback_ms;
    sum_wait_ms += r.gradient_sum_wait_ms;
    spdlog::info("bench step {}: {:.1f} ms, loss {:.4f}", s - options.warmup_steps + 1,
                 step_s * 1e3, r.loss);
  }
  const double n = double(options.steps);
  const double step_ms = total_s / n * 1e3;
  const double tokens_per_s = double(session.tokens_per_step()) / (total_s / n);
  const double achieved_gflops = flops_per_token * tokens_per_s * 1e-9;  // the whole job's
  // MFU is per device: the job's work shared by its ranks, against one device's peak.
  const double achieved_gflops_per_rank = achieved_gflops / double(session.comm().world_size());
  // The norm pass timed alone with its device time: a step's norms_ms is only the time to
  // enqueue it on the GPU (StepResult).
  const double norm_pass_ms = session.time_norm_pass(options.steps);
  // Where a step's device time goes, on a backend that times its ops (cuda): steps of their
  // own, so the events around every op weigh on none of the figures above.
  const int64_t timed_steps = std::min<int64_t>(options.steps, 3);
  session.backend().set_op_timing(true);
  auto timed_start = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < timed_steps; ++s) {
    session.run_step(options.warmup_steps + options.steps + s);
  }
  const std::map<std::string, double> op_totals = session.backend().op_times_ms();
  const double timed_step_ms = seconds_since(timed_start) * 1e3 / double(timed_steps);
  session.backend().set_op_timing(false);
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  const int64_t peak_rss = int64_t(usage.ru_maxrss) * 1024;
  // After the steps: the op workspaces have reached their high-water marks.
  const MemoryUse memory = session.backend().memory_use();
  json memory_by_role = json::object();
  for (int role = 0; role < kMemoryRoles; ++role) {
    memory_by_role[memory_role_name(MemoryRole(role))] = memory.bytes[role];
  }

  // The session still holds its memory: a run that fits with little to spare may have no room
  // for the measurement's operands, and then the peak taken before the steps stands.
  double peak_after = 0.0;
  try {
    peak_after = measure_gemm_peak_gflops(config, peak_size);
  } catch (const Error& e) {
    spdlog::warn(
        "the GEMM peak after the steps could not be measured ({}); MFU is against the "
        "peak measured before them",
        e.what());
  }
  const double peak_gflops = std::max(peak_before, peak_after);

  json result = {
      {"gnmr", options.build_id},
      {"model", config.model.name},
      {"parameters", session.model().num_params()},
      {"recipe", config.resolved["precision"]["recipe"]},
      {"controller", config.gnmr.controller},
      {"threads", config.train.threads},
      {"tokens_per_step", session.tokens_per_step()},
      {"steps", options.steps},
      {"tokens_per_s", tokens_per_s},
      {"step_ms", step_ms},
      {"achieved_gflops", achieved_gflops},
      {"gemm_peak_gflops", peak_gflops},
      {"gemm_peak_before_gflops", peak_before},
      {"gemm_peak_after_gflops", peak_after},
      {"gemm_peak_precision", cuda ? "bf16" : "fp32"},
      {"device", session.backend().device()},
      {"achieved_gflops_per_rank", achieved_gflops_per_rank},
      {"mfu", achieved_gflops_per_rank / peak_gflops},
      {"peak_mem_bytes", peak_rss},
      {"backend_bytes", memory.total()},
      {"backend_bytes_by_role", memory_by_role},
      {"backend_peak_bytes", session.backend().peak_allocated_bytes()},
      // AdamW moments on this rank: all of them, or a ZeRO-1 shard (dist.zero).
      {"optimizer_state_bytes_per_rank", session.optimizer_state_bytes()},
      {"dist_zero", config.dist.zero},
      {"world_size", session.comm().world_size()},
      {"rank", session.comm().rank()},
      {"forward_backward_ms", fb_ms / n},
      {"norms_ms", norms_ms / n},
      {"controller_ms", controller_ms / n},
      {"recovery_gap_ms", gap_ms / n},
      {"optimizer_ms", optimizer_ms / n},
      {"readback_ms", readback_ms / n},
      {"norm_pass_ms", norm_pass_ms},
      // The oracle's gap passes are its controller's cost.
      {"controller_and_norms_fraction", (norm_pass_ms + controller_ms / n + gap_ms / n) / step_ms},
      {"gemm_impl", projection_gemm_impls(session.model(), session.backend())},
      {"attention", session.model().attention_kernel()}};
  if (session.comm().world_size() > 1) {
    const double blocking_ms = time_blocking_gradient_sum(session, options.steps);
    result["ranks"] = session.comm().world_size();
    result["bucket_mb"] = config.dist.bucket_mb;
    result["gradient_reduction"] = config.dist.zero == 1 ? "reduce_scatter" : "allreduce";
    result["gradient_sum_ms"] = blocking_ms;
    // On a GPU an unbucketed reduction runs in order on the backend's stream, so all of it is
    // waited for; the host's enqueue time says nothing.
    const double wait_ms = cuda && config.dist.bucket_mb == 0 ? blocking_ms : sum_wait_ms / n;
    result["gradient_sum_wait_ms"] = wait_ms;
    result["gradient_sum_hidden_fraction"] = gradient_sum_hidden_fraction(blocking_ms, wait_ms);
  }
  if (!op_totals.empty()) {
    json op_ms = json::object();
    double in_ops_ms = 0;
    for (const auto& [family, ms] : op_totals) {
      op_ms[family] = ms / double(timed_steps);
      in_ops_ms += ms / double(timed_steps);
    }
    result["op_ms"] = op_ms;  // per step, by op family (Backend::op_times_ms)
    result["op_ms_total"] = in_ops_ms;
    result["op_timed_step_ms"] = timed_step_ms;
    result["op_timed_steps"] = timed_steps;
  }
  if (!cuda) result.update(blas_json(blas_report(cpu_backend_threads(config.train.threads))));
  const double datasheet = cuda ? datasheet_bf16_tflops(session.backend().device()) : 0.0;
  if (datasheet > 0) {
    result["datasheet_peak_gflops"] = datasheet * 1e3;
    result["mfu_datasheet"] = achieved_gflops_per_rank / (datasheet * 1e3);
  }
  return result;
}

}  // namespace

json run_bench(const RunConfig& config, const BenchOptions& options) {
  if (options.steps < 1) throw Error(ErrorKind::Usage, "bench: --steps must be >= 1");
  // The session first: on a GPU its backend may run the wgmma trial in a process of its own,
  // before this process has a CUDA context (make_backend.h), which the peak's GEMMs would make.
  TrainingSession session(config, /*synthetic_data=*/true);
  return run_or_end_job(session.comm(), [&] { return bench_session(config, options, session); });
}

}  // namespace gnmr
