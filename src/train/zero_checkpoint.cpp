#include "train/zero_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "model/param_table.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/safetensors.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/json_integer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gnmr {

namespace {

constexpr const char* kIndexFormat = "gnmr-zero-optimizer-shards";
constexpr int kIndexVersion = 1;

struct ShardIndex {
  int world_size = 0;
  int64_t shard_elements = 0, flat_elements = 0;
};

ShardIndex read_index(const std::string& dir) {
  const fs::path path = fs::path(dir) / kZeroShardsIndexName;
  json j = json::parse(read_file(path.string()), nullptr, /*allow_exceptions=*/false);
  ShardIndex index;
  auto not_an_index = [&] {
    return Error(ErrorKind::Checkpoint,
                 "checkpoint " + dir + ": " + kZeroShardsIndexName +
                     " is damaged (not a version-1 gnmr ZeRO-1 shard index)");
  };
  // format and version compared as JSON values, never converted: a string or 1e300 where an
  // int belongs reads as damaged instead of throwing json's own error or overflowing an int.
  if (j.is_discarded() || !j.is_object() || j["format"] != json(kIndexFormat) ||
      j["version"] != json(kIndexVersion)) {
    throw not_an_index();
  }
  // Read as int64 (util/json_integer.h) and range-checked before any narrowing or product: a
  // damaged count must not wrap into a plausible one, nor overflow the product below.
  const std::optional<int64_t> world_size_read = json_int64(j["world_size"]);
  const std::optional<int64_t> shard_elements = json_int64(j["shard_elements"]);
  const std::optional<int64_t> flat_elements = json_int64(j["flat_elements"]);
  if (!world_size_read || !shard_elements || !flat_elements) {
    throw not_an_index();
  }
  const int64_t world_size = *world_size_read;
  index.shard_elements = *shard_elements;
  index.flat_elements = *flat_elements;
  int64_t all_shards = 0;
  if (world_size < 1 || world_size > std::numeric_limits<int>::max() || index.shard_elements < 0 ||
      index.flat_elements < 0 ||
      __builtin_mul_overflow(index.shard_elements, world_size, &all_shards) ||
      all_shards < index.flat_elements) {
    throw Error(ErrorKind::Checkpoint, "checkpoint " + dir + ": " + kZeroShardsIndexName +
                                           " is damaged (inconsistent sizes)");
  }
  index.world_size = int(world_size);
  return index;
}

// The shard layout the checkpoint's index describes, checked against the model's table.
ZeroShardLayout layout_of(const std::string& dir, const ShardIndex& index,
                          const std::vector<ParamInfo>& params, int64_t flat_elements) {
  ZeroShardLayout layout = make_zero_shard_layout(params, flat_elements, index.world_size);
  if (index.flat_elements != flat_elements || index.shard_elements != layout.shard_elements) {
    throw Error(ErrorKind::Checkpoint,
                "checkpoint " + dir + ": " + kZeroShardsIndexName + " describes " +
                    std::to_string(index.flat_elements) + " flat elements in shards of " +
                    std::to_string(index.shard_elements) + ", the model has " +
                    std::to_string(flat_elements) + " in shards of " +
                    std::to_string(layout.shard_elements));
  }
  return layout;
}

// One rank's moments from its shard file: m then v, each [shard_elements].
std::vector<float> read_shard_file(const std::string& dir, int rank, const ShardIndex& index) {
  SafetensorsFile file((fs::path(dir) / zero_shard_file_name(rank, index.world_size)).string());
  const size_t s = size_t(index.shard_elements);
  std::vector<float> moments(2 * s);
  file.read_f32("m", {index.shard_elements}, moments.data());
  file.read_f32("v", {index.shard_elements}, moments.data() + s);
  return moments;
}

}  // namespace

std::string zero_shard_file_name(int rank, int world_size) {
  return "optimizer.shard_" + std::to_string(rank) + "_of_" + std::to_string(world_size) +
         ".safetensors";
}

