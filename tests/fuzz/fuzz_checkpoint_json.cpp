// Fuzz target: a checkpoint's two JSON indexes, manifest.json (src/train/checkpoint_manifest.cpp)
// and a ZeRO-1 checkpoint's optimizer_shards.json (src/train/zero_checkpoint.cpp), as resume,
// eval and export read them. The input is written as both files into a checkpoint folder whose
// other required files exist; then checkpoint_problem (which reads the shard index's file list
// and every file the manifest names) and zero_checkpoint_world_size run on it.
// checkpoint_problem reports a problem as text and never throws; the shard index's failures
// must be Error(Checkpoint).
#include <cstdint>
#include <string>

#include "fuzz_scratch.h"
#include "train/checkpoint_manifest.h"
#include "train/zero_checkpoint.h"

namespace {

// The checkpoint folder, holding every required file but the optimizer state, each the one
// byte "x" (crc32 8cdc1683), so a manifest can list files that verify. Made on first use.
const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    const std::string d = gnmr_fuzz::scratch_dir();
    const uint8_t x = 'x';
    for (const std::string& name : gnmr::required_checkpoint_files()) {
      if (name != "optimizer.safetensors") gnmr_fuzz::write_bytes(d + "/" + name, &x, 1);
    }
    gnmr_fuzz::write_bytes(d + "/" + gnmr::zero_shard_file_name(0, 1), &x, 1);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = checkpoint_dir();
  gnmr_fuzz::write_bytes(dir + "/manifest.json", data, size);
  gnmr_fuzz::write_bytes(dir + "/" + gnmr::kZeroShardsIndexName, data, size);
  gnmr::checkpoint_problem(dir);
  try {
    gnmr::zero_checkpoint_world_size(dir);
  } catch (const gnmr::Error& e) {
    gnmr_fuzz::check_error(e, gnmr::ErrorKind::Checkpoint);
  }
  return 0;
}
