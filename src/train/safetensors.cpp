#include "train/safetensors.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "precision/bf16.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/json_integer.h"

using nlohmann::json;

namespace gnmr {

namespace {

// Bytes per element of each dtype the safetensors spec defines; 0 for anything else.
size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "BOOL" || dtype == "U8" || dtype == "I8" || dtype == "F8_E5M2" ||
      dtype == "F8_E4M3") {
    return 1;
  }
  return 0;
}

// The element count of SHAPE when every dimension is >= 0 and the count is at most
// max_elements, else -1 (so a header cannot make a reader allocate more than the file holds).
int64_t count_elements_at_most(const std::vector<int64_t>& shape, uint64_t max_elements) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > max_elements / uint64_t(d)) return -1;
    n *= uint64_t(d);
  }
  return n <= max_elements ? int64_t(n) : -1;
}

int64_t count_elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400) == 0) mantissa <<= 1, --exponent;
      bits = sign | (exponent << 23) | ((mantissa & 0x3ff) << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    size_t bytes = size_t(count_elements(t.shape)) * dtype_bytes(t.dtype);
    GNMR_CHECK(dtype_bytes(t.dtype) != 0, "safetensors: unsupported dtype " + t.dtype);
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  // The spec allows padding the header with spaces; align the data to 8 bytes.
  while ((8 + header_text.size()) % 8 != 0) header_text += ' ';
  errno = 0;  // a stream that fails without a system error says "short write", not "Success"
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorKind::Runtime, "cannot create " + path);
  uint64_t header_len = header_text.size();
  out.write(reinterpret_cast<const char*>(&header_len), 8);
  out.write(header_text.data(), std::streamsize(header_text.size()));
  for (const auto& t : tensors) {
    size_t bytes = size_t(count_elements(t.shape)) * dtype_bytes(t.dtype);
    out.write(static_cast<const char*>(t.data), std::streamsize(bytes));
  }
  // close() checked too: NFS reports a failed write back to the server only there.
  out.close();
  if (!out) {
    throw Error(ErrorKind::Runtime, "write " + path + " failed: " +
                                        (errno != 0 ? std::strerror(errno) : "short write"));
  }
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorKind::Checkpoint, path + ": " + why);
  };
  try {
    bytes_ = read_file(path);
  } catch (const Error&) {
    throw bad("cannot read the file (missing?)");
  }
  if (bytes_.size() < 8) throw bad("truncated (no header)");
  uint64_t header_len;
  std::memcpy(&header_len, bytes_.data(), 8);
  if (header_len > bytes_.size() - 8) {
    throw bad("truncated (header says " + std::to_string(header_len) +
              " header bytes, file holds " + std::to_string(bytes_.size() - 8) + ")");
  }
  json header =
      json::parse(bytes_.begin() + 8, bytes_.begin() + 8 + int64_t(header_len), nullptr, false);
  if (header.is_discarded() || !header.is_object()) throw bad("header is not valid JSON");
  data_start_ = 8 + header_len;
  const uint64_t data_size = bytes_.size() - data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) throw bad("\"__metadata__\" must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    Entry e;
    const auto malformed = [&] {
      return bad("tensor \"" + it.key() + "\" has a malformed header entry");
    };
    try {
      e.dtype = it->at("dtype").get<std::string>();
      const json& shape = it->at("shape");
      const json& offsets = it->at("data_offsets");
      if (!shape.is_array() || !offsets.is_array() || offsets.size() != 2) throw malformed();
      // Integers only (util/json_integer.h); a negative dimension is refused below.
      for (const json& d : shape) {
        const std::optional<int64_t> dim = json_int64(d);
        if (!dim) throw malformed();
        e.shape.push_back(*dim);
      }
      const std::optional<int64_t> begin = json_int64(offsets[0]), end = json_int64(offsets[1]);
      if (!begin || !end || *begin < 0 || *end < 0) throw malformed();
      e.begin = uint64_t(*begin);
      e.end = uint64_t(*end);
    } catch (const json::exception&) {
      throw malformed();
    }
    if (e.end > data_size) {
      throw bad("truncated (tensor \"" + it.key() + "\" ends at byte " + std::to_string(e.end) +
                ", data holds " + std::to_string(data_size) + ")");
    }
    const size_t element = dtype_bytes(e.dtype);
    if (element == 0) {
      throw bad("tensor \"" + it.key() + "\" has dtype \"" + e.dtype +
                "\", which is not a safetensors dtype");
    }
    const int64_t count = count_elements_at_most(e.shape, data_size / element);
    if (count < 0) {
      throw bad("tensor \"" + it.key() + "\" has shape " + shape_text(e.shape) +
                ", which does not fit in the file's " + std::to_string(data_size) + " data bytes");
    }
    if (e.end < e.begin || e.end - e.begin != uint64_t(count) * element) {
      throw bad("tensor \"" + it.key() + "\" size does not match its shape " + shape_text(e.shape));
    }
    entries_[it.key()] = e;
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw Error(ErrorKind::Checkpoint, path_ + ": missing tensor \"" + name + "\"");
  return it->second;
}

const std::vector<int64_t>& SafetensorsFile::shape(const std::string& name) const {
  return entry(name).shape;
}

void SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                               float* out) const {
  const Entry& e = entry(name);
  if (e.shape != expected_shape) {
    throw Error(ErrorKind::Checkpoint, path_ + ": tensor \"" + name + "\" has shape " +
                                           shape_text(e.shape) + ", the model expects " +
                                           shape_text(expected_shape));
  }
  const char* src = bytes_.data() + data_start_ + e.begin;
  const int64_t n = count_elements(e.shape);
  if (e.dtype == "F32") {
    std::memcpy(out, src, size_t(n) * 4);
  } else if (e.dtype == "BF16") {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      out[i] = decode_bf16(b);
    }
  } else if (e.dtype == "F16") {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = half_to_float(h);
    }
  } else {
    throw Error(ErrorKind::Checkpoint, path_ + ": tensor \"" + name + "\" has dtype " + e.dtype +
                                           " (supported: F32, BF16, F16)");
  }
}

}  // namespace gnmr
