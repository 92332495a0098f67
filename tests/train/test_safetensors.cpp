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
