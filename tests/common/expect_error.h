// expect_error.h: "this call throws a ringtrain::Error whose message says all of these",
// the check every misuse test makes.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tensor/checks.h"

namespace ringtrain::testing {

// Expects `f` to throw an Error whose message contains every string in `parts`.
template <typename F>
void expect_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an exception mentioning " << parts.at(0);
  } catch (const Error& e) {
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace ringtrain::testing
