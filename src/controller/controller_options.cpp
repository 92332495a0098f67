#include "controller/controller_options.h"

#include <climits>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "util/json_integer.h"

namespace gnmr {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& key, const std::string& what) {
  throw std::invalid_argument("gnmr." + key + ": " + what);
}

std::string show(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

double read_number(const json& value, const std::string& key) {
  if (!value.is_number()) fail(key, "must be a number (got " + value.dump() + ")");
  return value.get<double>();
}

// Integers may be written as 8 or 8.0 (configs written by Python tools), never 8.5.
int64_t read_integer(const json& value, const std::string& key) {
  if (const std::optional<int64_t> v = json_int64_allowing_float(value)) return *v;
  fail(key, std::string(json_int64_problem(value)) + " (got " + value.dump() + ")");
}

int read_int(const json& value, const std::string& key) {
  int64_t v = read_integer(value, key);
  if (v < INT_MIN || v > INT_MAX) fail(key, "is out of range (got " + value.dump() + ")");
  return static_cast<int>(v);
}

std::string read_choice(const json& value, const std::string& key,
                        const std::vector<std::string>& choices) {
  std::string expected;
  for (const std::string& c : choices) expected += (expected.empty() ? "\"" : ", \"") + c + "\"";
  if (!value.is_string()) fail(key, "must be one of " + expected + " (got " + value.dump() + ")");
  std::string name = value.get<std::string>();
  for (const std::string& c : choices) {
    if (c == name) return name;
  }
  fail(key, "must be one of " + expected + " (got \"" + name + "\")");
}

const std::vector<std::string> kControllers = {"gnmr",         "static_low", "static_high",
                                               "random",       "topk_norm",  "gnmr_no_delta",
                                               "gnmr_no_lock", "oracle"};
const std::vector<std::string> kSchedules = {"constant", "linear", "cosine"};
const std::vector<std::string> kRankings = {"max_ratio", "sum_ratio", "gnmr", "delta"};
const std::vector<std::string> kHistories = {"raw", "capped"};
const std::vector<std::string> kGranularities = {"projection", "group"};

template <typename Enum>
Enum index_of(const std::vector<std::string>& names, const std::string& name, const char* key) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<Enum>(i);
  }
  fail(key, "unknown value \"" + name + "\"");
}

void check_threshold(double value, const std::string& key) {
  if (!std::isfinite(value) || value <= 0.0) fail(key, "must be > 0 (got " + show(value) + ")");
}

}  // namespace

ControllerKind parse_controller_kind(const std::string& name) {
  return index_of<ControllerKind>(kControllers, name, "controller");
}
ThresholdSchedule parse_threshold_schedule(const std::string& name) {
  return index_of<ThresholdSchedule>(kSchedules, name, "threshold_schedule");
}
RankingKey parse_ranking_key(const std::string& name) {
  return index_of<RankingKey>(kRankings, name, "ranking");
}
HistoryMode parse_history_mode(const std::string& name) {
  return index_of<HistoryMode>(kHistories, name, "history");
}
Granularity parse_granularity(const std::string& name) {
  return index_of<Granularity>(kGranularities, name, "granularity");
}

void validate_controller_options(const ControllerOptions& o) {
  read_choice(o.controller, "controller", kControllers);
  read_choice(o.threshold_schedule, "threshold_schedule", kSchedules);
  read_choice(o.ranking, "ranking", kRankings);
  read_choice(o.history, "history", kHistories);
  read_choice(o.granularity, "granularity", kGranularities);
  if (!std::isfinite(o.max_active) || o.max_active < 0.0) {
    fail("max_active", "must be >= 0 (got " + show(o.max_active) + ")");
  }
  if (o.max_active >= 1.0 && std::floor(o.max_active) != o.max_active) {
    fail("max_active", "must be an integer count when >= 1, or a fraction in (0, 1) (got " +
                           show(o.max_active) + ")");
  }
  check_threshold(o.alpha, "alpha");
  check_threshold(o.beta, "beta");
  if (!std::isnan(o.alpha_final)) check_threshold(o.alpha_final, "alpha_final");
  if (!std::isnan(o.beta_final)) check_threshold(o.beta_final, "beta_final");
  if (o.window < 1) fail("window", "must be >= 1 (got " + std::to_string(o.window) + ")");
  if (o.lock_steps < 0) {
    fail("lock_steps", "must be >= 0 (got " + std::to_string(o.lock_steps) + ")");
  }
  if (o.warmup_steps < 0) {
    fail("warmup_steps", "must be >= 0 (got " + std::to_string(o.warmup_steps) + ")");
  }
  if (o.history_start < 0) {
    fail("history_start", "must be >= 0 (got " + std::to_string(o.history_start) + ")");
  }
  if (o.schedule_steps < 0) {
    fail("schedule_steps", "must be >= 0 (got " + std::to_string(o.schedule_steps) + ")");
  }
  if (o.threshold_schedule != "constant" && o.schedule_steps < 1) {
    fail("schedule_steps", "must be >= 1 when gnmr.threshold_schedule is \"" +
                               o.threshold_schedule + "\" (got " +
                               std::to_string(o.schedule_steps) + ")");
  }
  if (o.oracle_same_step && o.controller != "oracle") {
    fail("oracle_same_step",
         "applies only to controller \"oracle\" (controller is \"" + o.controller + "\")");
  }
  if (o.controller == "gnmr_no_delta" && o.ranking == "delta") {
    fail("ranking", "\"delta\" ranks by Δ-GNMR, which controller \"gnmr_no_delta\" disables");
  }
  for (const auto& [kind, cap] : o.per_kind_cap) {
    if (!projection_kind_from_name(kind)) {
      fail("per_kind_cap." + kind,
           "unknown projection kind (expected one of " + projection_kind_list() + ")");
    }
    if (cap < 0) fail("per_kind_cap." + kind, "must be >= 0 (got " + std::to_string(cap) + ")");
  }
}

