#include "parallel/launch_env.h"

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <vector>

#include "util/error.h"

namespace gnmr {

namespace {

// The variables one launcher sets; local rank and local size names are tried in order and
// may be absent.
struct VariableNames {
  const char* source;
  const char* rank;
  std::vector<const char*> world_sizes;  // first one that is set wins
  std::vector<const char*> local_ranks;  // first one that is set wins
  std::vector<const char*> local_sizes;  // first one that is set wins
};

const VariableNames kLaunchers[] = {
    {"mpi",
     "OMPI_COMM_WORLD_RANK",
     {"OMPI_COMM_WORLD_SIZE"},
     {"OMPI_COMM_WORLD_LOCAL_RANK"},
     {"OMPI_COMM_WORLD_LOCAL_SIZE"}},
    {"mpi",
     "PMI_RANK",
     {"PMI_SIZE"},
     {"PMI_LOCAL_RANK", "MPI_LOCALRANKID"},
     {"PMI_LOCAL_SIZE", "MPI_LOCALNRANKS"}},
    {"torchrun", "RANK", {"WORLD_SIZE"}, {"LOCAL_RANK"}, {"LOCAL_WORLD_SIZE"}},
    {"slurm",
     "SLURM_PROCID",
     {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"},
     {"SLURM_LOCALID"},
     {"SLURM_NTASKS_PER_NODE"}},
};

[[noreturn]] void bad_launch(const std::string& what) {
  throw Error(ErrorKind::Usage, "launch environment: " + what);
}

int parse_count(const std::string& name, const std::string& text) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < 0) {
    bad_launch(name + "=\"" + text + "\" is not a non-negative integer (check how gnmr was " +
               "launched, or unset the variable)");
  }
  return value;
}

// The first of `names` that is set, as (name, value); nullopt when none is.
std::optional<std::pair<std::string, int>> first_set(const EnvLookup& lookup,
                                                     const std::vector<const char*>& names) {
  for (const char* name : names) {
    if (auto text = lookup(name))
      return std::make_pair(std::string(name), parse_count(name, *text));
  }
  return std::nullopt;
}

// The rendezvous address and job id (launch_env.h says where each comes from).
void read_rendezvous(const EnvLookup& lookup, LaunchEnv& env) {
  if (auto job = lookup("SLURM_JOB_ID")) {
    env.job_id = *job;
  } else if (auto run = lookup("TORCHELASTIC_RUN_ID")) {
    env.job_id = *run;
  }
  if (auto host = lookup("MASTER_ADDR")) {
    env.rendezvous_host = *host;
  } else if (auto list = lookup("SLURM_STEP_NODELIST")) {
    env.rendezvous_host = first_slurm_host(*list);
  } else if (auto job_list = lookup("SLURM_JOB_NODELIST")) {
    env.rendezvous_host = first_slurm_host(*job_list);
  }
  if (auto port = lookup("GNMR_RENDEZVOUS_PORT")) {
    env.rendezvous_port = parse_count("GNMR_RENDEZVOUS_PORT", *port);
    if (env.rendezvous_port < 1 || env.rendezvous_port > 65535) {
      bad_launch("GNMR_RENDEZVOUS_PORT=" + *port + " is not a TCP port (1..65535)");
    }
  } else if (auto port = lookup("MASTER_PORT")) {
    env.rendezvous_port = parse_count("MASTER_PORT", *port);
    if (env.rendezvous_port < 1 || env.rendezvous_port > 65535) {
      bad_launch("MASTER_PORT=" + *port + " is not a TCP port (1..65535)");
    }
    // torchrun's agent (TORCHELASTIC_RUN_ID is its mark) keeps its own store listening on
    // MASTER_PORT on the first node, so rank 0 takes the port above it.
    if (lookup("TORCHELASTIC_RUN_ID")) {
      if (env.rendezvous_port == 65535) {
        bad_launch(
            "MASTER_PORT=65535 under torchrun leaves no port above it for gnmr's "
            "rendezvous; pick a lower MASTER_PORT or set GNMR_RENDEZVOUS_PORT");
      }
      env.rendezvous_port += 1;
    }
  } else if (auto job = lookup("SLURM_JOB_ID")) {
    uint64_t id = 0;  // job ids are 32-bit unsigned: wider than int
    const char* end = job->data() + job->size();
    auto [ptr, ec] = std::from_chars(job->data(), end, id);
    if (job->empty() || ec != std::errc() || ptr != end) {
      bad_launch("SLURM_JOB_ID=\"" + *job + "\" is not a job number");
    }
    env.rendezvous_port = 29500 + int(id % 1000);
  }
  if (auto restarts = first_set(lookup, {"SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"})) {
    env.attempt = "restart" + std::to_string(restarts->second);
  }
  if (auto step = lookup("SLURM_STEP_ID")) {
    env.attempt += ".step" + std::to_string(parse_count("SLURM_STEP_ID", *step));
  }
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  std::string host;
  for (size_t i = 0; i < nodelist.size(); ++i) {
    const char c = nodelist[i];
    if (c == ',') break;  // a comma outside brackets ends the first entry
    if (c != '[') {
      host += c;
      continue;
    }
    // A bracket group "[a-b,c,...]": its first item's first number, zero padding kept.
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) {
      bad_launch("node list \"" + nodelist + "\" has a '[' without its ']'");
    }
    const std::string group = nodelist.substr(i + 1, close - i - 1);
    const size_t end = group.find_first_of("-,");
    const std::string first = group.substr(0, end);
    if (first.empty()) bad_launch("node list \"" + nodelist + "\" has an empty '[]' range");
    host += first;
    i = close;
  }
  if (host.empty()) bad_launch("node list \"" + nodelist + "\" names no host");
  return host;
}

