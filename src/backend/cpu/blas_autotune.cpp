#include "backend/cpu/blas_autotune.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "backend/cpu/blas_kernel.h"

namespace gnmr {

namespace {

// What the first process passes to the one it executes.
constexpr const char* kForcedOver = "GNMR_BLAS_AUTOTUNED";    // the library's own choice
constexpr const char* kFailed = "GNMR_BLAS_AUTOTUNE_FAILED";  // why a forced kernel was undone

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

bool same_name(const std::string& a, const std::string& b) {
  return strcasecmp(a.c_str(), b.c_str()) == 0;
}

// valgrind runs a child it executes natively unless --trace-children=yes: never re-execute
// under it (its virtual CPU has no AVX-512 anyway).
bool under_valgrind() {
  return env("LD_PRELOAD").find("vgpreload") != std::string::npos;
}

// A small sgemm (C = A Bᵀ, row-major, the backend's forward layout) against a double loop:
// a kernel that the library mis-runs on this CPU must not train a model.
bool sgemm_is_correct() {
  const int m = 37, n = 29, k = 301;
  std::vector<float> a(size_t(m) * k), b(size_t(n) * k), c(size_t(m) * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i * 7919 % 201) - 100) / 64.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i * 104729 % 199) - 99) / 32.0f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
              0.0f, c.data(), n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double exact = 0, magnitude = 0;
      for (int p = 0; p < k; ++p) {
        exact += double(a[size_t(i) * k + p]) * b[size_t(j) * k + p];
        magnitude += std::fabs(double(a[size_t(i) * k + p]) * b[size_t(j) * k + p]);
      }
      // fp32 accumulation over k terms in any order: error below k · 2^-24 · Σ|a b|.
      if (std::fabs(double(c[size_t(i) * n + j]) - exact) > k * 0x1p-24 * magnitude + 1e-30)
        return false;
    }
  }
  return true;
}

void reexec(char** argv) {
  execv("/proc/self/exe", argv);
  // Only reached when execv failed: carry on with the library's kernel and say why.
  const std::string why = std::string("re-executing failed (") + std::strerror(errno) + ")";
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kForcedOver);
  setenv(kFailed, why.c_str(), 1);
}

}  // namespace

void autotune_blas_kernel(char** argv) {
  const std::string library_kernel = openblas_get_corename();
  const std::string forced_over = env(kForcedOver);
  if (!forced_over.empty()) {
    // This process was executed with OPENBLAS_CORETYPE forced: check that it took and works.
    std::string why;
    if (!same_name(library_kernel, env("OPENBLAS_CORETYPE"))) {
      why = "OpenBLAS ran " + library_kernel + " when asked for " + env("OPENBLAS_CORETYPE");
    } else if (!sgemm_is_correct()) {
      why = "the " + library_kernel + " kernel computed a wrong sgemm on this CPU";
    }
    if (why.empty()) return;
    setenv("OPENBLAS_CORETYPE", forced_over.c_str(), 1);
    setenv("GNMR_BLAS_AUTOTUNE", "0", 1);
    setenv(kFailed, why.c_str(), 1);
    unsetenv(kForcedOver);
    reexec(argv);
    return;
  }
  if (env("GNMR_BLAS_AUTOTUNE") == "0" || !env("OPENBLAS_CORETYPE").empty() || under_valgrind())
    return;
  const BlasKernelDecision decision = decide_blas_kernel(detect_cpu_features(), library_kernel);
  if (decision.force.empty()) return;
  setenv("OPENBLAS_CORETYPE", decision.force.c_str(), 1);
  setenv(kForcedOver, library_kernel.c_str(), 1);
  reexec(argv);
}

BlasReport blas_report(int cores) {
  const CpuFeatures cpu = detect_cpu_features();
  BlasReport r;
  r.library = "OpenBLAS";
  std::istringstream config(
      openblas_get_config());  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
  std::string word;
  config >> word >> r.version;
  r.kernel = openblas_get_corename();
  const BlasKernelClass in_use = blas_kernel_class(r.kernel);
  r.kernel_isa = in_use.isa;
  r.best_kernel = best_blas_kernel_for(cpu);
  if (r.best_kernel.empty()) r.best_kernel = r.kernel;
  const BlasKernelClass best = blas_kernel_class(r.best_kernel);
  r.weaker_than_cpu = in_use.rank != 0 && in_use.rank < best.rank;
  if (!env(kFailed).empty()) {
    r.chosen_by = "the library's choice; gnmr undid its own pick: " + env(kFailed);
  } else if (!env(kForcedOver).empty()) {
    r.chosen_by = "chosen by gnmr over the library's " + env(kForcedOver) +
                  "; GNMR_BLAS_AUTOTUNE=0 keeps the library's";
  } else if (!env("OPENBLAS_CORETYPE").empty()) {
    r.chosen_by = "OPENBLAS_CORETYPE=" + env("OPENBLAS_CORETYPE") + " from the environment";
  } else if (r.weaker_than_cpu) {
    r.chosen_by = "the library's choice, below this CPU's " + r.best_kernel +
                  (env("GNMR_BLAS_AUTOTUNE") == "0" ? " (GNMR_BLAS_AUTOTUNE=0)" : "");
  } else {
    r.chosen_by = "the library's choice";
  }
  r.threads_per_gemm = openblas_get_num_threads();
  r.cores = cores;
  r.clock_ghz = cpu.clock_ghz;
  r.kernel_nominal_gflops = nominal_sgemm_gflops(in_use, cores, cpu.clock_ghz);
  r.best_nominal_gflops = nominal_sgemm_gflops(best, cores, cpu.clock_ghz);
  return r;
}

std::string describe_blas(const BlasReport& r) {
  return r.library + " " + r.version + ", kernel " + r.kernel + " (" + r.kernel_isa + "; " +
         r.chosen_by + "), " + std::to_string(r.threads_per_gemm) + " thread(s) per GEMM";
}

}  // namespace gnmr