void write_zero_optimizer_state(Communicator& comm, Backend& backend, ZeroAdamW& optimizer,
                                const std::string& dir,
                                const std::map<std::string, std::string>& meta) {
  const ZeroShardLayout& layout = optimizer.layout();
  const size_t s = size_t(layout.shard_elements);
  std::vector<float> moments(2 * s);
  json files = json::array();
  for (int r = 0; r < layout.world_size; ++r) {
    if (comm.rank() == r) {
      backend.copy_to_host(optimizer.first_moment_shard(), moments.data());
      backend.copy_to_host(optimizer.second_moment_shard(), moments.data() + s);
    }
    if (r != 0) comm.broadcast(moments.data(), moments.size() * sizeof(float), r);
    const std::string name = zero_shard_file_name(r, layout.world_size);
    files.push_back(name);
    if (comm.rank() != 0) continue;
    std::map<std::string, std::string> shard_meta = meta;
    shard_meta["zero_rank"] = std::to_string(r);
    shard_meta["zero_world_size"] = std::to_string(layout.world_size);
    write_safetensors((fs::path(dir) / name).string(),
                      {{"m", "F32", {layout.shard_elements}, moments.data()},
                       {"v", "F32", {layout.shard_elements}, moments.data() + s}},
                      shard_meta);
  }
  if (comm.rank() != 0) return;
  json index = {{"format", kIndexFormat},
                {"version", kIndexVersion},
                {"world_size", layout.world_size},
                {"shard_elements", layout.shard_elements},
                {"flat_elements", layout.flat_elements},
                {"padding_elements", layout.padding_elements()},
                {"files", files}};
  write_file_atomic((fs::path(dir) / kZeroShardsIndexName).string(), index.dump(2) + "\n");
}

int zero_checkpoint_world_size(const std::string& dir) {
  if (!fs::exists(fs::path(dir) / kZeroShardsIndexName)) return 0;
  return read_index(dir).world_size;
}

std::string zero_resume_refusal(const std::string& dir, int saved_world, int zero, int world_size) {
  const std::string ranks =
      world_size > 0 ? std::to_string(world_size) + " rank(s) with " : std::string();
  // `checkpoint consolidate CKPT` writes CKPT_consolidated: where it exists, it is the way on.
  const std::string consolidated = without_trailing_separator(dir) + "_consolidated";
  const std::string way_on =
      fs::exists(fs::path(consolidated) / "config.json")
          ? "Its consolidated copy exists: resume from it under any world size with --resume " +
                consolidated
          : "Consolidate it first: gnmr checkpoint consolidate " + dir +
                " (then resume from the consolidated copy under any world size)";
  return "checkpoint " + dir + " holds ZeRO-1 optimizer state sharded over " +
         std::to_string(saved_world) + " ranks; this run has " + ranks +
         "dist.zero=" + std::to_string(zero) + ", so it resumes only with dist.zero=1 on " +
         std::to_string(saved_world) + " ranks. " + way_on;
}

void read_zero_optimizer_state(const std::string& dir, const std::vector<ParamInfo>& params,
                               Backend& backend, ZeroAdamW& optimizer) {
  const ZeroShardLayout& layout = optimizer.layout();
  const size_t s = size_t(layout.shard_elements);
  std::vector<float> moments(2 * s, 0.0f);
  if (fs::exists(fs::path(dir) / kZeroShardsIndexName)) {
    const ShardIndex index = read_index(dir);
    if (index.world_size != layout.world_size) {
      throw Error(ErrorKind::Checkpoint,
                  zero_resume_refusal(dir, index.world_size, 1, layout.world_size));
    }
    layout_of(dir, index, params, layout.flat_elements);
    moments = read_shard_file(dir, optimizer.rank(), index);
  } else {
    SafetensorsFile file((fs::path(dir) / "optimizer.safetensors").string());
    std::vector<float> host;
    for (const ShardPiece& piece : layout.pieces[size_t(optimizer.rank())]) {
      const ParamInfo& p = params[size_t(piece.param_index)];
      host.resize(size_t(param_numel(p)));
      file.read_f32("m." + p.name, p.shape, host.data());
      std::copy_n(host.data() + piece.param_begin, piece.count,
                  moments.data() + piece.shard_offset);
      file.read_f32("v." + p.name, p.shape, host.data());
      std::copy_n(host.data() + piece.param_begin, piece.count,
                  moments.data() + s + size_t(piece.shard_offset));
    }
  }
  backend.copy_from_host(optimizer.first_moment_shard(), moments.data());
  backend.copy_from_host(optimizer.second_moment_shard(), moments.data() + s);
}

