// Loading a run config: include chains, --set overrides, schema and value validation.
#include "config/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

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
  } catch (const json::parse_error& e) {
    config_error(file + ": invalid JSON: " + e.what());
  }
}

// Returns the file's content with its includes merged underneath it.
json load_with_includes(const std::string& file, std::vector<std::string>& chain) {
  std::string canonical = fs::weakly_canonical(file).string();
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
      if (!fs::exists(path))
        config_error(file + ": included file " + path.string() + " does not exist");
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
  require(m.dim > 0, "model.dim", "must be > 0");
  require(m.n_layers > 0, "model.n_layers", "must be > 0");
  try {
    validate_budget(c.gnmr.max_active, m.n_layers * kKindsPerLayer);
  } catch (const std::invalid_argument& e) {
    config_error(e.what());
  }
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
  require(c.data.seq_len > 0, "data.seq_len", "must be > 0");
  require(c.data.seq_len <= m.max_seq_len, "data.seq_len",
          "(" + std::to_string(c.data.seq_len) + ") must be <= model.max_seq_len (" +
              std::to_string(m.max_seq_len) + ")");
  require_one_of("data.sampling", c.data.sampling, {"random", "sequential"});
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
  require(t.threads >= 0, "train.threads", "must be >= 0 (0 = all cores)");
  require_one_of("train.gemm_precision", t.gemm_precision, {"fp32", "bf16"});
  require(c.eval.every >= 0, "eval.every", "must be >= 0");
  require(c.eval.tokens >= 0, "eval.tokens", "must be >= 0");
  require(c.checkpoint.every >= 0, "checkpoint.every", "must be >= 0");
  require(c.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1");
  require(c.log.every >= 1, "log.every", "must be >= 1");
  require_one_of("log.level", c.log.level,
                 {"trace", "debug", "info", "warn", "error", "critical", "off"});
  require_one_of("backend", c.backend, {"cpu", "cuda"});
  require_one_of("dist.communicator", c.dist.communicator, {"auto", "local", "mpi", "nccl"});
}

}  // namespace

RunConfig run_config_from_json(const json& resolved) {
  check_against_schema(default_config_json(), resolved, "");
  json full = default_config_json();
  deep_merge(full, resolved);
  RunConfig c;
  try {
    const json& m = full["model"];
    c.model.name = m["name"];
    c.model.dim = m["dim"];
    c.model.n_layers = m["n_layers"];
    c.model.n_heads = m["n_heads"];
    c.model.n_kv_heads = m["n_kv_heads"];
    c.model.ffn_dim = m["ffn_dim"];
    c.model.vocab_size = m["vocab_size"];
    c.model.max_seq_len = m["max_seq_len"];
    c.model.norm_eps = m["norm_eps"];
    c.model.rope_theta = m["rope_theta"];
    c.model.init_std = m["init_std"];
    const json& d = full["data"];
    c.data.train = d["train"];
    c.data.val = d["val"];
    c.data.tokenizer = d["tokenizer"];
    c.data.seq_len = d["seq_len"];
    c.data.sampling = d["sampling"];
    const json& t = full["train"];
    c.train.steps = t["steps"];
    c.train.lr = t["lr"];
    c.train.min_lr_ratio = t["min_lr_ratio"];
    c.train.warmup_steps = t["warmup_steps"];
    c.train.global_batch_tokens = t["global_batch_tokens"];
    c.train.micro_batch = t["micro_batch"];
    c.train.weight_decay = t["weight_decay"];
    c.train.beta1 = t["beta1"];
    c.train.beta2 = t["beta2"];
    c.train.eps = t["eps"];
    c.train.grad_clip = t["grad_clip"];
    c.train.seed = t["seed"];
    c.train.max_nonfinite_steps = t["max_nonfinite_steps"];
    c.train.gemm_precision = t["gemm_precision"];
    c.train.threads = t["threads"];
    c.eval.every = full["eval"]["every"];
    c.eval.tokens = full["eval"]["tokens"];
    c.checkpoint.every = full["checkpoint"]["every"];
    c.checkpoint.keep = full["checkpoint"]["keep"];
    c.log.every = full["log"]["every"];
    c.log.level = full["log"]["level"];
    c.log.gnmr_trace = full["log"]["gnmr_trace"];
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
    c.backend = full["backend"];
    c.dist.communicator = full["dist"]["communicator"];
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
