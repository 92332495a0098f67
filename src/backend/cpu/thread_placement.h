// Do this rank's OpenMP threads have cores of their own? The CPU backend runs train.threads
// threads (0: every core the process may run on), and several ranks on one node each pick that
// many. When together they ask for more threads than the node has cores, their threads take
// turns on the cores, and OpenMP's spinning barriers make each step many times slower (README
// "train.threads": a whole ctest run 4x slower on 2 cores). gnmr cannot see the other ranks'
// threads, but the launcher says how many ranks share the node (LaunchEnv::local_size), and the
// affinity mask says where this one may run: the trainer logs a warning naming the fix.
#pragma once

#include <string>

namespace gnmr {

struct ThreadPlacement {
  int threads = 1;        // OpenMP threads this rank runs (train.threads resolved)
  int allowed_cores = 1;  // cores in this process's affinity mask
  int node_cores = 1;     // online cores of the node
  int local_ranks = 1;  // this job's ranks on the node (each assumed to run `threads`); -1 unknown
};

// This process: its affinity mask and the node's online cores, with the given threads and
// local ranks.
ThreadPlacement current_thread_placement(int threads, int local_ranks);

// "" when the threads fit; else one warning with the numbers and the fixes: more threads than
// the cores this process may run on, or more threads across the node's ranks than it has cores.
std::string thread_oversubscription_warning(const ThreadPlacement& p);

}  // namespace gnmr
