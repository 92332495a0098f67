// Loading a run config: include chains, --set overrides, schema and value validation.
#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <type_traits>

#include "util/error.h"
#include "util/nearest_name.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gnmr {

namespace {

[[noreturn]] void config_error(const std::string& message) {
  throw Error(ErrorKind::Config, "config: " + message);
}

void collect_key_paths(const json& schema, const std::string& prefix,
                       std::vector<std::string>& out) {
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    out.push_back(path);
    if (it->is_object()) collect_key_paths(*it, path, out);
  }
}

std::string suggestion_for(const std::string& path) {
  // The paper's names for the controller's settings (maxO, T_lock, δ), in any case.
  static const std::pair<const char*, const char*> kPaperNames[] = {
      {"gnmr.maxo", "gnmr.max_active"},
      {"gnmr.max_o", "gnmr.max_active"},
      {"gnmr.lock", "gnmr.lock_steps"},
      {"gnmr.t_lock", "gnmr.lock_steps"},
      {"gnmr.delta", "gnmr.window"}};
  std::string lower = path;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  for (const auto& [paper, key] : kPaperNames) {
    if (lower == paper) return " (the paper's name for \"" + std::string(key) + "\")";
  }
  std::vector<std::string> candidates;
  collect_key_paths(default_config_json(), "", candidates);
  // A section key given at the top level ("lr" for "train.lr") is matched by its leaf.
  if (path.find('.') == std::string::npos) {
    for (const auto& c : candidates) {
      size_t dot = c.rfind('.');
      if (dot != std::string::npos && c.substr(dot + 1) == path)
        return " (did you mean \"" + c + "\"?)";
    }
  }
  std::string best = nearest_name(path, candidates);
  if (best.empty()) return "";
  return " (did you mean \"" + best + "\"?)";
}

const char* json_type_word(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "true or false";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  return "null";
}

bool type_matches(const json& schema_value, const json& v) {
  if (schema_value.is_number_integer()) return v.is_number_integer();
  if (schema_value.is_number()) return v.is_number();
  if (schema_value.is_string()) return v.is_string();
  if (schema_value.is_boolean()) return v.is_boolean();
  if (schema_value.is_object()) return v.is_object();
  if (schema_value.is_array()) return v.is_array();
  return true;
}

// Every key of `user` must exist in `schema` with the same type.
void check_against_schema(const json& schema, const json& user, const std::string& prefix) {
  for (auto it = user.begin(); it != user.end(); ++it) {
    std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (!schema.contains(it.key()))
      config_error("unknown key \"" + path + "\"" + suggestion_for(path));
    const json& expected = schema.at(it.key());
    if (!type_matches(expected, *it)) {
      config_error("\"" + path + "\" must be " + json_type_word(expected) + ", got " + it->dump());
    }
    if (expected.is_object() && !expected.empty()) check_against_schema(expected, *it, path);
  }
}

void deep_merge(json& base, const json& overlay) {
  for (auto it = overlay.begin(); it != overlay.end(); ++it) {
    if (it->is_object() && base.contains(it.key()) && base[it.key()].is_object()) {
      deep_merge(base[it.key()], *it);
    } else {
      base[it.key()] = *it;
    }
  }
}

json parse_json_file(const std::string& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) config_error("config file " + file + " not found");
  if (fs::is_directory(file, ec)) config_error(file + " is a directory, not a config file");
  std::ifstream in(file);
  if (!in) config_error("cannot open config file " + file);
  try {
    return json::parse(in, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e99999
    config_error(file + ": invalid JSON: " + e.what());
  } catch (const std::ios_base::failure& e) {
    config_error("cannot read config file " + file + ": " + e.what());
  }
}

// Returns the file's content with its includes merged underneath it.
json load_with_includes(const std::string& file, std::vector<std::string>& chain) {
  // The error_code overloads: a path the OS refuses (a name too long) is a config error below,
  // not a filesystem_error.
  std::error_code ec;
  std::string canonical = fs::weakly_canonical(file, ec).string();
  if (ec) canonical = fs::path(file).lexically_normal().string();
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end()) {
    config_error("include cycle through " + file);
  }
  chain.push_back(canonical);
  json content = parse_json_file(file);
  if (!content.is_object()) config_error(file + ": top level must be a JSON object");
  json merged = json::object();
  if (content.contains("include")) {
    json includes = content["include"];
    if (includes.is_string()) includes = json::array({includes});
    if (!includes.is_array())
      config_error(file + ": \"include\" must be a path or a list of paths");
    for (const auto& inc : includes) {
      if (!inc.is_string()) config_error(file + ": \"include\" entries must be strings");
      fs::path path = fs::path(file).parent_path() / inc.get<std::string>();
      const bool exists = fs::exists(path, ec);
      if (ec) config_error(file + ": included file " + path.string() + ": " + ec.message());
      if (!exists) config_error(file + ": included file " + path.string() + " does not exist");
      deep_merge(merged, load_with_includes(path.string(), chain));
    }
    content.erase("include");
  }
  check_against_schema(default_config_json(), content, "");
  deep_merge(merged, content);
  chain.pop_back();
  return merged;
}

