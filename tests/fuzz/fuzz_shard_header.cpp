// Fuzz target: opening a token shard (src/data/shard.cpp), which validates the 64-byte
// header, the file size and every token against the vocab size. The input is the whole
// file. Every failure must be an Error(Data); an opened shard must read back all tokens.
#include <cstdint>
#include <vector>

#include "data/shard.h"
#include "fuzz_scratch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = gnmr_fuzz::scratch_dir() + "/input.bin";
  gnmr_fuzz::write_bytes(path, data, size);
  try {
    gnmr::ShardReader shard(path);
    std::vector<int32_t> tokens(static_cast<size_t>(shard.token_count()));
    shard.copy_tokens(0, shard.token_count(), tokens.data());
    for (int32_t t : tokens) {
      if (t < 0 || t >= shard.vocab_size()) __builtin_trap();
    }
  } catch (const gnmr::Error& e) {
    gnmr_fuzz::check_error(e, gnmr::ErrorKind::Data);
  }
  return 0;
}