LaunchEnv parse_launch_env(const EnvLookup& lookup) {
  for (const VariableNames& launcher : kLaunchers) {
    std::optional<std::string> rank_text = lookup(launcher.rank);
    if (!rank_text) continue;
    LaunchEnv env;
    env.source = launcher.source;
    env.rank = parse_count(launcher.rank, *rank_text);
    auto world = first_set(lookup, launcher.world_sizes);
    if (!world) {
      bad_launch(std::string(launcher.rank) + " is set but " + launcher.world_sizes.front() +
                 " is not; the launcher left the job size unknown");
    }
    env.world_size_variable = world->first;
    env.world_size = world->second;
    if (env.world_size < 1) bad_launch(world->first + "=0: a job has at least one process");
    if (env.rank >= env.world_size) {
      bad_launch(std::string(launcher.rank) + "=" + std::to_string(env.rank) + " is not below " +
                 world->first + "=" + std::to_string(env.world_size));
    }
    auto local = first_set(lookup, launcher.local_ranks);
    // srun --mpi=pmi2 exports PMI_RANK and PMI_SIZE but may leave out the PMI local rank; srun's
    // own SLURM_LOCALID describes this process when SLURM_PROCID is this rank (under mpirun in
    // an allocation every process inherits the batch script's SLURM_PROCID=0 instead).
    if (!local && std::string(launcher.source) != "slurm") {
      auto procid = lookup("SLURM_PROCID");
      if (procid && parse_count("SLURM_PROCID", *procid) == env.rank) {
        local = first_set(lookup, {"SLURM_LOCALID"});
      }
    }
    env.local_rank = local ? local->second : -1;
    if (local && env.local_rank >= env.world_size) {
      bad_launch(local->first + "=" + std::to_string(env.local_rank) + " is not below " +
                 world->first + "=" + std::to_string(env.world_size));
    }
    auto local_size = first_set(lookup, launcher.local_sizes);
    env.local_size = local_size ? local_size->second : -1;
    if (local_size && (env.local_size < 1 || env.local_size > env.world_size)) {
      bad_launch(local_size->first + "=" + std::to_string(env.local_size) +
                 " is not between 1 and " + world->first + "=" + std::to_string(env.world_size));
    }
    read_rendezvous(lookup, env);
    env.mpi_wireup = lookup("PMIX_RANK") || lookup("PMI_RANK") || lookup("PMI_FD") ||
                     lookup("OMPI_COMM_WORLD_RANK");
    return env;
  }
  return LaunchEnv{};
}

std::string srun_without_mpi_plugin_hint(const LaunchEnv& env) {
  if (env.source != "slurm" || env.world_size < 2 || env.mpi_wireup) return "";
  return "srun started " + std::to_string(env.world_size) +
         " processes without a PMIx or PMI-2 wire-up (srun --mpi=none, or a cluster whose "
         "MpiDefault is none): if MPI fails to start now, launch the CPU ranks with srun "
         "--mpi=pmix (SRUN_MPI=pmix for scripts/slurm) or mpirun";
}

GpuChoice gpu_for_process(const LaunchEnv& env, int visible_gpus) {
  if (visible_gpus <= 1) return {0, ""};  // one GPU per task, or none (the probe says so)
  if (env.local_rank < 0) {
    if (env.world_size == 1) return {0, ""};
    return {-1, std::to_string(visible_gpus) + " GPUs are visible and the launcher (" + env.source +
                    ") does not say which of this node's processes rank " +
                    std::to_string(env.rank) +
                    " is; launch one process per GPU with a local rank (mpirun, srun, torchrun), "
                    "or give each process one GPU (srun --gpus-per-task=1)"};
  }
  if (env.local_rank >= visible_gpus) {
    return {-1, "local rank " + std::to_string(env.local_rank) + " but only " +
                    std::to_string(visible_gpus) +
                    " GPUs visible on this node (one process per GPU: start at most as many "
                    "processes per node as it has GPUs, or give each process one GPU)"};
  }
  return {env.local_rank, ""};
}

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

LaunchEnv read_launch_env() {
  return parse_launch_env(process_environment());
}

}  // namespace gnmr
