// example_cli.h: command-line checks the example programs share (CLI11 validators).
//
// defines: positive_real.
#pragma once

#include <cmath>
#include <string>

#include <CLI/CLI.hpp>

namespace ringtrain::examples {

// A real-valued flag that must be finite and > 0 (or >= 0), said in words:
// CLI::PositiveNumber and CLI::NonNegativeNumber print their range with DBL_MAX
// written out in full (309 digits).
inline CLI::Validator positive_real(bool zero_allowed = false) {
  return CLI::Validator(
      [zero_allowed](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "'" + text + "' is not a number";
        if (std::isfinite(value) && (value > 0 || (zero_allowed && value == 0))) return {};
        return std::string("must be ") + (zero_allowed ? ">= 0" : "> 0") + ", got " + text;
      },
      zero_allowed ? "REAL >= 0" : "REAL > 0");
}

}  // namespace ringtrain::examples
