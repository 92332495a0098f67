// safetensors writer/reader: round trip, dtype conversion, and every corruption a clear error.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "expect_error.h"
#include "precision/bf16.h"
#include "test_paths.h"
#include "train/safetensors.h"
#include "util/error.h"

using gnmr::SafetensorsFile;
using gnmr::SafetensorsTensor;

namespace {

std::string write_sample(const std::string& dir, std::vector<float>& a, std::vector<uint16_t>& b) {
  a = {1.5f, -2.25f, 3.0f, 1e-30f, -0.0f, 7.0f};
  b = {gnmr::encode_bf16(0.5f), gnmr::encode_bf16(-3.0f)};
  std::string path = dir + "/sample.safetensors";
  gnmr::write_safetensors(path,
                          {{"a.weight", "F32", {2, 3}, a.data()}, {"b", "BF16", {2}, b.data()}},
                          {{"format", "pt"}});
  return path;
}

void expect_checkpoint_error(const std::function<void()>& f, const std::string& needle) {
  gnmr_test::expect_error(f, gnmr::ErrorKind::Checkpoint, {needle});
}

}  // namespace

TEST(Safetensors, RoundTripsValuesBitExactlyAndConvertsBf16) {
  std::string dir = gnmr_test::scratch_dir("safetensors_round_trip");
  std::vector<float> a;
  std::vector<uint16_t> b;
  SafetensorsFile f(write_sample(dir, a, b));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  std::vector<float> out(6);
  f.read_f32("a.weight", {2, 3}, out.data());
  EXPECT_EQ(std::memcmp(out.data(), a.data(), 6 * sizeof(float)), 0);
  std::vector<float> out_b(2);
  f.read_f32("b", {2}, out_b.data());
  EXPECT_EQ(out_b[0], 0.5f);
  EXPECT_EQ(out_b[1], -3.0f);
  // The header is 8-byte aligned, as the format recommends.
  std::ifstream in(dir + "/sample.safetensors", std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);
}

TEST(Safetensors, CorruptionAndMismatchesAreCheckpointErrors) {
  std::string dir = gnmr_test::scratch_dir("safetensors_corrupt");
  std::vector<float> a;
  std::vector<uint16_t> b;
  std::string path = write_sample(dir, a, b);
  SafetensorsFile f(path);
  std::vector<float> out(6);
  expect_checkpoint_error(
      [&] {
        f.read_f32("a.weight", {3, 2}, out.data());
      },
      "has shape [2, 3], the model expects [3, 2]");
  expect_checkpoint_error([&] { f.read_f32("missing", {1}, out.data()); },
                          "missing tensor \"missing\"");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  expect_checkpoint_error([&] { SafetensorsFile truncated(path); }, "truncated");
  std::filesystem::resize_file(path, 4);
  expect_checkpoint_error([&] { SafetensorsFile tiny(path); }, "truncated");
  expect_checkpoint_error([&] { SafetensorsFile absent(dir + "/nope.safetensors"); },
                          "nope.safetensors");
}

namespace {

// A safetensors file: the u64 header length, HEADER, then DATA.
std::string write_raw(const std::string& dir, const std::string& header, const std::string& data) {
  std::string path = dir + "/raw.safetensors";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t header_len = header.size();
  out.write(reinterpret_cast<const char*>(&header_len), 8);
  out << header << data;
  return path;
}

void expect_open_error(const std::string& dir, const std::string& header, const std::string& data,
                       const std::string& needle) {
  const std::string path = write_raw(dir, header, data);
  expect_checkpoint_error([&] { SafetensorsFile f(path); }, needle);
}

}  // namespace

// Found by fuzz_safetensors: a non-object "__metadata__" escaped as a json::invalid_iterator.
TEST(Safetensors, NonObjectMetadataIsACheckpointError) {
  std::string dir = gnmr_test::scratch_dir("safetensors_metadata");
  expect_open_error(dir, R"({"__metadata__":"x"})", "", "\"__metadata__\" must be an object");
}

// Found by fuzz_safetensors: shapes whose element count overflowed int64 (UB), wrapped to
// match the offsets (a 2^62-element F32 tensor in 0 bytes) or was negative were accepted,
// and a reader then allocated from the shape.
TEST(Safetensors, ShapesThatDoNotFitTheDataAreCheckpointErrors) {
  std::string dir = gnmr_test::scratch_dir("safetensors_shapes");
  expect_open_error(dir,
                    R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                    "", "tensor \"a\" has shape [4294967296, 4294967296], which does not fit");
  expect_open_error(dir,
                    R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})",
                    "", "does not fit");
  expect_open_error(dir, R"({"a":{"dtype":"F32","shape":[-1,-1],"data_offsets":[0,4]}})",
                    std::string(4, '\0'), "has shape [-1, -1], which does not fit");
}

// Found by fuzz_safetensors: a dimension past 2^64 (which the JSON parser holds as a double)
// was converted to int64, which is undefined behaviour; a fraction was truncated and accepted.
// Shape dimensions and offsets must be integers in int64, the offsets a pair of them >= 0.
TEST(Safetensors, ShapesAndOffsetsThatAreNotIntegersAreCheckpointErrors) {
  std::string dir = gnmr_test::scratch_dir("safetensors_integers");
  const std::string four_bytes(4, '\0');
  for (const std::string shape : {"[29111686018427387903]", "[9223372036854775808]", "[1.0]",
                                  "[1e0]", "[\"1\"]", "[null]", "1"}) {
    SCOPED_TRACE(shape);
    expect_open_error(dir, R"({"a":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,4]}})",
                      four_bytes, "tensor \"a\" has a malformed header entry");
  }
  for (const std::string offsets : {"[0.0,4]", "[-4,0]", "[0,4.5]", "[0,4,8]", "[0]", "{}"}) {
    SCOPED_TRACE(offsets);
    expect_open_error(dir, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":)" + offsets + "}}",
                      four_bytes, "tensor \"a\" has a malformed header entry");
  }
  // The same entry with integers opens.
  const std::string path =
      write_raw(dir, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four_bytes);
  EXPECT_EQ(SafetensorsFile(path).shape("a"), std::vector<int64_t>{1});
}

// Found by fuzz_safetensors: a dtype gnmr does not convert skipped every size check, so its
// shape could claim any number of elements.
TEST(Safetensors, UnknownDtypeIsACheckpointErrorAndSpecDtypesAreSizeChecked) {
  std::string dir = gnmr_test::scratch_dir("safetensors_dtypes");
  expect_open_error(dir, R"({"a":{"dtype":"Q4","shape":[1000000000000],"data_offsets":[0,0]}})", "",
                    "has dtype \"Q4\", which is not a safetensors dtype");
  expect_open_error(dir, R"({"a":{"dtype":"I8","shape":[1000000000000],"data_offsets":[0,0]}})", "",
                    "does not fit");
  expect_open_error(dir, R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})",
                    std::string(16, '\0'), "size does not match its shape [2]");
  // A spec dtype gnmr does not convert still opens; reading it as fp32 names the dtype.
  const std::string path = write_raw(
      dir, R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", std::string(16, '\0'));
  SafetensorsFile f(path);
  std::vector<float> out(2);
  expect_checkpoint_error([&] { f.read_f32("a", {2}, out.data()); }, "has dtype I64");
}
