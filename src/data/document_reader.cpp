#include "data/document_reader.h"

#include <zlib.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/utf8.h"
#include "util/error.h"

namespace gnmr {

namespace {

// Whether S ends with SUFFIX (lower case), in any case: "C4.JSONL.GZ" is gzip'd JSON Lines.
bool ends_with(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  const size_t start = s.size() - suffix.size();
  for (size_t i = 0; i < suffix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[start + i])) != suffix[i]) return false;
  }
  return true;
}

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string::npos;
}

// The UTF-16 code unit of the escape \uXXXX at LINE[i] (LINE[i] == '\\'), or -1.
int escaped_code_unit(const std::string& line, size_t i) {
  if (i + 5 >= line.size() || line[i + 1] != 'u') return -1;
  int unit = 0;
  for (size_t k = i + 2; k < i + 6; ++k) {
    const char c = line[k];
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return -1;
    unit = unit * 16 + digit;
  }
  return unit;
}

// JSON text with every \u escape of a lone UTF-16 surrogate replaced by \ufffd; the number
// replaced in REPLACED. Python's json.dumps writes a lone surrogate that way (ensure_ascii), and
// the JSON parser refuses it: one such record would stop a long prepare, where invalid UTF-8
// bytes are counted and replaced (utf8.h) instead.
std::string with_lone_surrogates_replaced(const std::string& line, int64_t& replaced) {
  std::string out;
  out.reserve(line.size());
  replaced = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] != '\\' || i + 1 >= line.size()) {
      out.push_back(line[i]);
      continue;
    }
    const int unit = escaped_code_unit(line, i);
    if (unit < 0) {  // another escape: copy it whole, so "\\\\" is not read as an escape
      out.append(line, i, 2);
      ++i;
      continue;
    }
    const bool high = unit >= 0xD800 && unit <= 0xDBFF;
    const bool low = unit >= 0xDC00 && unit <= 0xDFFF;
    const int next =
        i + 6 < line.size() && line[i + 6] == '\\' ? escaped_code_unit(line, i + 6) : -1;
    if (high && next >= 0xDC00 && next <= 0xDFFF) {  // a pair: both escapes as they are
      out.append(line, i, 12);
      i += 11;
    } else if (high || low) {
      out += "\\ufffd";
      ++replaced;
      i += 5;
    } else {
      out.append(line, i, 6);
      i += 5;
    }
  }
  return out;
}

}  // namespace

DocumentFormat document_format_for(const std::string& path) {
  std::string name = path;
  if (ends_with(name, ".gz")) name.resize(name.size() - 3);
  if (ends_with(name, ".jsonl") || ends_with(name, ".json") || ends_with(name, ".ndjson")) {
    return DocumentFormat::JsonLines;
  }
  return DocumentFormat::PlainText;
}

void check_inputs_readable(const std::vector<std::string>& inputs) {
  for (const auto& input : inputs) {
    std::error_code ec;
    if (!std::filesystem::exists(input, ec)) {
      throw Error(ErrorKind::Data, "input " + input + ": file not found");
    }
    if (!std::filesystem::is_regular_file(input, ec)) {
      throw Error(ErrorKind::Data, "input " + input + ": not a regular file");
    }
    // zlib reads a file without the gzip header as plain text; a .gz name promises gzip.
    if (ends_with(input, ".gz")) {
      char magic[2] = {0, 0};
      std::ifstream(input, std::ios::binary).read(magic, 2);
      if (static_cast<unsigned char>(magic[0]) != 0x1F ||
          static_cast<unsigned char>(magic[1]) != 0x8B) {
        throw Error(ErrorKind::Data, "input " + input +
                                         ": not gzip data (no 1f 8b header); rename it without "
                                         ".gz if it is plain text");
      }
    }
  }
}

