// The safetensors file format (Hugging Face): u64 little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then raw data.
// Used for checkpoints (fp32 master weights, optimizer moments) and HF export/import.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gnmr {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // "F32" or "BF16" when writing
  std::vector<int64_t> shape;
  const void* data;  // numel × dtype size bytes, owned by the caller
};

// Writes PATH directly (callers write into a temporary directory that is published
// atomically afterwards). Tensors are stored in the order given.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A safetensors file read fully into memory and validated on open: a truncated file,
// offsets outside the data, overlapping or unknown dtypes are Checkpoint errors.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  std::vector<std::string> names() const;
  const std::vector<int64_t>& shape(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Converts F32, BF16 or F16 data to fp32; the shape must equal expected_shape.
  void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                float* out) const;

 private:
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  const Entry& entry(const std::string& name) const;
  std::string path_;
  std::string bytes_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace gnmr
