// Running OpenBLAS's best kernel without user action. OpenBLAS reads OPENBLAS_CORETYPE only
// when it loads, so when it chose a weaker kernel than the CPU runs (blas_kernel.h), gnmr sets
// the variable and re-executes itself before doing anything else. The environment carries
// what happened to the new process, which reports it (blas_report) in the run log, the
// metrics header line and `gnmr bench`.
//   GNMR_BLAS_AUTOTUNE=0        keep the library's choice
//   OPENBLAS_CORETYPE=NAME      set by the user: kept as given
#pragma once

#include <string>

namespace gnmr {

// Call first thing in main(), before any thread or MPI exists. May replace the process
// (execv of /proc/self/exe with the same argv); returns when nothing is to change. A forced
// kernel that the library does not take or that computes a wrong sgemm is undone by one more
// re-execution with the library's own choice, and reported.
void autotune_blas_kernel(char** argv);

struct BlasReport {
  std::string library;           // "OpenBLAS"
  std::string version;           // "0.3.21"
  std::string kernel;            // openblas_get_corename(): the kernel in use
  std::string kernel_isa;        // its instruction set, "AVX-512 BF16" ... "SSE3"
  std::string best_kernel;       // the best kernel for this CPU (may equal kernel)
  std::string chosen_by;         // how the kernel was chosen, one phrase for the log
  bool weaker_than_cpu = false;  // the kernel in use is below what this CPU runs
  int threads_per_gemm = 0;      // openblas_get_num_threads()
  int cores = 0;
  double clock_ghz = 0;
  double kernel_nominal_gflops = 0;  // nominal_sgemm_gflops of the kernel in use, on `cores`
  double best_nominal_gflops = 0;    // the same for best_kernel
};

// The BLAS this process runs, with GEMMs spread over `cores` backend threads.
BlasReport blas_report(int cores);

// One line: "OpenBLAS 0.3.21, kernel Cooperlake (AVX-512 BF16; chosen by gnmr over the
// library's Prescott), 1 thread per GEMM".
std::string describe_blas(const BlasReport& report);

}  // namespace gnmr