void read_consolidated_moments(const std::string& dir, std::vector<ParamInfo>& params,
                               std::vector<std::vector<float>>& first,
                               std::vector<std::vector<float>>& second) {
  const RunConfig config = run_config_from_json(read_checkpoint_config(dir));
  params = build_param_table(config.model).params;
  const ShardIndex index = read_index(dir);
  const ZeroShardLayout layout = layout_of(dir, index, params, flat_elements_of(params));
  first.assign(params.size(), {});
  second.assign(params.size(), {});
  for (size_t i = 0; i < params.size(); ++i) {
    first[i].assign(size_t(param_numel(params[i])), 0.0f);
    second[i].assign(first[i].size(), 0.0f);
  }
  const size_t s = size_t(layout.shard_elements);
  for (int r = 0; r < layout.world_size; ++r) {
    const std::vector<float> moments = read_shard_file(dir, r, index);
    for (const ShardPiece& piece : layout.pieces[size_t(r)]) {
      const size_t i = size_t(piece.param_index);
      std::copy_n(moments.data() + piece.shard_offset, piece.count,
                  first[i].data() + piece.param_begin);
      std::copy_n(moments.data() + s + size_t(piece.shard_offset), piece.count,
                  second[i].data() + piece.param_begin);
    }
  }
}

void consolidate_checkpoint(const std::string& src_dir, const std::string& out_dir) {
  if (fs::exists(out_dir)) {
    throw Error(ErrorKind::Checkpoint, "checkpoint consolidate: " + out_dir +
                                           " already exists; choose a new --out (consolidate "
                                           "never overwrites)");
  }
  verify_checkpoint(src_dir);
  if (zero_checkpoint_world_size(src_dir) == 0) {
    throw Error(ErrorKind::Usage, "checkpoint consolidate: " + src_dir +
                                      " already holds consolidated optimizer state "
                                      "(optimizer.safetensors); it resumes under any world size");
  }
  std::vector<ParamInfo> params;
  std::vector<std::vector<float>> first, second;
  read_consolidated_moments(src_dir, params, first, second);
  // The metadata of the checkpoint's other files (format, step).
  const std::map<std::string, std::string> meta =
      SafetensorsFile((fs::path(src_dir) / "model.safetensors").string()).metadata();

  const fs::path out = fs::absolute(without_trailing_separator(out_dir));
  fs::create_directories(out.parent_path());
  const std::string tmp_prefix = ".tmp_" + out.filename().string() + "_";
  remove_stale_temp_dirs(out.parent_path().string(), tmp_prefix);
  const fs::path tmp = out.parent_path() / (tmp_prefix + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    for (const auto& entry : fs::directory_iterator(src_dir)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_regular_file() || name == "manifest.json" || name == kZeroShardsIndexName ||
          name.rfind("optimizer.shard_", 0) == 0) {
        continue;
      }
      fs::copy_file(entry.path(), tmp / name);
    }
    std::vector<SafetensorsTensor> tensors;
    for (size_t i = 0; i < params.size(); ++i) {
      tensors.push_back({"m." + params[i].name, "F32", params[i].shape, first[i].data()});
      tensors.push_back({"v." + params[i].name, "F32", params[i].shape, second[i].data()});
    }
    write_safetensors((tmp / "optimizer.safetensors").string(), tensors, meta);
    write_checkpoint_manifest(tmp.string());
    publish_directory(tmp.string(), out.string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace gnmr
