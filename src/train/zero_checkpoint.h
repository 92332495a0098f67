// ZeRO-1 optimizer state in checkpoints (docs/DESIGN.md §5, §7). A dist.zero=1 checkpoint
// holds, instead of optimizer.safetensors,
//   optimizer_shards.json                    {"format": "gnmr-zero-optimizer-shards",
//                                             "version": 1, "world_size": W,
//                                             "shard_elements": S, "flat_elements": F,
//                                             "padding_elements": W*S-F, "files": [...]}
//   optimizer.shard_R_of_W.safetensors       "m", "v": f32 [S], rank R's moments, element e
//                                            = flat element R*S + e (train/zero_shards.h)
// Only rank 0 writes (the shards reach it one at a time, so it holds one extra shard, not
// all of them). Such a checkpoint resumes only under dist.zero=1 with the same world size;
// `gnmr checkpoint consolidate` turns it into an ordinary checkpoint (optimizer.safetensors,
// per-parameter moments), which resumes under either setting and any world size.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "parallel/communicator.h"
#include "train/zero_optimizer.h"

namespace gnmr {

constexpr const char* kZeroShardsIndexName = "optimizer_shards.json";

std::string zero_shard_file_name(int rank, int world_size);  // optimizer.shard_R_of_W.safetensors

// Collective: every rank calls it in step. dir: the checkpoint's (temporary) directory on
// rank 0, ignored elsewhere. meta: the safetensors metadata of the checkpoint's files.
void write_zero_optimizer_state(Communicator& comm, Backend& backend, ZeroAdamW& optimizer,
                                const std::string& dir,
                                const std::map<std::string, std::string>& meta);

// The world size a sharded checkpoint was written by, or 0 when DIR holds consolidated
// optimizer state. A damaged index is a Checkpoint error naming it.
int zero_checkpoint_world_size(const std::string& dir);

// Fills this rank's moment shard from DIR: from its shard file when DIR is sharded (the world
// size must match: a Checkpoint error names both sizes and the consolidate command), or from
// the pieces of optimizer.safetensors that fall in the shard.
void read_zero_optimizer_state(const std::string& dir, const std::vector<ParamInfo>& params,
                               Backend& backend, ZeroAdamW& optimizer);

// What a "resume this sharded checkpoint" refusal says (dist.zero, ranks and the fix).
std::string zero_resume_refusal(const std::string& dir, int saved_world, int zero, int world_size);

// The per-parameter moments of a sharded checkpoint DIR (m, v in params order), joined from
// its shard files; the model comes from DIR/config.json.
void read_consolidated_moments(const std::string& dir, std::vector<ParamInfo>& params,
                               std::vector<std::vector<float>>& first,
                               std::vector<std::vector<float>>& second);

// `gnmr checkpoint consolidate`: writes OUT_DIR, a copy of the sharded checkpoint SRC_DIR
// with optimizer.safetensors in place of the shards (temporary directory, manifest,
// publish). Refuses an existing OUT_DIR and a checkpoint that is already consolidated.
void consolidate_checkpoint(const std::string& src_dir, const std::string& out_dir);

}  // namespace gnmr