DocumentReader::DocumentReader(const std::string& path)
    : path_(path), format_(document_format_for(path)), chunk_(1 << 16) {
  check_inputs_readable({path});
  file_ = gzopen(path.c_str(), "rb");
  if (file_ == nullptr) {
    throw Error(ErrorKind::Data, "input " + path + ": cannot open (" + std::strerror(errno) + ")");
  }
  gzbuffer(file_, 1 << 18);
}

DocumentReader::~DocumentReader() {
  if (file_ != nullptr) gzclose(file_);
}

int64_t DocumentReader::bytes_consumed() const {
  return file_ ? gzoffset(file_) : 0;
}

// One line without its '\n' (and without a trailing '\r'); false at end of file. The newline
// is looked for in the bytes themselves (not with gzgets and strlen), so a NUL byte, which is
// valid UTF-8, stays in its line instead of cutting it short.
bool DocumentReader::read_line(std::string& line) {
  line.clear();
  bool got_any = false;
  while (true) {
    if (chunk_begin_ == chunk_end_ && !fill_chunk()) break;
    got_any = true;
    const char* begin = chunk_.data() + chunk_begin_;
    const size_t available = chunk_end_ - chunk_begin_;
    const void* newline = std::memchr(begin, '\n', available);
    if (newline != nullptr) {
      const size_t n = static_cast<const char*>(newline) - begin;
      line.append(begin, n);
      chunk_begin_ += n + 1;
      break;
    }
    line.append(begin, available);
    chunk_begin_ = chunk_end_;
  }
  if (!got_any) return false;
  ++line_number_;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (replace_invalid_utf8(line) > 0) count_invalid_line();
  return true;
}

void DocumentReader::count_invalid_line() {
  if (invalid_utf8_lines_ == 0) first_invalid_utf8_line_ = line_number_;
  ++invalid_utf8_lines_;
}

// Refills chunk_ from the file; false at end of file.
bool DocumentReader::fill_chunk() {
  const int n = gzread(file_, chunk_.data(), static_cast<unsigned>(chunk_.size()));
  int zerr = Z_OK;
  const char* message = gzerror(file_, &zerr);
  if (n < 0 || (zerr != Z_OK && zerr != Z_STREAM_END)) {
    throw Error(ErrorKind::Data, "input " + path_ + ": read failed after line " +
                                     std::to_string(line_number_) + " (" + message +
                                     "; truncated or corrupt gzip?)");
  }
  chunk_begin_ = 0;
  chunk_end_ = static_cast<size_t>(n);
  return n > 0;
}

bool DocumentReader::next(std::string& text) {
  return format_ == DocumentFormat::JsonLines ? next_json_document(text) : next_text_document(text);
}

bool DocumentReader::next_json_document(std::string& text) {
  std::string line;
  while (read_line(line)) {
    if (is_blank(line)) continue;
    const std::string where = path_ + ":" + std::to_string(line_number_);
    auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded()) {
      int64_t replaced = 0;
      const std::string repaired = with_lone_surrogates_replaced(line, replaced);
      if (replaced > 0) {
        record = nlohmann::json::parse(repaired, nullptr, /*allow_exceptions=*/false);
        if (!record.is_discarded()) count_invalid_line();
      }
    }
    if (record.is_discarded()) {
      throw Error(ErrorKind::Data, where +
                                       ": not valid JSON (JSON Lines input needs one object "
                                       "per line)");
    }
    auto field = record.is_object() ? record.find("text") : record.end();
    if (!record.is_object() || field == record.end() || !field->is_string()) {
      throw Error(ErrorKind::Data, where +
                                       ": no string \"text\" field (JSON Lines input needs "
                                       "{\"text\": \"...\"} on every line)");
    }
    text = field->get<std::string>();
    if (!text.empty()) return true;
  }
  return false;
}

bool DocumentReader::next_text_document(std::string& text) {
  text.clear();
  std::string line;
  while (read_line(line)) {
    if (is_blank(line)) {
      if (!text.empty()) return true;
      continue;
    }
    if (!text.empty()) text.push_back('\n');
    text += line;
  }
  return !text.empty();
}

}  // namespace gnmr
