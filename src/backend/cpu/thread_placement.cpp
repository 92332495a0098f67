#include "backend/cpu/thread_placement.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/cpu_features.h"

namespace gnmr {

ThreadPlacement current_thread_placement(int threads, int local_ranks) {
  ThreadPlacement p;
  p.threads = threads;
  p.allowed_cores = detect_cpu_features().logical_cores;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  p.node_cores = online > 0 ? int(online) : p.allowed_cores;
  p.local_ranks = local_ranks;
  return p;
}

std::string thread_oversubscription_warning(const ThreadPlacement& p) {
  const std::string passive =
      " OMP_WAIT_POLICY=passive keeps waiting threads off the cores if sharing is intended.";
  if (p.threads > p.allowed_cores) {
    return "train.threads=" + std::to_string(p.threads) + " but this process may run on only " +
           std::to_string(p.allowed_cores) +
           " core(s) (its affinity mask): threads will take turns on them and each step will "
           "be slower; set train.threads=" +
           std::to_string(p.allowed_cores) + " or fewer, or widen the binding." + passive;
  }
  if (p.local_ranks > 1 && int64_t(p.local_ranks) * p.threads > p.node_cores) {
    const int share = std::max(1, p.node_cores / p.local_ranks);
    return std::to_string(p.local_ranks) + " ranks on this node each run " +
           std::to_string(p.threads) + " OpenMP thread(s) (train.threads), " +
           std::to_string(int64_t(p.local_ranks) * p.threads) + " in all on " +
           std::to_string(p.node_cores) +
           " cores: their threads will take turns and steps can be many times slower. Bind "
           "each rank to its own cores (mpirun --map-by slot:PE=" +
           std::to_string(share) +
           " --bind-to core; srun --cpus-per-task=" + std::to_string(share) +
           " --cpu-bind=cores) or set train.threads=" + std::to_string(share) + "." + passive;
  }
  return "";
}

}  // namespace gnmr
