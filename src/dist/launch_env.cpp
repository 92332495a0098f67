#include "dist/launch_env.h"

#include <charconv>
#include <cstdlib>
#include <utility>
#include <vector>

#include "util/error.h"

namespace gnmr {

namespace {

// The variables one launcher sets; local rank names are tried in order and may be absent.
struct VariableNames {
  const char* source;
  const char* rank;
  std::vector<const char*> world_sizes;  // first one that is set wins
  std::vector<const char*> local_ranks;  // first one that is set wins
};

const VariableNames kLaunchers[] = {
    {"mpi", "OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_SIZE"}, {"OMPI_COMM_WORLD_LOCAL_RANK"}},
    {"mpi", "PMI_RANK", {"PMI_SIZE"}, {"PMI_LOCAL_RANK", "MPI_LOCALRANKID"}},
    {"slurm", "SLURM_PROCID", {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, {"SLURM_LOCALID"}},
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

}  // namespace

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
    env.local_rank = local ? local->second : -1;
    if (local && env.local_rank >= env.world_size) {
      bad_launch(local->first + "=" + std::to_string(env.local_rank) + " is not below " +
                 world->first + "=" + std::to_string(env.world_size));
    }
    return env;
  }
  return LaunchEnv{};
}

LaunchEnv read_launch_env() {
  return parse_launch_env([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

}  // namespace gnmr