// "train.lr=3e-4": the value is JSON when it parses as JSON, else a plain string.
void apply_override(json& config, const std::string& assignment) {
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    config_error("override \"" + assignment + "\" must look like KEY.PATH=VALUE");
  }
  std::string path = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;
  const json* schema = &default_config_json();
  json* target = &config;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string key =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    std::string prefix = path.substr(0, dot == std::string::npos ? path.size() : dot);
    if (!schema->is_object() || !schema->contains(key)) {
      config_error("unknown key \"" + prefix + "\" in --set " + assignment +
                   suggestion_for(prefix));
    }
    schema = &schema->at(key);
    if (dot == std::string::npos) {
      if (!type_matches(*schema, value)) {
        config_error("--set " + assignment + ": \"" + path + "\" must be " +
                     json_type_word(*schema));
      }
      (*target)[key] = value;
      return;
    }
    if (!target->contains(key)) (*target)[key] = json::object();
    target = &(*target)[key];
    start = dot + 1;
  }
}

void require(bool ok, const std::string& field, const std::string& why) {
  if (!ok) config_error("\"" + field + "\" " + why);
}

void require_one_of(const std::string& field, const std::string& value,
                    const std::set<std::string>& allowed) {
  if (allowed.count(value)) return;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  config_error("\"" + field + "\" is \"" + value + "\", must be one of: " + list);
}

