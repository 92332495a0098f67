// Fuzz target: an HF folder's config.json (src/train/hf_format.cpp), the way `gnmr eval`
// reads it: is_hf_model_dir on the folder, then read_hf_model_section, then the gnmr config
// built from that model section. The input is the file's text. The HF reader's failures
// must be Error(Checkpoint); the config built from its section must be valid.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "config/config.h"
#include "fuzz_scratch.h"
#include "train/hf_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = gnmr_fuzz::scratch_dir();
  gnmr_fuzz::write_bytes(dir + "/config.json", data, size);
  try {
    if (!gnmr::is_hf_model_dir(dir)) __builtin_trap();  // a config.json and no trainer.json
    const nlohmann::json section = gnmr::read_hf_model_section(dir);
    gnmr::run_config_from_json({{"model", section}});
  } catch (const gnmr::Error& e) {
    gnmr_fuzz::check_error(e, gnmr::ErrorKind::Checkpoint);
  }
  return 0;
}
