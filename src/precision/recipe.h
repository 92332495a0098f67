// Precision recipes (docs/DESIGN.md §4): what the low and the recovery path of a projection unit
// do, parsed from the config section `precision`. Plain data; the model (src/model/
// projection_paths.h) executes a PathSpec, the backend supplies the quantizer ops.
//
// Config keys (section "precision"; keys of other recipes are ignored), defaults in ():
//   recipe               "fp32" | "bf16" | "actq" | "fp8mix" | "int8"                 ("fp32")
//   seed                 stochastic-rounding stream seed; the stream is keyed by
//                        (seed, step, unit) (counter_rng.h), so runs resume exactly    (0)
//   -- actq: GEMMs at train.gemm_precision; the input each unit saves for its weight
//      gradient is stored group-wise int, really packed (4 bits = half a byte + scales)
//   low_bits             bits of the low path's saved activation, 2..8                (4)
//   low_group_size       elements per scale: > 0, 0 = one per row (token), -1 = one
//                        per tensor                                                     (128)
//   recovery_bits        bits of the recovery path, 2..8, or 0 = keep it full precision (8)
//   recovery_group_size  as low_group_size                                              (128)
//   stochastic_rounding  unbiased stochastic rounding instead of nearest-even         (false)
//   -- fp8mix: every GEMM input of a unit fine-grain quantized (DeepSeek-V3 §3.3.2),
//      fp32 scales, fp32 accumulation
//   low_format           "e3m2" | "e2m3" | "e2m1" | "e4m3" | "e5m2"                   ("e3m2")
//   recovery_format      the same choices                                            ("e4m3")
//   tile                 activation tile 1 x tile, weight block tile x tile           (128)
//   -- int8: forward and input-gradient GEMMs take int8 inputs (per-token activations,
//      per-output-channel weights, symmetric); the recovery path is bf16. No keys.
//   -- bf16: projections take bf16 GEMM inputs, fp32 accumulation; fp32: projections at
//      train.gemm_precision. Neither has a low path; both ignore the routing plan.
//
// Interplay with train.gemm_precision (the backend-wide GEMM setting): it governs every GEMM a
// recipe does not set itself — the lm_head always, the projections under fp32, and the
// GEMMs of actq. Recipes bf16, fp8mix and int8 fix their projections' GEMM inputs themselves.
//
// A group size that does not divide a unit's input width (e.g. 128 and ffn_dim 172) is
// replaced for that unit by its largest divisor below it (86), so a group never grows.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "precision/path_spec.h"

namespace gnmr {

struct PrecisionRecipe {
  std::string name = "fp32";
  bool has_low_path = false;  // false: every unit runs `recovery`, whatever the plan says
  PathSpec low;
  PathSpec recovery;
  uint64_t seed = 0;  // stochastic rounding
  // Layers whose units always run the recovery path, outside the controller's budget (a
  // config-fixed assignment, e.g. [0, -1] = the first and the last layer; negative counts
  // from the end). With controller static_low this is the "static first/last layer" baseline.
  std::vector<int> recovery_layers;
};

// The whole `precision` section with its defaults: the config schema (config/defaults.cpp).
nlohmann::json recipe_defaults();

// Parses a `precision` section (missing keys take their defaults). Throws
// std::invalid_argument whose message names the key, e.g. "precision.low_bits" is 12, ...
PrecisionRecipe recipe_from_json(const nlohmann::json& precision_section);

// A named recipe with all defaults: recipe_from_json({"recipe": name}).
PrecisionRecipe recipe_by_name(const std::string& name);

}  // namespace gnmr
