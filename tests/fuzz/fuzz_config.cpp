// Fuzz target: the run config loader (src/config/config.cpp) with include chains and --set
// overrides. The input is up to four parts separated by a line "====":
//   main.json, a.json, sub/b.json (the files a chain can include, by relative paths such as
//   "a.json", "sub/b.json" or "../a.json"), then --set overrides, one per line.
// A part that is absent leaves its file absent. Every failure must be an Error(Config).
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "fuzz_scratch.h"

namespace {

std::vector<std::string> split_parts(const std::string& text) {
  const std::string separator = "\n====\n";
  std::vector<std::string> parts;
  size_t start = 0;
  while (parts.size() < 3) {
    size_t at = text.find(separator, start);
    if (at == std::string::npos) break;
    parts.push_back(text.substr(start, at - start));
    start = at + separator.size();
  }
  parts.push_back(text.substr(start));
  return parts;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  const std::string dir = gnmr_fuzz::scratch_dir();
  const std::vector<std::string> files = {dir + "/main.json", dir + "/a.json", dir + "/sub/b.json"};
  fs::create_directories(dir + "/sub");
  const std::vector<std::string> parts =
      split_parts(std::string(reinterpret_cast<const char*>(data), size));
  for (size_t i = 0; i < files.size(); ++i) {
    if (i < parts.size()) {
      gnmr_fuzz::write_bytes(files[i], reinterpret_cast<const uint8_t*>(parts[i].data()),
                             parts[i].size());
    } else {
      fs::remove(files[i]);
    }
  }
  const std::vector<std::string> overrides =
      parts.size() > 3 ? split_lines(parts[3]) : std::vector<std::string>{};
  try {
    gnmr::RunConfig config = gnmr::load_run_config(files[0], overrides);
    // The resolved JSON is what a run directory stores; it must load back unchanged.
    gnmr::RunConfig again = gnmr::run_config_from_json(config.resolved);
    if (again.resolved != config.resolved) __builtin_trap();
    // The typed fields hold exactly what the JSON says (no silent narrowing).
    const nlohmann::json& r = config.resolved;
    if (r["model"]["dim"] != config.model.dim || r["model"]["n_layers"] != config.model.n_layers ||
        r["data"]["seq_len"] != config.data.seq_len || r["train"]["steps"] != config.train.steps ||
        r["train"]["micro_batch"] != config.train.micro_batch ||
        r["train"]["seed"] != config.train.seed ||
        r["checkpoint"]["keep"] != config.checkpoint.keep) {
      __builtin_trap();
    }
  } catch (const gnmr::Error& e) {
    gnmr_fuzz::check_error(e, gnmr::ErrorKind::Config);
  }
  return 0;
}
