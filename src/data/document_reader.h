// Streams documents out of corpus files, one at a time, in constant memory.
//   *.jsonl / *.json / *.ndjson : one document per line, its string field "text" (as C4 ships)
//   anything else               : plain text, one document per block of lines separated by one
//                                 or more blank lines
// Either may be gzip-compressed (*.gz, checked by its magic bytes: a plain file named .gz is
// refused rather than read as text). Bytes that are not valid UTF-8 become U+FFFD (utf8.h),
// as sentencepiece would make them, and so do JSON escapes of lone UTF-16 surrogates
// ("\ud800", which Python's json.dumps writes); the reader counts the lines this happened on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct gzFile_s;  // zlib's gzFile, kept out of this header

namespace gnmr {

enum class DocumentFormat { PlainText, JsonLines };

// Decided from the file name with any .gz suffix removed, in any letter case.
DocumentFormat document_format_for(const std::string& path);

// Throws Error(ErrorKind::Data) naming the first input that is not a readable file, or that
// is named *.gz but is not gzip.
void check_inputs_readable(const std::vector<std::string>& inputs);

class DocumentReader {
 public:
  // Throws Error(ErrorKind::Data) naming PATH if it cannot be opened.
  explicit DocumentReader(const std::string& path);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // Reads the next non-empty document into TEXT; false at the end of the file. A JSON Lines
  // line that is not an object with a string "text" is an Error(ErrorKind::Data) naming
  // file:line.
  bool next(std::string& text);

  // How far into the file on disk (compressed bytes for .gz) reading has got; for ETAs.
  int64_t bytes_consumed() const;
  const std::string& path() const { return path_; }
  // Lines that held invalid UTF-8 so far, and the number of the first (0 = none).
  int64_t invalid_utf8_lines() const { return invalid_utf8_lines_; }
  int64_t first_invalid_utf8_line() const { return first_invalid_utf8_line_; }

 private:
  bool read_line(std::string& line);
  bool fill_chunk();
  void count_invalid_line();
  bool next_json_document(std::string& text);
  bool next_text_document(std::string& text);

  std::string path_;
  DocumentFormat format_;
  gzFile_s* file_ = nullptr;
  int64_t line_number_ = 0;
  int64_t invalid_utf8_lines_ = 0;
  int64_t first_invalid_utf8_line_ = 0;
  std::vector<char> chunk_;  // bytes read from the file; [chunk_begin_, chunk_end_) not yet used
  size_t chunk_begin_ = 0;
  size_t chunk_end_ = 0;
};

}  // namespace gnmr
