// Parsing and describing precision recipes (recipe.h has the keys and their meaning).
#include "precision/recipe.h"

#include <climits>
#include <stdexcept>
#include <vector>

#include "util/json_integer.h"

namespace gnmr {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& key, const std::string& what) {
  throw std::invalid_argument("\"precision." + key + "\" " + what);
}

// Integers may be written as 8 or 8.0 (configs written by Python tools), never 8.5.
int64_t read_integer(const json& section, const std::string& key) {
  const json& value = section.at(key);
  if (const std::optional<int64_t> v = json_int64_allowing_float(value)) return *v;
  fail(key, std::string(json_int64_problem(value)) + " (got " + value.dump() + ")");
}

std::string read_choice(const json& section, const std::string& key,
                        const std::vector<std::string>& choices) {
  const json& value = section.at(key);
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  if (value.is_string()) {
    const std::string name = value.get<std::string>();
    for (const std::string& c : choices) {
      if (c == name) return name;
    }
  }
  fail(key, "is " + value.dump() + ", must be one of: " + list);
}

int read_bits(const json& section, const std::string& key, bool zero_allowed) {
  const int64_t bits = read_integer(section, key);
  if ((bits == 0 && zero_allowed) || (bits >= 2 && bits <= 8)) return static_cast<int>(bits);
  fail(key, "is " + std::to_string(bits) + ", must be in 2..8" +
                (zero_allowed ? std::string(" or 0 (full precision)") : std::string()));
}

// Config spelling -> GroupwiseSpec::group_size: > 0 as is, 0 = per row, -1 = per tensor.
int read_group_size(const json& section, const std::string& key) {
  const int64_t size = read_integer(section, key);
  if (size > 0 && size <= (int64_t{1} << 30)) return static_cast<int>(size);
  if (size == 0) return kGroupRow;
  if (size == -1) return kGroupTensor;
  fail(key, "is " + std::to_string(size) +
                ", must be a positive group size, 0 (one scale per row) or -1 (one per tensor)");
}

FpFormat read_format(const json& section, const std::string& key) {
  return parse_fp_format(read_choice(section, key, {"e4m3", "e5m2", "e3m2", "e2m3", "e2m1"}));
}

PathSpec int_path(int bits, int group_size, bool stochastic) {
  PathSpec p;
  p.kind = PathKind::kSavedIntGroupwise;
  p.saved.bits = bits;
  p.saved.group_size = group_size;
  p.saved.stochastic = stochastic;
  return p;
}

PathSpec kind_path(PathKind kind) {
  PathSpec p;
  p.kind = kind;
  return p;
}

std::string group_name(int group_size) {
  if (group_size == kGroupRow) return "per-row";
  if (group_size == kGroupTensor) return "per-tensor";
  return "g" + std::to_string(group_size);
}

}  // namespace

const char* path_kind_name(PathKind kind) {
  switch (kind) {
    case PathKind::kBackendGemm:
      return "backend_gemm";
    case PathKind::kBf16Gemm:
      return "bf16_gemm";
    case PathKind::kSavedIntGroupwise:
      return "saved_int_groupwise";
    case PathKind::kFineGrainedFp:
      return "fine_grained_fp";
    case PathKind::kInt8Gemm:
      return "int8_gemm";
  }
  return "?";
}

std::string PathSpec::describe() const {
  switch (kind) {
    case PathKind::kBackendGemm:
      return "gemm at train.gemm_precision";
    case PathKind::kBf16Gemm:
      return "bf16 gemm";
    case PathKind::kSavedIntGroupwise:
      return "saved int" + std::to_string(saved.bits) + " " + group_name(saved.group_size) +
             (saved.stochastic ? " stochastic" : "");
    case PathKind::kFineGrainedFp:
      return std::string("fp ") + fp_format_name(format) + " 1x" + std::to_string(tile) + "/" +
             std::to_string(tile) + "x" + std::to_string(tile);
    case PathKind::kInt8Gemm:
      return "int8 gemm per-token/per-channel";
  }
  return "?";
}

json recipe_defaults() {
  return json{{"recipe", "fp32"},
              {"seed", 0},
              {"low_bits", 4},
              {"low_group_size", 128},
              {"recovery_bits", 8},
              {"recovery_group_size", 128},
              {"stochastic_rounding", false},
              {"low_format", "e3m2"},
              {"recovery_format", "e4m3"},
              {"tile", 128},
              {"recovery_layers", json::array()}};
}

