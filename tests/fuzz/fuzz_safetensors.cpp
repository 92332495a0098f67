// Fuzz target: the safetensors reader (src/train/safetensors.cpp). The input is the whole
// file; every tensor it lists is then read as fp32 under its own shape, as checkpoint and
// HF loading do. Every failure must be an Error(Checkpoint).
#include <cstdint>
#include <vector>

#include "fuzz_scratch.h"
#include "train/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = gnmr_fuzz::scratch_dir() + "/input.safetensors";
  gnmr_fuzz::write_bytes(path, data, size);
  try {
    gnmr::SafetensorsFile file(path);
    std::vector<float> values;
    for (const auto& name : file.names()) {
      const std::vector<int64_t>& shape = file.shape(name);
      // An opened file holds every tensor's bytes, so no count can overflow or exceed the
      // file size.
      int64_t n = 1;
      for (int64_t d : shape) {
        if (d < 0 || __builtin_mul_overflow(n, d, &n)) __builtin_trap();
      }
      if (static_cast<uint64_t>(n) > size) __builtin_trap();
      values.resize(static_cast<size_t>(n));
      try {
        file.read_f32(name, shape, values.data());
      } catch (const gnmr::Error& e) {
        gnmr_fuzz::check_error(e, gnmr::ErrorKind::Checkpoint);
      }
    }
  } catch (const gnmr::Error& e) {
    gnmr_fuzz::check_error(e, gnmr::ErrorKind::Checkpoint);
  }
  return 0;
}