void validate_budget(double max_active, int n_units) {
  if (max_active >= 1.0 && max_active > n_units) {
    fail("max_active", show(max_active) + " is more than the model's " + std::to_string(n_units) +
                           " projection units (" + std::to_string(kKindsPerLayer) +
                           " per layer); use at most " + std::to_string(n_units) +
                           ", or a fraction in (0, 1)");
  }
}

ControllerOptions controller_options_from_json(const json& section) {
  if (!section.is_object()) {
    throw std::invalid_argument("gnmr: must be an object (got " + section.dump() + ")");
  }
  ControllerOptions o;
  for (const auto& [key, value] : section.items()) {
    if (key == "controller") {
      o.controller = read_choice(value, key, kControllers);
    } else if (key == "max_active") {
      o.max_active = read_number(value, key);
    } else if (key == "alpha") {
      o.alpha = read_number(value, key);
    } else if (key == "beta") {
      o.beta = read_number(value, key);
    } else if (key == "window") {
      o.window = read_int(value, key);
    } else if (key == "lock_steps") {
      o.lock_steps = read_int(value, key);
    } else if (key == "warmup_steps") {
      o.warmup_steps = read_int(value, key);
    } else if (key == "history_start") {
      o.history_start = read_integer(value, key);
    } else if (key == "threshold_schedule") {
      o.threshold_schedule = read_choice(value, key, kSchedules);
    } else if (key == "alpha_final") {
      o.alpha_final = value.is_null() ? std::nan("") : read_number(value, key);
    } else if (key == "beta_final") {
      o.beta_final = value.is_null() ? std::nan("") : read_number(value, key);
    } else if (key == "schedule_steps") {
      o.schedule_steps = read_integer(value, key);
    } else if (key == "ranking") {
      o.ranking = read_choice(value, key, kRankings);
    } else if (key == "history") {
      o.history = read_choice(value, key, kHistories);
    } else if (key == "granularity") {
      o.granularity = read_choice(value, key, kGranularities);
    } else if (key == "per_kind_cap") {
      if (!value.is_object()) {
        fail(key, "must be an object such as {\"down\": 2} (got " + value.dump() + ")");
      }
      for (const auto& [kind, cap] : value.items()) {
        o.per_kind_cap[kind] = read_int(cap, "per_kind_cap." + kind);
      }
    } else if (key == "seed") {
      int64_t seed = read_integer(value, key);
      if (seed < 0) fail(key, "must be >= 0 (got " + value.dump() + ")");
      o.seed = static_cast<uint64_t>(seed);
    } else if (key == "oracle_same_step") {
      if (!value.is_boolean()) fail(key, "must be true or false (got " + value.dump() + ")");
      o.oracle_same_step = value.get<bool>();
    } else {
      std::string known;
      const json defaults = controller_options_defaults();
      for (const auto& item : defaults.items()) {
        known += (known.empty() ? "" : ", ") + item.key();
      }
      fail(key, "unknown key (known keys: " + known + ")");
    }
  }
  validate_controller_options(o);
  return o;
}

nlohmann::json controller_options_defaults() {
  ControllerOptions o;
  json section = controller_options_to_json(o);
  section["alpha_final"] = nullptr;
  section["beta_final"] = nullptr;
  return section;
}

nlohmann::json controller_options_to_json(const ControllerOptions& o) {
  json caps = json::object();
  for (const auto& [kind, cap] : o.per_kind_cap) caps[kind] = cap;
  return json{{"controller", o.controller},
              {"max_active", o.max_active},
              {"alpha", o.alpha},
              {"beta", o.beta},
              {"window", o.window},
              {"lock_steps", o.lock_steps},
              {"warmup_steps", o.warmup_steps},
              {"history_start", o.history_start},
              {"threshold_schedule", o.threshold_schedule},
              {"alpha_final", std::isnan(o.alpha_final) ? o.alpha : o.alpha_final},
              {"beta_final", std::isnan(o.beta_final) ? o.beta : o.beta_final},
              {"schedule_steps", o.schedule_steps},
              {"ranking", o.ranking},
              {"history", o.history},
              {"granularity", o.granularity},
              {"per_kind_cap", caps},
              {"seed", o.seed},
              {"oracle_same_step", o.oracle_same_step}};
}

int resolve_budget(double max_active, int n_units) {
  if (max_active <= 0.0) return 0;
  if (max_active < 1.0) return static_cast<int>(std::floor(max_active * n_units));
  return max_active >= n_units ? n_units : static_cast<int>(max_active);
}

std::array<int, kKindsPerLayer> resolve_per_kind_caps(const std::map<std::string, int>& caps) {
  std::array<int, kKindsPerLayer> resolved;
  resolved.fill(INT_MAX);
  for (const auto& [kind, cap] : caps) {
    if (auto k = projection_kind_from_name(kind)) resolved[static_cast<int>(*k)] = cap;
  }
  return resolved;
}

}  // namespace gnmr
