#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "util/atomic_file.h"
#include "util/error.h"

// Tokens are stored by copying host integers; the format is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "gnmr shards assume a little-endian host");

namespace gnmr {

namespace {

constexpr size_t kWriteBufferBytes = 1 << 20;

Error shard_error(const std::string& path, const std::string& what) {
  return Error(ErrorKind::Data, "shard " + path + ": " + what);
}

void put_u32(unsigned char* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}
void put_u64(unsigned char* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::vector<unsigned char> encode_header(ShardDtype dtype, uint64_t token_count, int vocab_size) {
  std::vector<unsigned char> header(kShardHeaderBytes, 0);
  std::memcpy(header.data(), kShardMagic, sizeof(kShardMagic));
  put_u32(header.data() + 8, kShardVersion);
  put_u32(header.data() + 12, static_cast<uint32_t>(dtype));
  put_u64(header.data() + 16, token_count);
  put_u32(header.data() + 24, static_cast<uint32_t>(vocab_size));
  return header;
}

// Largest token in a run of tokens; a branch-free loop the compiler vectorizes, so the
// open-time check costs one pass at memory bandwidth.
template <typename T>
T max_token(const T* tokens, int64_t count) {
  T largest = 0;
  for (int64_t i = 0; i < count; ++i) largest = std::max(largest, tokens[i]);
  return largest;
}

template <typename T>
int64_t first_token_at_least(const T* tokens, int64_t count, uint64_t limit) {
  for (int64_t i = 0; i < count; ++i) {
    if (tokens[i] >= limit) return i;
  }
  return -1;
}

}  // namespace

ShardDtype shard_dtype_for_vocab(int vocab_size) {
  return vocab_size <= 65536 ? ShardDtype::UInt16 : ShardDtype::UInt32;
}

size_t shard_dtype_bytes(ShardDtype dtype) {
  return dtype == ShardDtype::UInt16 ? 2 : 4;
}

// ---------------------------------------------------------------------------------------------
// ShardWriter

ShardWriter::ShardWriter(const std::string& path, int vocab_size)
    : path_(path),
      tmp_path_(path + ".tmp." + std::to_string(::getpid())),
      vocab_size_(vocab_size),
      dtype_(shard_dtype_for_vocab(vocab_size)) {
  GNMR_CHECK(vocab_size > 0, "a shard needs a positive vocab size");
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  if (file_ == nullptr) {
    throw Error(ErrorKind::Runtime, "create " + tmp_path_ + ": " + std::strerror(errno));
  }
  // A placeholder header; close() rewrites it once the token count is known.
  auto header = encode_header(dtype_, 0, vocab_size_);
  buffer_.reserve(kWriteBufferBytes);
  buffer_.insert(buffer_.end(), header.begin(), header.end());
}

ShardWriter::~ShardWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(tmp_path_.c_str());
  }
}

void ShardWriter::flush_buffer() {
  if (buffer_.empty()) return;
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    throw Error(ErrorKind::Runtime, "write " + tmp_path_ + ": " + std::strerror(errno));
  }
  buffer_.clear();
}

void ShardWriter::append(const int32_t* tokens, size_t count) {
  GNMR_CHECK(file_ != nullptr, "append to a closed shard " + path_);
  const size_t width = shard_dtype_bytes(dtype_);
  for (size_t i = 0; i < count; ++i) {
    const int32_t token = tokens[i];
    GNMR_CHECK(token >= 0 && token < vocab_size_,
               "token " + std::to_string(token) + " outside vocab of " + path_);
    if (buffer_.size() + width > kWriteBufferBytes) flush_buffer();
    unsigned char bytes[4];
    if (dtype_ == ShardDtype::UInt16) {
      const uint16_t narrow = static_cast<uint16_t>(token);
      std::memcpy(bytes, &narrow, 2);
    } else {
      const uint32_t wide = static_cast<uint32_t>(token);
      std::memcpy(bytes, &wide, 4);
    }
    buffer_.insert(buffer_.end(), bytes, bytes + width);
  }
  token_count_ += static_cast<int64_t>(count);
}

