#include "train/checkpoint_manifest.h"

#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "train/zero_checkpoint.h"
#include "util/atomic_file.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gnmr {

namespace {

// CRC-32 rather than a 64-bit hash: it catches every burst of up to 32 flipped bits and lets
// random damage through with probability 2^-32 per file, plenty for accidental damage (this
// is no defence against tampering), and zlib is already a dependency. Cost next to the
// write: README "Data formats" (bench_checkpoint measures it).
constexpr const char* kManifestName = "manifest.json";
constexpr const char* kManifestFormat = "gnmr-checkpoint-manifest";
constexpr int kManifestVersion = 1;

std::string crc32_hex(uint32_t crc) {
  char text[16];
  std::snprintf(text, sizeof(text), "%08x", crc);
  return text;
}

// The manifest's entries, or why it cannot be used.
std::string read_manifest(const fs::path& path, json& files) {
  std::string text;
  try {
    text = read_file(path.string());
  } catch (const Error& e) {
    return std::string(kManifestName) + " cannot be read (" + e.what() + ")";
  }
  json manifest = json::parse(text, nullptr, /*allow_exceptions=*/false);
  // Compared as JSON values, never converted: a format or version of another type, or past
  // int's range, is a damaged manifest, not json's type_error or an overflowing conversion.
  if (manifest.is_discarded() || !manifest.is_object() ||
      manifest["format"] != json(kManifestFormat) || !manifest["files"].is_object()) {
    return std::string(kManifestName) + " is damaged (not a gnmr checkpoint manifest)";
  }
  if (manifest["version"] != json(kManifestVersion)) {
    return std::string(kManifestName) + " has version " + manifest["version"].dump() +
           ", this build reads version " + std::to_string(kManifestVersion);
  }
  files = manifest["files"];
  return "";
}

std::string file_problem(const fs::path& dir, const std::string& name, const json& entry) {
  fs::path path = dir / name;
  if (!entry.is_object() || !entry.contains("bytes") || !entry["bytes"].is_number_unsigned() ||
      !entry.contains("crc32") || !entry["crc32"].is_string()) {
    return std::string(kManifestName) + " is damaged (bad entry for " + name + ")";
  }
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return std::string(kManifestName) + " is damaged (\"" + name + "\" is not a file name)";
  }
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return name + " is missing (the manifest lists it)";
  const uint64_t expected_bytes = entry["bytes"];
  const uint64_t bytes = fs::file_size(path, ec);
  if (ec) return name + " cannot be read (" + ec.message() + ")";
  if (bytes != expected_bytes) {
    return name + " is damaged (size mismatch: manifest says " + std::to_string(expected_bytes) +
           " bytes, file has " + std::to_string(bytes) + ")";
  }
  const std::string expected_crc = entry["crc32"];
  std::string crc;
  try {
    crc = crc32_hex(file_crc32(path.string()));
  } catch (const Error& e) {
    return name + " cannot be read (" + e.what() + ")";
  }
  if (crc != expected_crc) {
    return name + " is damaged (checksum mismatch: manifest says crc32 " + expected_crc +
           ", file has crc32 " + crc + ")";
  }
  return "";
}

// The files DIR must hold: required_checkpoint_files(), where a ZeRO-1 checkpoint's
// optimizer state is its shard index and the shard files it lists (train/zero_checkpoint.h).
std::vector<std::string> required_files_of(const fs::path& root) {
  std::vector<std::string> files = required_checkpoint_files();
  std::error_code ec;
  if (fs::is_regular_file(root / "optimizer.safetensors", ec) ||
      !fs::is_regular_file(root / kZeroShardsIndexName, ec)) {
    return files;
  }
  files.erase(std::find(files.begin(), files.end(), "optimizer.safetensors"));
  files.push_back(kZeroShardsIndexName);
  json index = json::parse(read_file((root / kZeroShardsIndexName).string()), nullptr, false);
  if (index.is_object() && index["files"].is_array()) {
    for (const json& name : index["files"]) {
      if (name.is_string()) files.push_back(name.get<std::string>());
    }
  }
  return files;
}

}  // namespace

const std::vector<std::string>& required_checkpoint_files() {
  static const std::vector<std::string> files = {"model.safetensors", "optimizer.safetensors",
                                                 "trainer.json", "controller.bin", "config.json"};
  return files;
}

uint32_t file_crc32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::Runtime, "cannot open " + path);
  std::vector<char> buffer(size_t(1) << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  while (in) {
    in.read(buffer.data(), std::streamsize(buffer.size()));
    const std::streamsize n = in.gcount();
    if (n > 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(buffer.data()), uInt(n));
  }
  if (in.bad()) throw Error(ErrorKind::Runtime, "read " + path + " failed");
  return uint32_t(crc);
}

void write_checkpoint_manifest(const std::string& dir) {
  json files = json::object();
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name == kManifestName) continue;
    files[name] = {{"bytes", uint64_t(entry.file_size())},
                   {"crc32", crc32_hex(file_crc32(entry.path().string()))}};
  }
  json manifest = {{"format", kManifestFormat},
                   {"version", kManifestVersion},
                   {"checksum", "crc32"},
                   {"files", files}};
  write_file_atomic((fs::path(dir) / kManifestName).string(), manifest.dump(2) + "\n");
}

std::string checkpoint_problem(const std::string& dir, CheckpointUse use) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::exists(root, ec)) return "does not exist";
  if (!fs::is_directory(root, ec)) return "not a directory";
  if (fs::is_directory(root / "checkpoints", ec)) {
    return "is a run directory, not a checkpoint: give one of its checkpoints, " + dir +
           "/checkpoints/step_N";
  }
  // The files USE reads: all of them to resume; the weights' own otherwise.
  static const std::vector<std::string> weights_files = {"model.safetensors", "config.json",
                                                         "tokenizer.model"};
  const bool weights_only = use == CheckpointUse::Weights;
  // (tokenizer.model is there only when the run had one.)
  const std::vector<std::string> required =
      weights_only ? std::vector<std::string>(weights_files.begin(), weights_files.begin() + 2)
                   : required_files_of(root);
  for (const std::string& name : required) {
    if (!fs::is_regular_file(root / name, ec)) return name + " is missing";
  }
  if (!fs::exists(root / kManifestName, ec)) {
    spdlog::warn(
        "checkpoint {} has no {} (written before gnmr recorded checksums): its files are used "
        "unchecked",
        dir, kManifestName);
    return "";
  }
  json files;
  std::string problem = read_manifest(root / kManifestName, files);
  if (!problem.empty()) return problem;
  for (const std::string& name : required) {
    if (!files.contains(name)) return std::string(kManifestName) + " does not list " + name;
  }
  for (auto it = files.begin(); it != files.end(); ++it) {
    if (weights_only &&
        std::find(weights_files.begin(), weights_files.end(), it.key()) == weights_files.end()) {
      continue;
    }
    problem = file_problem(root, it.key(), *it);
    if (!problem.empty()) return problem;
  }
  return "";
}

void verify_checkpoint(const std::string& dir, CheckpointUse use) {
  const std::string problem = checkpoint_problem(dir, use);
  if (!problem.empty()) throw Error(ErrorKind::Checkpoint, "checkpoint " + dir + ": " + problem);
}

}  // namespace gnmr
