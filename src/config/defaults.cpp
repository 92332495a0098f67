// The config schema: every key a user may set, with its default value. A key's type is
// the type of its default (an integer default accepts only integers; a float default
// accepts any number). README "Config reference" documents each key.
#include "config/config.h"

namespace gnmr {

namespace {
nlohmann::json make_defaults() {
  nlohmann::json defaults = R"({
    "description": "",
    "backend": "cpu",
    "model": {
      "name": "tiny",
      "dim": 64,
      "n_layers": 2,
      "n_heads": 4,
      "n_kv_heads": 4,
      "ffn_dim": 172,
      "vocab_size": 4096,
      "max_seq_len": 256,
      "norm_eps": 1e-5,
      "rope_theta": 10000.0,
      "init_std": 0.02,
      "attention": "auto"
    },
    "data": {
      "train": "",
      "val": "",
      "tokenizer": "",
      "seq_len": 128,
      "sampling": "random"
    },
    "train": {
      "steps": 200,
      "lr": 3e-3,
      "min_lr_ratio": 0.1,
      "warmup_steps": 20,
      "global_batch_tokens": 4096,
      "micro_batch": 8,
      "weight_decay": 0.1,
      "beta1": 0.9,
      "beta2": 0.95,
      "eps": 1e-8,
      "grad_clip": 1.0,
      "seed": 1234,
      "max_nonfinite_steps": 3,
      "gemm_precision": "fp32",
      "threads": 0
    },
    "eval": {
      "every": 100,
      "tokens": 32768
    },
    "checkpoint": {
      "every": 0,
      "keep": 3
    },
    "log": {
      "every": 10,
      "level": "info",
      "gnmr_trace": false,
      "recovery_gap": false
    },
    "dist": {
      "communicator": "auto",
      "timeout_s": 600.0,
      "checkpoint_timeout_s": 3600.0,
      "rendezvous": "tcp",
      "rendezvous_dir": "",
      "bucket_mb": 25.0,
      "check_every": 100,
      "zero": 0
    },
    "debug": {
      "nonfinite_grad_steps": [],
      "diverge_weights_steps": [],
      "diverge_plan_steps": [],
      "crash_rank": -1,
      "crash_step": 0,
      "spike_unit": -1,
      "spike_steps": [],
      "spike_scale": 100.0
    }
  })"_json;
  // The controller owns its section's schema (src/controller depends on nothing else).
  defaults["gnmr"] = controller_options_defaults();
  // The recipe parser owns the precision section's schema (src/precision/recipe.h).
  defaults["precision"] = recipe_defaults();
  return defaults;
}
}  // namespace

const nlohmann::json& default_config_json() {
  static const nlohmann::json defaults = make_defaults();
  return defaults;
}

}  // namespace gnmr