void validate(const RunConfig& c) {
  const ModelConfig& m = c.model;
  validate_model_shape(m, c.data.seq_len);
  try {
    validate_budget(c.gnmr.max_active, m.n_layers * kKindsPerLayer);
  } catch (const std::invalid_argument& e) {
    config_error(e.what());
  }
  require_one_of("data.sampling", c.data.sampling, {"random", "sequential", "shuffled"});
  const TrainConfig& t = c.train;
  require(t.steps > 0, "train.steps", "must be > 0");
  require(t.lr > 0, "train.lr", "must be > 0");
  require(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1, "train.min_lr_ratio", "must be in [0, 1]");
  require(t.warmup_steps >= 0, "train.warmup_steps", "must be >= 0");
  require(t.micro_batch > 0, "train.micro_batch", "must be > 0");
  int64_t micro_tokens = int64_t(t.micro_batch) * c.data.seq_len;
  require(t.global_batch_tokens > 0 && t.global_batch_tokens % micro_tokens == 0,
          "train.global_batch_tokens",
          "(" + std::to_string(t.global_batch_tokens) +
              ") must be a positive multiple of train.micro_batch × data.seq_len (" +
              std::to_string(micro_tokens) + ")");
  require(t.weight_decay >= 0, "train.weight_decay", "must be >= 0");
  require(t.beta1 >= 0 && t.beta1 < 1, "train.beta1", "must be in [0, 1)");
  require(t.beta2 >= 0 && t.beta2 < 1, "train.beta2", "must be in [0, 1)");
  require(t.eps > 0, "train.eps", "must be > 0");
  require(t.grad_clip >= 0, "train.grad_clip", "must be >= 0 (0 disables clipping)");
  require(t.max_nonfinite_steps >= 1, "train.max_nonfinite_steps", "must be >= 1");
  require(t.threads >= 0 && t.threads <= kMaxThreads, "train.threads",
          "must be in [0, " + std::to_string(kMaxThreads) + "] (0 = all cores)");
  require_one_of("train.gemm_precision", t.gemm_precision, {"fp32", "bf16"});
  require(c.eval.every >= 0, "eval.every", "must be >= 0");
  require(c.eval.tokens >= 0, "eval.tokens", "must be >= 0");
  require(c.checkpoint.every >= 0, "checkpoint.every", "must be >= 0");
  require(c.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1");
  require(c.log.every >= 1, "log.every", "must be >= 1");
  require_one_of("log.level", c.log.level,
                 {"trace", "debug", "info", "warn", "error", "critical", "off"});
  require_one_of("backend", c.backend, {"cpu", "cuda"});
  require_one_of("model.attention", m.attention,
                 {"auto", "flash", "flash_bf16", "flash_wgmma", "materialized"});
  require(m.attention.rfind("flash", 0) != 0 || c.backend == "cuda", "model.attention",
          "is \"" + m.attention +
              "\", which runs only on backend=cuda (the cpu backend's attention is "
              "materialized); use \"auto\" or \"materialized\"");
  require_one_of("dist.communicator", c.dist.communicator, {"auto", "local", "mpi", "nccl"});
  require(c.dist.timeout_s > 0, "dist.timeout_s", "must be > 0 (seconds)");
  require(c.dist.checkpoint_timeout_s > 0, "dist.checkpoint_timeout_s", "must be > 0 (seconds)");
  require_one_of("dist.rendezvous", c.dist.rendezvous, {"tcp", "file"});
  require(c.dist.rendezvous != "file" || !c.dist.rendezvous_dir.empty(), "dist.rendezvous_dir",
          "is empty, but dist.rendezvous is \"file\": set it to a directory every node can "
          "write (a shared filesystem)");
  require(c.dist.rendezvous == "file" || c.dist.rendezvous_dir.empty(), "dist.rendezvous_dir",
          "is set, but dist.rendezvous is \"" + c.dist.rendezvous +
              "\", which does not read it; set dist.rendezvous=file to use it");
  require(std::isfinite(c.dist.bucket_mb) && c.dist.bucket_mb >= 0, "dist.bucket_mb",
          "must be >= 0 (MiB per gradient bucket; 0 = one sum after backward)");
  require(c.dist.check_every >= 0, "dist.check_every", "must be >= 0 (0 disables the check)");
  require(c.dist.zero == 0 || c.dist.zero == 1, "dist.zero",
          "must be 0 (plain data parallel) or 1 (ZeRO-1: optimizer state sharded over the ranks)");
}

// out = section[last part of path]; an integer that does not fit OUT's type (the JSON holds
// up to 64 bits, "model.dim" is an int) is an error naming the key, not a truncation.
template <typename T>
void read_value(const json& section, const std::string& path, T& out) {
  const json& v = section.at(path.substr(path.rfind('.') + 1));
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const bool fits =
        v.is_number_unsigned()
            ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
            : v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                  (v.get<int64_t>() < 0 ||
                   uint64_t(v.get<int64_t>()) <= uint64_t(std::numeric_limits<T>::max()));
    if (!fits) {
      config_error("\"" + path + "\" is " + v.dump() + ", outside the range of its type [" +
                   std::to_string(std::numeric_limits<T>::min()) + ", " +
                   std::to_string(std::numeric_limits<T>::max()) + "]");
    }
  }
  out = v.get<T>();
}

}  // namespace

void validate_model_shape(const ModelConfig& m, int seq_len) {
  require(m.dim > 0, "model.dim", "must be > 0");
  require(m.n_layers > 0, "model.n_layers", "must be > 0");
  require(m.n_heads > 0, "model.n_heads", "must be > 0");
  require(
      m.dim % m.n_heads == 0, "model.n_heads",
      "(" + std::to_string(m.n_heads) + ") must divide model.dim (" + std::to_string(m.dim) + ")");
  require(m.head_dim() % 2 == 0, "model.n_heads",
          "must leave an even head dim for rotary embeddings");
  require(m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads == 0, "model.n_kv_heads",
          "(" + std::to_string(m.n_kv_heads) + ") must divide model.n_heads (" +
              std::to_string(m.n_heads) + ")");
  require(m.ffn_dim > 0, "model.ffn_dim", "must be > 0");
  require(m.vocab_size > 0, "model.vocab_size", "must be > 0");
  require(m.max_seq_len > 0, "model.max_seq_len", "must be > 0");
  require(m.norm_eps > 0, "model.norm_eps", "must be > 0");
  require(m.rope_theta > 0, "model.rope_theta", "must be > 0");
  require(m.init_std > 0, "model.init_std", "must be > 0");
  require(seq_len > 0, "data.seq_len", "must be > 0");
  require(seq_len <= m.max_seq_len, "data.seq_len",
          "(" + std::to_string(seq_len) + ") must be <= model.max_seq_len (" +
              std::to_string(m.max_seq_len) + ")");
}

