// Helpers shared by the data tests: asserting on gnmr::Error, writing gzip files.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <string>

#include "expect_error.h"
#include "util/error.h"

namespace gnmr_test {

inline void expect_data_error(const std::function<void()>& f,
                              std::initializer_list<std::string> parts) {
  expect_error(f, gnmr::ErrorKind::Data, parts);
}

inline void write_gzip(const std::string& path, const std::string& content) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(gzwrite(file, content.data(), static_cast<unsigned>(content.size())),
            static_cast<int>(content.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

inline void write_text(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace gnmr_test