void ShardWriter::close() {
  GNMR_CHECK(file_ != nullptr, "close of a closed shard " + path_);
  flush_buffer();
  auto header = encode_header(dtype_, static_cast<uint64_t>(token_count_), vocab_size_);
  bool ok = std::fseek(file_, 0, SEEK_SET) == 0 &&
            std::fwrite(header.data(), 1, header.size(), file_) == header.size() &&
            std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const std::string why = ok ? "" : std::strerror(errno);
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  if (!ok) {
    std::remove(tmp_path_.c_str());
    throw Error(ErrorKind::Runtime, "write " + tmp_path_ + ": " + why);
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const std::string rename_why = std::strerror(errno);
    std::remove(tmp_path_.c_str());
    throw Error(ErrorKind::Runtime, "rename " + tmp_path_ + " -> " + path_ + ": " + rename_why);
  }
  const auto parent = std::filesystem::path(path_).parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

void write_shard_atomic(const std::string& path, const std::vector<int32_t>& tokens,
                        int vocab_size) {
  ShardWriter writer(path, vocab_size);
  writer.append(tokens);
  writer.close();
}

// ---------------------------------------------------------------------------------------------
// ShardReader

ShardReader::ShardReader(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw shard_error(path, std::string("cannot open (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw shard_error(path, std::string("cannot stat (") + std::strerror(errno) + ")");
  }
  const size_t file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    throw shard_error(path, "truncated (file holds " + std::to_string(file_bytes) +
                                " bytes, less than the 64-byte header)");
  }
  mapping_ = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw shard_error(path, std::string("cannot mmap (") + std::strerror(errno) + ")");
  }
  mapping_bytes_ = file_bytes;

  try {
    const auto* header = static_cast<const unsigned char*>(mapping_);
    if (std::memcmp(header, kShardMagic, sizeof(kShardMagic)) != 0) {
      throw shard_error(path,
                        "bad magic (not a gnmr token shard; write shards with `gnmr prepare`)");
    }
    const uint32_t version = get_u32(header + 8);
    if (version != kShardVersion) {
      throw shard_error(path, "format version " + std::to_string(version) +
                                  " is not supported (this build reads version " +
                                  std::to_string(kShardVersion) + ")");
    }
    const uint32_t dtype = get_u32(header + 12);
    if (dtype != static_cast<uint32_t>(ShardDtype::UInt16) &&
        dtype != static_cast<uint32_t>(ShardDtype::UInt32)) {
      throw shard_error(path,
                        "unknown dtype " + std::to_string(dtype) + " (1 = uint16, 2 = uint32)");
    }
    dtype_ = static_cast<ShardDtype>(dtype);
    const uint64_t header_vocab = get_u32(header + 24);
    if (header_vocab == 0 || header_vocab > static_cast<uint64_t>(INT32_MAX)) {
      throw shard_error(path, "invalid vocab size " + std::to_string(header_vocab) + " in header");
    }
    vocab_size_ = static_cast<int>(header_vocab);
    const uint64_t header_tokens = get_u64(header + 16);
    const size_t width = shard_dtype_bytes(dtype_);
    const uint64_t held_tokens = (file_bytes - kShardHeaderBytes) / width;
    if (header_tokens > held_tokens) {
      throw shard_error(path, "truncated (header says " + std::to_string(header_tokens) +
                                  " tokens, file holds " + std::to_string(held_tokens) + ")");
    }
    if (file_bytes != kShardHeaderBytes + header_tokens * width) {
      throw shard_error(path, "size mismatch (header says " + std::to_string(header_tokens) +
                                  " tokens, file holds " + std::to_string(file_bytes) +
                                  " bytes; expected " +
                                  std::to_string(kShardHeaderBytes + header_tokens * width) + ")");
    }
    token_count_ = static_cast<int64_t>(header_tokens);
    tokens_ = header + kShardHeaderBytes;

    int64_t bad_index = -1;
    if (dtype_ == ShardDtype::UInt16) {
      const auto* t = reinterpret_cast<const uint16_t*>(tokens_);
      if (max_token(t, token_count_) >= header_vocab) {
        bad_index = first_token_at_least(t, token_count_, header_vocab);
      }
    } else {
      const auto* t = reinterpret_cast<const uint32_t*>(tokens_);
      if (max_token(t, token_count_) >= header_vocab) {
        bad_index = first_token_at_least(t, token_count_, header_vocab);
      }
    }
    if (bad_index >= 0) {
      throw shard_error(path, "token " + std::to_string(token(bad_index)) + " at index " +
                                  std::to_string(bad_index) + " is not below the vocab size " +
                                  std::to_string(vocab_size_) + " (corrupt shard?)");
    }
  } catch (...) {
    release();
    throw;
  }
}

ShardReader::~ShardReader() {
  release();
}

void ShardReader::release() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
  mapping_ = nullptr;
  mapping_bytes_ = 0;
  tokens_ = nullptr;
}

ShardReader::ShardReader(ShardReader&& other) noexcept {
  *this = std::move(other);
}

ShardReader& ShardReader::operator=(ShardReader&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    mapping_ = other.mapping_;
    mapping_bytes_ = other.mapping_bytes_;
    tokens_ = other.tokens_;
    token_count_ = other.token_count_;
    vocab_size_ = other.vocab_size_;
    dtype_ = other.dtype_;
    other.mapping_ = nullptr;
    other.mapping_bytes_ = 0;
    other.tokens_ = nullptr;
  }
  return *this;
}

int32_t ShardReader::token(int64_t index) const {
  GNMR_CHECK(index >= 0 && index < token_count_, "token index outside shard " + path_);
  if (dtype_ == ShardDtype::UInt16) {
    return reinterpret_cast<const uint16_t*>(tokens_)[index];
  }
  return static_cast<int32_t>(reinterpret_cast<const uint32_t*>(tokens_)[index]);
}

void ShardReader::copy_tokens(int64_t begin, int64_t count, int32_t* out) const {
  GNMR_CHECK(begin >= 0 && count >= 0 && begin + count <= token_count_,
             "token range outside shard " + path_);
  if (dtype_ == ShardDtype::UInt16) {
    const auto* t = reinterpret_cast<const uint16_t*>(tokens_) + begin;
    for (int64_t i = 0; i < count; ++i) out[i] = t[i];
  } else {
    const auto* t = reinterpret_cast<const uint32_t*>(tokens_) + begin;
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(t[i]);
  }
}

}  // namespace gnmr
