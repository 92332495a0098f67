// BLAS kernel autotuning end to end: the gnmr binary re-executes itself with the kernel that
// decide_blas_kernel picks for this CPU, reports it, and honours the user's choices.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backend/cpu/blas_kernel.h"
#include "cli_fixture.h"

namespace fs = std::filesystem;

using gnmr_test::run_gnmr;

namespace {

// "blas: OpenBLAS 0.3.21, kernel Cooperlake (AVX-512 ..." -> "Cooperlake"
std::string reported_kernel(const std::string& version_output) {
  const std::string key = ", kernel ";
  const size_t at = version_output.find(key);
  if (at == std::string::npos) return "";
  const size_t start = at + key.size();
  return version_output.substr(start, version_output.find(' ', start) - start);
}

}  // namespace

TEST(CliBlas, RunsTheKernelTheDecisionPicksForThisCpu) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    // This machine's environment forces a kernel (some CPUs need it): gnmr must keep it.
    auto r = run_gnmr("version");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("from the environment"), std::string::npos) << r.output;
    return;
  }
  auto library = run_gnmr("version", "GNMR_BLAS_AUTOTUNE=0");
  ASSERT_EQ(library.exit_code, 0) << library.output;
  const std::string library_kernel = reported_kernel(library.output);
  ASSERT_FALSE(library_kernel.empty()) << library.output;

  const gnmr::BlasKernelDecision decision =
      gnmr::decide_blas_kernel(gnmr::detect_cpu_features(), library_kernel);
  auto tuned = run_gnmr("version");
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  if (decision.force.empty()) {
    EXPECT_EQ(reported_kernel(tuned.output), library_kernel) << tuned.output;
  } else {
    EXPECT_EQ(reported_kernel(tuned.output), decision.force) << tuned.output;
    EXPECT_NE(tuned.output.find("chosen by gnmr over the library's " + library_kernel),
              std::string::npos)
        << tuned.output;
  }
}

TEST(CliBlas, KeepsTheUsersKernel) {
  auto r = run_gnmr("version", "OPENBLAS_CORETYPE=Prescott");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(reported_kernel(r.output), "Prescott") << r.output;
  EXPECT_NE(r.output.find("OPENBLAS_CORETYPE=Prescott from the environment"), std::string::npos)
      << r.output;
}

TEST(CliBlas, UndoesAForcedKernelTheLibraryDoesNotTake) {
  // As if gnmr had forced a kernel this library does not know: the process must go back to
  // the library's own choice and say why.
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr)
    GTEST_SKIP() << "the environment forces a kernel";
  auto library = run_gnmr("version", "GNMR_BLAS_AUTOTUNE=0");
  const std::string library_kernel = reported_kernel(library.output);
  auto r = run_gnmr("version",
                    "GNMR_BLAS_AUTOTUNED=" + library_kernel + " OPENBLAS_CORETYPE=NoSuchKernel");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(reported_kernel(r.output), library_kernel) << r.output;
  EXPECT_NE(r.output.find("when asked for NoSuchKernel"), std::string::npos) << r.output;
}

TEST(CliBlas, EveryStartOfARunWritesTheBlasHeaderLine) {
  std::string dir = gnmr_test::scratch_dir("cli_blas_header");
  std::string config =
      gnmr_test::write_tiny_config(dir, R"({"train": {"steps": 4}, "eval": {"every": 0}})");
  const std::string args = "train --config " + config + " --out " + dir + "/run";
  auto first = run_gnmr(args + " --stop-at 2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = run_gnmr(args + " --resume auto");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  std::vector<nlohmann::json> headers;
  for (const auto& line :
       gnmr_test::read_metrics(dir + "/run/metrics.jsonl", /*with_run_headers=*/true)) {
    if (line["kind"] == "run") headers.push_back(line);
  }
  ASSERT_EQ(headers.size(), 2u);
  EXPECT_EQ(headers[0]["step"], 0);
  EXPECT_EQ(headers[1]["step"], 2);  // the resumed start
  for (const auto& h : headers) {
    EXPECT_EQ(h["blas"].get<std::string>().rfind("OpenBLAS ", 0), 0u) << h.dump();
    EXPECT_FALSE(h["blas_kernel"].get<std::string>().empty()) << h.dump();
    EXPECT_EQ(h["blas_threads_per_gemm"], 1)
        << h.dump();  // the backend drives GEMMs from its own threads
    EXPECT_GT(h["blas_kernel_nominal_gflops"].get<double>(), 0) << h.dump();
  }
  std::ifstream log(dir + "/run/log.txt");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("BLAS: OpenBLAS"), std::string::npos);
}
