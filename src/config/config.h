// The resolved run configuration: plain structs, one per config section.
// The JSON defaults in config/defaults.cpp are the schema: every key a user may set
// exists there with its default value and type. README "Config reference" lists them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/controller_options.h"
#include "precision/recipe.h"

namespace gnmr {

// The most CPU threads a run or `gnmr eval` takes: far above any node's cores, below what
// OpenMP fails (or crashes) creating.
constexpr int kMaxThreads = 1024;

struct ModelConfig {
  std::string name = "tiny";
  int dim = 64;  // hidden size
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 4;  // grouped-query attention when < n_heads
  int ffn_dim = 172;   // SwiGLU inner size
  int vocab_size = 4096;
  int max_seq_len = 256;  // upper bound for data.seq_len (rotary table size)
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  float init_std = 0.02f;
  // The attention kernel: "flash" (fused, no T x T tensor, fp32; cuda only), "flash_bf16"
  // (the same on bf16 tensor cores, mma.sync; cuda only), "flash_wgmma" (the same on sm_90a's
  // wgmma; H100 / H200 only, not yet run on a GPU), "materialized" (the probabilities kept for the
  // backward; the cpu backend's, v1 on cuda) or "auto" (flash on cuda where its kernels take
  // the shape, materialized on cpu). The cuda backend says which per layer
  // (backend/cuda/cuda_backend.h).
  std::string attention = "auto";
  int head_dim() const { return dim / n_heads; }
};

struct DataConfig {
  std::string train;      // glob of train shards, e.g. data/brown/train_*.bin
  std::string val;        // glob of validation shards
  std::string tokenizer;  // sentencepiece .model used to make the shards
  int seq_len = 128;
  std::string sampling = "random";  // random | sequential | shuffled (data/loader.h)
};

struct TrainConfig {
  int64_t steps = 200;
  double lr = 3e-3;
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio
  int64_t warmup_steps = 20;
  int64_t global_batch_tokens = 4096;  // tokens per optimizer step across all ranks
  int micro_batch = 8;                 // sequences per forward/backward on one rank
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global-norm clip; 0 disables
  uint64_t seed = 1234;
  int max_nonfinite_steps = 3;          // consecutive non-finite steps before the run stops
  std::string gemm_precision = "fp32";  // fp32 | bf16 (bf16-rounded inputs, fp32 accumulation)
  int threads = 0;                      // CPU threads; 0 = all cores
};

struct EvalConfig {
  int64_t every = 100;     // steps between validations; 0 = only at the end
  int64_t tokens = 32768;  // validation token budget
};

struct CheckpointConfig {
  int64_t every = 0;  // steps between checkpoints; 0 = only at the end
  int keep = 3;       // keep the newest K checkpoints
};

struct LogConfig {
  int64_t every = 10;  // steps between human log lines (metrics.jsonl gets every step)
  std::string level = "info";
  bool gnmr_trace =
      false;  // write RUN_DIR/gnmr_trace.jsonl: per-unit norm, GNMR, Δ-GNMR, risk, lock, path
  // Measure every unit's recovery gap each step (two extra forward+backward passes; always on
  // for gnmr.controller = oracle) and put it in the trace. Research only, one rank.
  bool recovery_gap = false;
};

struct DistConfig {
  std::string communicator = "auto";  // auto (nccl on cuda, mpi on cpu, when launched with > 1
                                      // process) | local | mpi | nccl
  double timeout_s = 600;  // deadline of every nccl wait and of the rendezvous (a dead rank)
  // The deadline instead while rank 0 writes a checkpoint and the other ranks wait for it: a
  // large model on a slow shared filesystem takes far longer than a collective.
  double checkpoint_timeout_s = 3600;
  // How GPU ranks that MPI did not start share the NCCL id (parallel/rendezvous.h): "tcp" (rank
  // 0 listens at MASTER_ADDR:MASTER_PORT) | "file" (files in rendezvous_dir, a directory every
  // node shares, for sites that open no port between nodes).
  std::string rendezvous = "tcp";
  std::string rendezvous_dir;  // dist.rendezvous=file only
  // Gradient all-reduce buckets of about this many MiB, each started as soon as backward has
  // finished it (overlapped with the rest of backward); 0 = one blocking sum after backward.
  double bucket_mb = 25.0;
  int64_t check_every = 100;  // steps between cross-rank plan/weight hash checks; 0 = off
  // 0: plain data parallelism (every rank holds and updates everything); 1: ZeRO-1 (each
  // rank keeps the AdamW moments of, and updates, its 1/world shard; docs/DESIGN.md §7).
  int zero = 0;
};

struct RunConfig {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  LogConfig log;
  PrecisionRecipe precision;  // section "precision" (src/precision/recipe.h)
  ControllerOptions gnmr;     // section "gnmr" (src/controller/controller_options.h)
  DistConfig dist;
  std::string backend = "cpu";  // cpu | cuda
  nlohmann::json resolved;      // the full resolved JSON (what config.json in a run dir holds)
};

// The model shape and the sequence length it runs at: every field positive, heads dividing
// dim (into an even head dim, for rotary) and kv heads dividing heads, seq_len within
// max_seq_len. Throws Error(Config) naming the field. The one check of a shape: the config
// loader and LlamaModel's constructor both call it.
void validate_model_shape(const ModelConfig& model, int seq_len);

// Loads FILE (following "include" chains, relative to each including file), applies
// each "key.path=value" override, validates, and returns the typed config.
// Throws Error(Config) naming the key path on any problem.
RunConfig load_run_config(const std::string& file, const std::vector<std::string>& overrides);

// The same from an already-resolved JSON (e.g. a checkpoint's config.json).
RunConfig run_config_from_json(const nlohmann::json& resolved);

// The schema with all defaults.
const nlohmann::json& default_config_json();

}  // namespace gnmr