PrecisionRecipe recipe_from_json(const json& precision_section) {
  if (!precision_section.is_object()) {
    throw std::invalid_argument("\"precision\" must be an object (got " + precision_section.dump() +
                                ")");
  }
  json s = recipe_defaults();
  for (auto it = precision_section.begin(); it != precision_section.end(); ++it) {
    if (!s.contains(it.key())) fail(it.key(), "is not a precision key");
    s[it.key()] = *it;
  }
  PrecisionRecipe r;
  r.name = read_choice(s, "recipe", {"fp32", "bf16", "actq", "fp8mix", "int8"});
  const int64_t seed = read_integer(s, "seed");
  if (seed < 0) fail("seed", "must be >= 0 (got " + std::to_string(seed) + ")");
  r.seed = static_cast<uint64_t>(seed);
  const json& layers = s.at("recovery_layers");
  if (!layers.is_array())
    fail("recovery_layers", "must be a list of layer indices (got " + layers.dump() + ")");
  for (const auto& layer : layers) {
    // An index must fit an int whole: 4294967296 truncated would be layer 0.
    const std::optional<int64_t> index = json_int64(layer);
    if (!layer.is_number_integer()) {
      fail("recovery_layers", "must hold integer layer indices (got " + layer.dump() + ")");
    }
    if (!index || *index < INT_MIN || *index > INT_MAX) {
      fail("recovery_layers", "holds a layer index out of range (got " + layer.dump() + ")");
    }
    r.recovery_layers.push_back(int(*index));
  }
  if (!s.at("stochastic_rounding").is_boolean()) {
    fail("stochastic_rounding",
         "must be true or false (got " + s.at("stochastic_rounding").dump() + ")");
  }
  // Every key is validated whatever the recipe, so a typo fails before a long run.
  const bool stochastic = s.at("stochastic_rounding").get<bool>();
  const int low_bits = read_bits(s, "low_bits", false);
  const int low_group = read_group_size(s, "low_group_size");
  const int recovery_bits = read_bits(s, "recovery_bits", true);
  const int recovery_group = read_group_size(s, "recovery_group_size");
  const FpFormat low_format = read_format(s, "low_format");
  const FpFormat recovery_format = read_format(s, "recovery_format");
  const int64_t tile = read_integer(s, "tile");
  if (tile < 1 || tile > 4096) fail("tile", "is " + std::to_string(tile) + ", must be in 1..4096");

  if (r.name == "fp32") {
    r.recovery = kind_path(PathKind::kBackendGemm);
  } else if (r.name == "bf16") {
    r.recovery = kind_path(PathKind::kBf16Gemm);
  } else if (r.name == "actq") {
    r.has_low_path = true;
    r.low = int_path(low_bits, low_group, stochastic);
    r.recovery = recovery_bits == 0 ? kind_path(PathKind::kBackendGemm)
                                    : int_path(recovery_bits, recovery_group, stochastic);
  } else if (r.name == "fp8mix") {
    r.has_low_path = true;
    r.low = kind_path(PathKind::kFineGrainedFp);
    r.low.format = low_format;
    r.low.tile = tile;
    r.recovery = kind_path(PathKind::kFineGrainedFp);
    r.recovery.format = recovery_format;
    r.recovery.tile = tile;
  } else {  // int8
    r.has_low_path = true;
    r.low = kind_path(PathKind::kInt8Gemm);
    r.recovery = kind_path(PathKind::kBf16Gemm);
  }
  if (!r.has_low_path) r.low = r.recovery;
  return r;
}

PrecisionRecipe recipe_by_name(const std::string& name) {
  return recipe_from_json(json{{"recipe", name}});
}

GroupwiseSpec groupwise_spec_for_width(GroupwiseSpec spec, int64_t cols) {
  if (spec.group_size <= 0 || cols <= 0) return spec;
  int64_t group = spec.group_size < cols ? spec.group_size : cols;
  while (cols % group != 0) --group;
  spec.group_size = static_cast<int>(group);
  return spec;
}

}  // namespace gnmr
