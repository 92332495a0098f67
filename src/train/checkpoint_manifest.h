// A checkpoint's completeness and integrity: the files it must hold, and manifest.json, which
// records every file's size and CRC-32 (written last, inside the temporary directory, before
// the checkpoint is published). Resume, eval, export and --init check a checkpoint here
// before reading it, so a missing or damaged file is named instead of half-read.
//
// manifest.json: {"format": "gnmr-checkpoint-manifest", "version": 1, "checksum": "crc32",
//                 "files": {"model.safetensors": {"bytes": 1234, "crc32": "89abcdef"}, ...}}
// A checkpoint from before manifests (no manifest.json) is accepted with a warning once its
// required files are present: its sizes and checksums cannot be checked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gnmr {

// Files every checkpoint holds; tokenizer.model is there only when the run had one.
const std::vector<std::string>& required_checkpoint_files();

// Writes DIR/manifest.json listing the size and CRC-32 of every other file in DIR.
void write_checkpoint_manifest(const std::string& dir);

// What a checkpoint is checked for: resuming the run reads every file; the weights (eval,
// export, --init) read model.safetensors, config.json and tokenizer.model only, so a damaged
// optimizer state does not keep intact weights from being evaluated, exported or trained on.
enum class CheckpointUse { Resume, Weights };

// "" when DIR is a complete, undamaged checkpoint for USE; otherwise what is wrong, naming the
// file, e.g. `trainer.json is missing` or `model.safetensors is damaged (checksum mismatch:
// manifest says crc32 0badf00d, file has crc32 12345678)`. Reads each file it checks once.
std::string checkpoint_problem(const std::string& dir, CheckpointUse use = CheckpointUse::Resume);

// Throws Error(Checkpoint) `checkpoint DIR: <problem>` unless DIR is complete and undamaged for
// USE.
void verify_checkpoint(const std::string& dir, CheckpointUse use = CheckpointUse::Resume);

// CRC-32 (zlib, IEEE 802.3 polynomial) of a whole file.
uint32_t file_crc32(const std::string& path);

}  // namespace gnmr
