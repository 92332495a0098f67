// Asserting that a call fails with a gnmr::Error of the right kind and a message that names
// the problem (shared by every test suite).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "util/error.h"

namespace gnmr_test {

// Runs F and checks it throws gnmr::Error of KIND whose message contains every one of PARTS.
inline void expect_error(const std::function<void()>& f, gnmr::ErrorKind kind,
                         std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected a gnmr::Error, nothing was thrown";
  } catch (const gnmr::Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    for (const auto& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message \"" << e.what() << "\" does not mention \"" << part << "\"";
    }
  }
}

}  // namespace gnmr_test
