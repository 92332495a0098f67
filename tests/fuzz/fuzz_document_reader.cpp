// Fuzz target: reading documents out of a corpus file (src/data/document_reader.cpp), as
// `gnmr prepare` and `gnmr tokenizer train` do. The first input byte picks how the rest is
// stored: bit 0 JSON Lines (.jsonl) or plain text (.txt); bit 1 a .gz name; bit 2 the rest
// gzip-compressed here (else written as it is, so a .gz name over other bytes is refused, a
// cut gzip stream fails mid-read). Every failure must be an Error(Data); every document must
// be non-empty, valid UTF-8 (invalid bytes were replaced), and for plain text hold no blank
// line (blank lines separate documents).
#include <zlib.h>

#include <cstdint>
#include <string>

#include "data/document_reader.h"
#include "data/utf8.h"
#include "fuzz_scratch.h"

namespace {

std::string gzip(const uint8_t* data, size_t size) {
  z_stream stream{};
  if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK) {
    __builtin_trap();
  }
  std::string out(deflateBound(&stream, uLong(size)) + 32, '\0');
  stream.next_in = const_cast<Bytef*>(data);
  stream.avail_in = uInt(size);
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = uInt(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) __builtin_trap();
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

bool has_blank_line(const std::string& text) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (text.find_first_not_of(" \t\r\f\v", start) >= end) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool jsonl = data[0] & 1;
  const bool gz_name = data[0] & 2;
  const bool compress = data[0] & 4;
  const std::string path =
      gnmr_fuzz::scratch_dir() + "/input" + (jsonl ? ".jsonl" : ".txt") + (gz_name ? ".gz" : "");
  if (compress) {
    const std::string packed = gzip(data + 1, size - 1);
    gnmr_fuzz::write_bytes(path, reinterpret_cast<const uint8_t*>(packed.data()), packed.size());
  } else {
    gnmr_fuzz::write_bytes(path, data + 1, size - 1);
  }
  try {
    gnmr::DocumentReader reader(path);
    std::string text;
    while (reader.next(text)) {
      if (text.empty()) __builtin_trap();
      std::string copy = text;
      if (gnmr::replace_invalid_utf8(copy) != 0) __builtin_trap();
      if (!jsonl && has_blank_line(text)) __builtin_trap();
    }
  } catch (const gnmr::Error& e) {
    gnmr_fuzz::check_error(e, gnmr::ErrorKind::Data);
  }
  return 0;
}
