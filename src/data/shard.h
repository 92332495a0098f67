// Token shards: the on-disk format `gnmr prepare` writes and the loader reads (docs/DESIGN.md §5).
//
// Layout, all little-endian:
//   offset  0  char[8]  magic "GNMRTOK\0"
//   offset  8  uint32   version (1)
//   offset 12  uint32   dtype (1 = uint16 tokens, 2 = uint32 tokens)
//   offset 16  uint64   token_count
//   offset 24  uint32   vocab_size
//   offset 28  zeros up to the 64-byte header
//   offset 64  token_count tokens of the dtype's width
// uint16 is used whenever vocab_size <= 65536, so a LLaMA-2 (32000) shard costs 2 bytes/token.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace gnmr {

constexpr char kShardMagic[8] = {'G', 'N', 'M', 'R', 'T', 'O', 'K', '\0'};
constexpr uint32_t kShardVersion = 1;
constexpr size_t kShardHeaderBytes = 64;

enum class ShardDtype : uint32_t { UInt16 = 1, UInt32 = 2 };

// The narrowest dtype that holds every token id below vocab_size.
ShardDtype shard_dtype_for_vocab(int vocab_size);
size_t shard_dtype_bytes(ShardDtype dtype);

// Streams tokens into PATH.tmp.<pid>; close() fills in the header, fsyncs and renames it to
// PATH. A writer destroyed without close() (an exception, a crash) leaves nothing under PATH.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, int vocab_size);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Every token must lie in [0, vocab_size); anything else is an internal error.
  void append(const int32_t* tokens, size_t count);
  void append(const std::vector<int32_t>& tokens) { append(tokens.data(), tokens.size()); }
  void close();

  int64_t token_count() const { return token_count_; }
  const std::string& path() const { return path_; }

 private:
  void flush_buffer();

  std::string path_;
  std::string tmp_path_;
  int vocab_size_;
  ShardDtype dtype_;
  std::FILE* file_ = nullptr;
  std::vector<unsigned char> buffer_;
  int64_t token_count_ = 0;
};

// Writes a whole shard at once (same crash-safety as ShardWriter).
void write_shard_atomic(const std::string& path, const std::vector<int32_t>& tokens,
                        int vocab_size);

// A read-only, memory-mapped shard. Opening validates the header, the file size and (one
// fast pass) that every token is below the header's vocab size; any failure is an
// Error(ErrorKind::Data) naming the file.
class ShardReader {
 public:
  explicit ShardReader(const std::string& path);
  ~ShardReader();
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t token_count() const { return token_count_; }
  int vocab_size() const { return vocab_size_; }
  ShardDtype dtype() const { return dtype_; }

  int32_t token(int64_t index) const;
  // out[0..count) = tokens[begin..begin+count); the range must lie inside the shard.
  void copy_tokens(int64_t begin, int64_t count, int32_t* out) const;

 private:
  void release();

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  int64_t token_count_ = 0;
  int vocab_size_ = 0;
  ShardDtype dtype_ = ShardDtype::UInt16;
};

}  // namespace gnmr
