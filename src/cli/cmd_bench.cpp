// `gnmr bench --config FILE [--set K=V]... [--steps N] [--threads N] [--backend cpu|cuda]`
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "cli/build_id.h"
#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/validators.h"
#include "train/bench.h"

namespace gnmr {

CommandAction add_bench_command(CLI::App& app) {
  auto flags = add_config_flags(app);
  auto options = std::make_shared<BenchOptions>();
  auto threads = std::make_shared<int>(-1);
  auto backend = std::make_shared<std::string>();
  app.add_option("--steps", options->steps, "Measured steps (after the warm-up steps)")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--warmup", options->warmup_steps, "Unmeasured warm-up steps")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--threads", *threads, "CPU threads (overrides train.threads; 0 = all cores)")
      ->check(at_least(0));
  app.add_option("--backend", *backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  return [flags, options, threads, backend] {
    ConfigFlags resolved = *flags;
    if (*threads >= 0) resolved.overrides.push_back("train.threads=" + std::to_string(*threads));
    if (!backend->empty()) resolved.overrides.push_back("backend=\"" + *backend + "\"");
    RunConfig config = resolved.load();
    options->build_id = gnmr_build_id();
    auto r = run_bench(config, *options);
    // One report per job: every rank measured the same steps, and two ranks' lines written at
    // once interleave in the launcher's forwarded output (mpirun cuts lines at its buffer).
    if (r["rank"].get<int>() != 0) return;
    std::printf("%s (%s, controller %s), %lld tokens/step, %d thread(s)\n",
                config.model.name.c_str(), r["recipe"].get<std::string>().c_str(),
                config.gnmr.controller.c_str(),
                static_cast<long long>(r["tokens_per_step"].get<int64_t>()), config.train.threads);
    std::printf("  parameters      %10.1f M\n", double(r["parameters"].get<int64_t>()) * 1e-6);
    std::printf("  tokens/s        %10.1f\n", r["tokens_per_s"].get<double>());
    std::printf("  attention       %s\n", r["attention"].get<std::string>().c_str());
    const double gap_ms = r["recovery_gap_ms"].get<double>();
    const std::string gap_part =
        gap_ms > 0 ? fmt::format(", recovery gap passes {:.1f}", gap_ms) : std::string();
    std::printf(
        "  step            %10.1f ms  (forward+backward %.1f, norms %.2f, optimizer %.1f, "
        "readback %.2f, controller %.3f%s)\n",
        r["step_ms"].get<double>(), r["forward_backward_ms"].get<double>(),
        r["norms_ms"].get<double>(), r["optimizer_ms"].get<double>(),
        r["readback_ms"].get<double>(), r["controller_ms"].get<double>(), gap_part.c_str());
    std::printf(
        "  achieved        %10.1f GFLOP/s per device of a measured %s GEMM peak of %.1f GFLOP/s: "
        "MFU %.1f%%\n",
        r["achieved_gflops_per_rank"].get<double>(),
        r["gemm_peak_precision"].get<std::string>().c_str(), r["gemm_peak_gflops"].get<double>(),
        100.0 * r["mfu"].get<double>());
    const double peak_before = r["gemm_peak_before_gflops"].get<double>();
    const double peak_after = r["gemm_peak_after_gflops"].get<double>();
    // 0 after: that measurement could not run (bench logged why); nothing to compare.
    const double peak_spread =
        peak_after > 0 ? std::abs(peak_before - peak_after) / std::max(peak_before, peak_after)
                       : 0.0;
    if (peak_spread > 0.10 || r["mfu"].get<double>() > 1.0) {
      std::printf(
          "  warning: the GEMM peak measured %.1f GFLOP/s before the steps and %.1f after (%.0f%% "
          "apart)%s: this machine's speed varied during the run, so its figures vary as much\n",
          peak_before, peak_after, 100.0 * peak_spread,
          r["mfu"].get<double>() > 1.0 ? ", and the steps ran faster than either" : "");
    }
    if (r.contains("datasheet_peak_gflops")) {
      std::printf("  datasheet       %10.1f GFLOP/s dense bf16 (%s): MFU %.1f%%\n",
                  r["datasheet_peak_gflops"].get<double>(), r["device"].get<std::string>().c_str(),
                  100.0 * r["mfu_datasheet"].get<double>());
    }
    if (r.contains("blas")) {  // the CPU backend's GEMMs
      std::printf("  BLAS            %s, kernel %s (%s; %s), %d thread(s) per GEMM on %d\n",
                  r["blas"].get<std::string>().c_str(), r["blas_kernel"].get<std::string>().c_str(),
                  r["blas_kernel_isa"].get<std::string>().c_str(),
                  r["blas_kernel_chosen_by"].get<std::string>().c_str(),
                  r["blas_threads_per_gemm"].get<int>(), r["gemm_threads"].get<int>());
      std::printf(
          "  GEMM peak       %10.1f GFLOP/s measured = %.0f%% of the %s kernel's nominal %.1f "
          "GFLOP/s (%d cores × %.2f GHz)\n",
          r["gemm_peak_gflops"].get<double>(),
          100.0 * r["gemm_peak_gflops"].get<double>() /
              r["blas_kernel_nominal_gflops"].get<double>(),
          r["blas_kernel"].get<std::string>().c_str(),
          r["blas_kernel_nominal_gflops"].get<double>(), r["gemm_threads"].get<int>(),
          r["cpu_clock_ghz"].get<double>());
      if (r["blas_kernel_weaker_than_cpu"].get<bool>()) {
        std::printf(
            "  warning: this CPU runs the %s kernel (nominal %.1f GFLOP/s): MFU above is against a "
            "weaker kernel's peak\n",
            r["blas_best_kernel"].get<std::string>().c_str(),
            r["blas_best_nominal_gflops"].get<double>());
      }
    }
    if (r.contains("gradient_sum_ms")) {  // data parallel: the sum, or ZeRO-1's reduce-scatter
      const bool scatter = r["gradient_reduction"].get<std::string>() == "reduce_scatter";
      std::printf(
          "  %-16s%10.2f ms blocking over %d ranks; waited %.2f ms per step after "
          "backward (dist.bucket_mb %g): %.0f%% hidden behind backward\n",
          scatter ? "reduce-scatter" : "gradient sum", r["gradient_sum_ms"].get<double>(),
          r["ranks"].get<int>(), r["gradient_sum_wait_ms"].get<double>(),
          r["bucket_mb"].get<double>(), 100.0 * r["gradient_sum_hidden_fraction"].get<double>());
    }
    std::printf("  peak memory     %10.1f MiB (process), %.1f MiB planned by the backend\n",
                r["peak_mem_bytes"].get<double>() / 1048576.0,
                r["backend_peak_bytes"].get<double>() / 1048576.0);
    std::printf("  optimizer state %10.1f MiB per rank (dist.zero=%d, %d rank(s))\n",
                r["optimizer_state_bytes_per_rank"].get<double>() / 1048576.0,
                r["dist_zero"].get<int>(), r["world_size"].get<int>());
    std::printf("  backend memory  %10.1f MiB allocated, %.1f MiB at peak, by role:\n",
                r["backend_bytes"].get<double>() / 1048576.0,
                r["backend_peak_bytes"].get<double>() / 1048576.0);
    for (int role = 0; role < kMemoryRoles; ++role) {
      const char* name = memory_role_name(MemoryRole(role));
      std::printf("    %-18s %10.3f MiB\n", name,
                  r["backend_bytes_by_role"][name].get<double>() / 1048576.0);
    }
    if (r.contains("op_ms")) {
      // Largest first: where the device time of a step goes.
      std::vector<std::pair<double, std::string>> families;
      for (const auto& [family, ms] : r["op_ms"].items()) {
        families.emplace_back(ms.get<double>(), family);
      }
      std::sort(families.rbegin(), families.rend());
      std::printf(
          "  device time     %10.2f ms per step in ops, of %.2f ms (%d steps timed by "
          "events), by op family:\n",
          r["op_ms_total"].get<double>(), r["op_timed_step_ms"].get<double>(),
          r["op_timed_steps"].get<int>());
      for (const auto& [ms, family] : families) {
        std::printf("    %-18s %10.2f ms %5.1f%%\n", family.c_str(), ms,
                    100.0 * ms / r["op_timed_step_ms"].get<double>());
      }
    }
    std::printf(
        "  controller + norm pass: %.3f%% of the step (norm pass %.3f ms timed alone, controller "
        "%.3f ms%s)\n",
        100.0 * r["controller_and_norms_fraction"].get<double>(), r["norm_pass_ms"].get<double>(),
        r["controller_ms"].get<double>(), gap_part.c_str());
    std::cout << r.dump() << std::endl;
  };
}

}  // namespace gnmr
