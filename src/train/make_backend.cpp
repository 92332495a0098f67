#include "train/make_backend.h"

#include "backend/cpu/cpu_backend.h"
#include "util/error.h"

namespace gnmr {

std::unique_ptr<Backend> make_backend(const RunConfig& config) {
  if (config.backend == "cpu") {
    std::unique_ptr<Backend> backend = make_cpu_backend(config.train.threads);
    backend->set_gemm_precision(parse_gemm_precision(config.train.gemm_precision));
    return backend;
  }
  if (config.backend == "cuda") {
    throw Error(ErrorKind::NotBuilt,
                "backend \"cuda\" is not built yet (this binary has the cpu backend only); use "
                "backend=cpu");
  }
  throw Error(ErrorKind::Config,
              "config: \"backend\" is \"" + config.backend + "\", not one of cpu, cuda");
}

}  // namespace gnmr
