// `gnmr version`: version and the features compiled into this binary.
#include <iostream>

#include "backend/cpu/blas_autotune.h"
#include "backend/cpu/cpu_features.h"
#include "cli/build_id.h"
#include "cli/commands.h"

namespace gnmr {

CommandAction add_version_command(CLI::App&) {
  return [] {
    std::cout << "gnmr " << gnmr_build_id() << "\n";
#ifdef GNMR_WITH_CUDA
    // nvcc was found: the CUDA backend is in this binary (docs/DESIGN.md §6); whether this
    // machine can run it is what `--backend cuda` (make_backend) reports.
#ifdef GNMR_CUDA_EMULATED
    // The emulated preset: CUDA on the host emulation (tests/emulated_cuda), for tests only.
    std::cout << "backends: cpu, cuda (emulated on the host: a test build, not for training)\n";
#else
    std::cout << "backends: cpu, cuda (" << GNMR_CUDA_ARCHS << ")\n";
#endif
#else
    std::cout << "backends: cpu\n";
#endif
    const CpuFeatures cpu = detect_cpu_features();
    std::cout << "cpu: " << cpu.model_name << " (" << widest_vector_isa(cpu) << ")\n";
    std::cout << "blas: " << describe_blas(blas_report(1)) << "\n";
  };
}

}  // namespace gnmr
