// Token shard format: round trips in both dtypes, and every corruption is a Data error
// that names the file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "data/shard.h"
#include "data_test_helpers.h"
#include "test_paths.h"

using gnmr::ShardReader;
using gnmr_test::expect_data_error;

namespace {

std::vector<int32_t> counting_tokens(int64_t count, int vocab_size) {
  std::vector<int32_t> tokens(count);
  for (int64_t i = 0; i < count; ++i) tokens[i] = static_cast<int32_t>((i * 7919) % vocab_size);
  return tokens;
}

void overwrite_u16_at(const std::string& path, int64_t token_index, uint16_t value) {
  std::string bytes = gnmr_test::read_bytes(path);
  std::memcpy(&bytes[gnmr::kShardHeaderBytes + 2 * token_index], &value, 2);
  gnmr_test::write_text(path, bytes);
}

}  // namespace

TEST(Shard, RoundTripsUint16TokensWithA64ByteHeader) {
  const std::string dir = gnmr_test::scratch_dir("shard_u16");
  const std::string path = dir + "/a.bin";
  const auto tokens = counting_tokens(1000, 4096);
  gnmr::write_shard_atomic(path, tokens, 4096);

  EXPECT_EQ(std::filesystem::file_size(path), 64u + 2 * 1000);
  const std::string bytes = gnmr_test::read_bytes(path);
  EXPECT_EQ(std::memcmp(bytes.data(), "GNMRTOK\0", 8), 0);
  ShardReader reader(path);
  EXPECT_EQ(reader.token_count(), 1000);
  EXPECT_EQ(reader.vocab_size(), 4096);
  EXPECT_EQ(reader.dtype(), gnmr::ShardDtype::UInt16);
  std::vector<int32_t> back(1000);
  reader.copy_tokens(0, 1000, back.data());
  EXPECT_EQ(back, tokens);
  EXPECT_EQ(reader.token(999), tokens[999]);
}

TEST(Shard, UsesUint32TokensAboveVocab65536) {
  const std::string path = gnmr_test::scratch_dir("shard_u32") + "/big.bin";
  const auto tokens = counting_tokens(500, 100000);
  gnmr::write_shard_atomic(path, tokens, 100000);
  EXPECT_EQ(std::filesystem::file_size(path), 64u + 4 * 500);
  ShardReader reader(path);
  EXPECT_EQ(reader.dtype(), gnmr::ShardDtype::UInt32);
  std::vector<int32_t> back(500);
  reader.copy_tokens(0, 500, back.data());
  EXPECT_EQ(back, tokens);
}

TEST(Shard, Vocab65536StillFitsUint16) {
  EXPECT_EQ(gnmr::shard_dtype_for_vocab(65536), gnmr::ShardDtype::UInt16);
  EXPECT_EQ(gnmr::shard_dtype_for_vocab(65537), gnmr::ShardDtype::UInt32);
}

TEST(Shard, WriterLeavesNothingUnderTheFinalNameUntilClosed) {
  const std::string dir = gnmr_test::scratch_dir("shard_unclosed");
  const std::string path = dir + "/s.bin";
  {
    gnmr::ShardWriter writer(path, 100);
    writer.append(counting_tokens(10, 100));
    EXPECT_FALSE(std::filesystem::exists(path));
  }  // destroyed without close(): an aborted run
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the temporary file was not removed";
}

TEST(Shard, BadMagicIsADataErrorNamingTheFile) {
  const std::string path = gnmr_test::scratch_dir("shard_magic") + "/x.bin";
  gnmr::write_shard_atomic(path, counting_tokens(100, 512), 512);
  std::string bytes = gnmr_test::read_bytes(path);
  bytes[0] = 'X';
  gnmr_test::write_text(path, bytes);
  expect_data_error([&] { ShardReader reader(path); }, {path, "bad magic"});
}

TEST(Shard, TruncatedFileIsADataErrorWithBothCounts) {
  const std::string path = gnmr_test::scratch_dir("shard_truncated") + "/x.bin";
  gnmr::write_shard_atomic(path, counting_tokens(1000, 512), 512);
  std::filesystem::resize_file(path, 64 + 2 * 900);
  expect_data_error([&] { ShardReader reader(path); },
                    {"shard " + path, "truncated", "header says 1000 tokens", "file holds 900"});
}

TEST(Shard, FileShorterThanTheHeaderIsTruncated) {
  const std::string path = gnmr_test::scratch_dir("shard_tiny") + "/x.bin";
  gnmr_test::write_text(path, "GNMRTOK");
  expect_data_error([&] { ShardReader reader(path); }, {path, "truncated"});
}

TEST(Shard, TokenAtOrAboveVocabIsADataErrorNamingTheIndex) {
  const std::string path = gnmr_test::scratch_dir("shard_vocab") + "/x.bin";
  gnmr::write_shard_atomic(path, counting_tokens(100, 512), 512);
  overwrite_u16_at(path, 42, 512);
  expect_data_error([&] { ShardReader reader(path); }, {path, "token 512", "index 42", "512"});
}

TEST(Shard, MissingFileIsADataErrorNamingIt) {
  const std::string path = gnmr_test::scratch_dir("shard_missing") + "/nope.bin";
  expect_data_error([&] { ShardReader reader(path); }, {path});
}