RunConfig run_config_from_json(const json& resolved) {
  check_against_schema(default_config_json(), resolved, "");
  json full = default_config_json();
  deep_merge(full, resolved);
  RunConfig c;
  try {
    const json& m = full["model"];
    read_value(m, "model.name", c.model.name);
    read_value(m, "model.dim", c.model.dim);
    read_value(m, "model.n_layers", c.model.n_layers);
    read_value(m, "model.n_heads", c.model.n_heads);
    read_value(m, "model.n_kv_heads", c.model.n_kv_heads);
    read_value(m, "model.ffn_dim", c.model.ffn_dim);
    read_value(m, "model.vocab_size", c.model.vocab_size);
    read_value(m, "model.max_seq_len", c.model.max_seq_len);
    read_value(m, "model.norm_eps", c.model.norm_eps);
    read_value(m, "model.rope_theta", c.model.rope_theta);
    read_value(m, "model.init_std", c.model.init_std);
    read_value(m, "model.attention", c.model.attention);
    const json& d = full["data"];
    read_value(d, "data.train", c.data.train);
    read_value(d, "data.val", c.data.val);
    read_value(d, "data.tokenizer", c.data.tokenizer);
    read_value(d, "data.seq_len", c.data.seq_len);
    read_value(d, "data.sampling", c.data.sampling);
    const json& t = full["train"];
    read_value(t, "train.steps", c.train.steps);
    read_value(t, "train.lr", c.train.lr);
    read_value(t, "train.min_lr_ratio", c.train.min_lr_ratio);
    read_value(t, "train.warmup_steps", c.train.warmup_steps);
    read_value(t, "train.global_batch_tokens", c.train.global_batch_tokens);
    read_value(t, "train.micro_batch", c.train.micro_batch);
    read_value(t, "train.weight_decay", c.train.weight_decay);
    read_value(t, "train.beta1", c.train.beta1);
    read_value(t, "train.beta2", c.train.beta2);
    read_value(t, "train.eps", c.train.eps);
    read_value(t, "train.grad_clip", c.train.grad_clip);
    read_value(t, "train.seed", c.train.seed);
    read_value(t, "train.max_nonfinite_steps", c.train.max_nonfinite_steps);
    read_value(t, "train.gemm_precision", c.train.gemm_precision);
    read_value(t, "train.threads", c.train.threads);
    read_value(full["eval"], "eval.every", c.eval.every);
    read_value(full["eval"], "eval.tokens", c.eval.tokens);
    read_value(full["checkpoint"], "checkpoint.every", c.checkpoint.every);
    read_value(full["checkpoint"], "checkpoint.keep", c.checkpoint.keep);
    read_value(full["log"], "log.every", c.log.every);
    read_value(full["log"], "log.level", c.log.level);
    read_value(full["log"], "log.gnmr_trace", c.log.gnmr_trace);
    read_value(full["log"], "log.recovery_gap", c.log.recovery_gap);
    try {
      c.precision = recipe_from_json(full["precision"]);
    } catch (const std::invalid_argument& e) {
      config_error(e.what());
    }
    try {
      c.gnmr = controller_options_from_json(full["gnmr"]);
    } catch (const std::invalid_argument& e) {
      config_error(e.what());
    }
    read_value(full, "backend", c.backend);
    read_value(full["dist"], "dist.communicator", c.dist.communicator);
    read_value(full["dist"], "dist.timeout_s", c.dist.timeout_s);
    read_value(full["dist"], "dist.checkpoint_timeout_s", c.dist.checkpoint_timeout_s);
    read_value(full["dist"], "dist.rendezvous", c.dist.rendezvous);
    read_value(full["dist"], "dist.rendezvous_dir", c.dist.rendezvous_dir);
    read_value(full["dist"], "dist.bucket_mb", c.dist.bucket_mb);
    read_value(full["dist"], "dist.check_every", c.dist.check_every);
    read_value(full["dist"], "dist.zero", c.dist.zero);
  } catch (const json::exception& e) {
    config_error(std::string("value out of range: ") + e.what());
  }
  validate(c);
  c.resolved = full;
  return c;
}

RunConfig load_run_config(const std::string& file, const std::vector<std::string>& overrides) {
  std::vector<std::string> chain;
  json merged = load_with_includes(file, chain);
  for (const auto& o : overrides) apply_override(merged, o);
  return run_config_from_json(merged);
}

}  // namespace gnmr
