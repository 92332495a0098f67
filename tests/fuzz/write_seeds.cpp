// Writes the binary seed corpora of the fuzz targets from the real writers, so the seeds
// follow the formats: corpus/shard_header, corpus/safetensors, corpus/controller_state.
//   build/fuzz/tests/fuzz/fuzz_write_seeds tests/fuzz/corpus
// The text seeds (config, trainer_json, hf_config) are written by hand.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "controller/controller.h"
#include "data/shard.h"
#include "precision/bf16.h"
#include "seed_options.h"
#include "train/safetensors.h"
#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

void write_shard_seeds(const fs::path& dir) {
  fs::create_directories(dir);
  gnmr::write_shard_atomic((dir / "uint16.bin").string(), {0, 5, 99, 17, 3, 3, 42, 1}, 100);
  gnmr::write_shard_atomic((dir / "uint32.bin").string(), {0, 65536, 69999, 7}, 70000);
  gnmr::write_shard_atomic((dir / "empty.bin").string(), {}, 32000);
  const std::string whole = gnmr::read_file((dir / "uint16.bin").string());
  write_text(dir / "truncated.bin", whole.substr(0, whole.size() - 3));
}

void write_safetensors_seeds(const fs::path& dir) {
  fs::create_directories(dir);
  const std::vector<float> a = {1.5f, -2.25f, 3.0f, 1e-30f, -0.0f, 7.0f};
  const std::vector<uint16_t> b = {gnmr::encode_bf16(0.5f), gnmr::encode_bf16(-3.0f)};
  const std::vector<uint16_t> h = {0x3c00, 0x8001, 0x7c00, 0x7e00};  // 1, -subnormal, inf, nan
  gnmr::write_safetensors((dir / "three_dtypes.safetensors").string(),
                          {{"a.weight", "F32", {2, 3}, a.data()},
                           {"b", "BF16", {2}, b.data()},
                           {"c", "F16", {2, 2}, h.data()}},
                          {{"format", "pt"}});
  gnmr::write_safetensors((dir / "scalar.safetensors").string(), {{"s", "F32", {}, a.data()}});
  gnmr::write_safetensors((dir / "empty.safetensors").string(), {});
  const std::string whole = gnmr::read_file((dir / "three_dtypes.safetensors").string());
  write_text(dir / "truncated.safetensors", whole.substr(0, whole.size() - 5));
}

// The blob without its 8-byte checksum: fuzz_controller_state appends it.
void write_blob_body(const fs::path& path, const gnmr::Controller& controller) {
  std::vector<uint8_t> blob = controller.save_state();
  blob.resize(blob.size() - 8);
  write_text(path, std::string(blob.begin(), blob.end()));
}

void write_controller_seeds(const fs::path& dir) {
  fs::create_directories(dir);
  gnmr::Controller controller(seed_options(), 2);
  write_blob_body(dir / "fresh.bin", controller);
  std::vector<float> norms(static_cast<size_t>(controller.n_units()), 1.0f);
  for (int step = 0; step < 6; ++step) {
    norms[static_cast<size_t>(step)] = step == 4 ? 40.0f : 1.0f + 0.1f * step;
    controller.observe(step, norms);
  }
  write_blob_body(dir / "six_steps.bin", controller);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_write_seeds CORPUS_DIR (tests/fuzz/corpus)\n");
    return 2;
  }
  const fs::path corpus = argv[1];
  write_shard_seeds(corpus / "shard_header");
  write_safetensors_seeds(corpus / "safetensors");
  write_controller_seeds(corpus / "controller_state");
  return 0;
}
