// `gnmr version`: version and the features compiled into this binary.
#include <iostream>

#include "backend/cpu/blas_autotune.h"
#include "backend/cpu/cpu_features.h"
#include "cli/commands.h"

namespace gnmr {

CommandAction add_version_command(CLI::App&) {
  return [] {
    std::cout << "gnmr " << GNMR_VERSION << "\n";
    std::cout << "backends: cpu\n";
#ifdef GNMR_WITH_CUDA
    // nvcc was found: kernels/ is built (and tested by the gpu tests), but no backend in this
    // binary runs on it yet (docs/DESIGN.md §6).
    std::cout << "cuda: no CUDA backend yet (kernels/ is built for sm_80 and sm_90a)\n";
#endif
    const CpuFeatures cpu = detect_cpu_features();
    std::cout << "cpu: " << cpu.model_name << " (" << widest_vector_isa(cpu) << ")\n";
    std::cout << "blas: " << describe_blas(blas_report(1)) << "\n";
  };
}

}  // namespace gnmr
