// bench_cli.h: command-line pieces shared by the benchmark programs in bench/.
//
// defines: parse_byte_size (a strict byte count: "4096", "64K", "1MiB"),
//          ByteSize (the CLI11 transform that applies it to an option),
//          add_byte_size_option (an option bound to a byte count, its default
//          shown the way it is typed), check_writable (an output path fails before
//          the run, not after it), write_text_file (a write that reports failure),
//          check_fits_in_memory (a size that cannot fit is an error, not an OOM kill),
//          median (of an even count, the mean of the two middle samples).
//
// Errors come back as strings (empty: fine) for main() to print and turn into an
// exit code; nothing here exits.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ringtrain::bench {

// What parse_byte_size accepts, for help texts and error messages.
inline constexpr const char* kByteSizeForms =
    "digits with an optional K, M or G (or KiB, MiB, GiB; any case; powers of 1024), e.g. 4096, 64K, 1M";

// Parses a byte count in kByteSizeForms: decimal digits, then nothing or one of the
// units, nothing else (no sign, no fraction, no spaces). On failure returns nullopt
// and sets *error to why (without the option's name, which the caller adds).
inline std::optional<uint64_t> parse_byte_size(std::string_view text, std::string* error) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  std::string unit;
  for (char c : text.substr(digits)) unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  int shift = -1;
  if (unit.empty()) {
    shift = 0;
  } else if (unit == "k" || unit == "kib") {
    shift = 10;
  } else if (unit == "m" || unit == "mib") {
    shift = 20;
  } else if (unit == "g" || unit == "gib") {
    shift = 30;
  }
  if (digits == 0 || shift < 0) {
    *error = "'" + std::string(text) + "' is not a byte count; expected " + kByteSizeForms;
    return std::nullopt;
  }
  uint64_t value = 0;
  bool overflow = false;
  for (size_t i = 0; i < digits; ++i) {
    overflow |= __builtin_mul_overflow(value, uint64_t{10}, &value);
    overflow |= __builtin_add_overflow(value, static_cast<uint64_t>(text[i] - '0'), &value);
  }
  if (overflow || value > (UINT64_MAX >> shift)) {
    *error = "'" + std::string(text) + "' is too large: more than 2^64 - 1 bytes";
    return std::nullopt;
  }
  return value << shift;
}

// The shortest way to type `bytes` in kByteSizeForms: "256M", "1536K", "1000".
inline std::string format_byte_size(uint64_t bytes) {
  if (bytes == 0) return "0";
  for (auto [shift, unit] : {std::pair{30, "G"}, std::pair{20, "M"}, std::pair{10, "K"}}) {
    if (bytes % (uint64_t{1} << shift) == 0) return std::to_string(bytes >> shift) + unit;
  }
  return std::to_string(bytes);
}

// A CLI11 transform: the option's text becomes its byte count in digits, or the
// parse fails with parse_byte_size's message (CLI11 prefixes the option's name).
// With bounds, a count outside [min, max] fails too, the bounds said as typed.
class ByteSize : public CLI::Validator {
 public:
  explicit ByteSize(uint64_t min = 0, uint64_t max = UINT64_MAX) {
    const bool bounded_above = max < UINT64_MAX;
    const std::string range = "[" + format_byte_size(min) + " - " + format_byte_size(max) + "]";
    name("SIZE");
    if (bounded_above) description("SIZE in " + range);
    func_ = [min, max, bounded_above, range](std::string& text) {
      std::string error;
      std::optional<uint64_t> bytes = parse_byte_size(text, &error);
      if (!bytes) return error;
      if (*bytes < min || *bytes > max) {
        return "'" + text + "' is " + (bounded_above ? "not in " + range : "less than " + format_byte_size(min));
      }
      text = std::to_string(*bytes);
      return std::string();
    };
  }
};

// An option bound to a byte count in [min, max]; --help shows its current value as
// the default, in the form it is typed.
inline CLI::Option* add_byte_size_option(CLI::App& app, const std::string& name, uint64_t& bytes,
                                         const std::string& description, uint64_t min = 0,
                                         uint64_t max = UINT64_MAX) {
  return app.add_option(name, bytes, description + "; SIZE: " + kByteSizeForms)
      ->type_name("SIZE")
      ->transform(ByteSize(min, max))
      ->default_str(format_byte_size(bytes));
}

// Empty when `path` (the value of `option`) can be written, else why. An existing
// file is opened for appending and left as it was; a new one is created and removed.
inline std::string check_writable(const std::string& option, const std::string& path) {
  struct stat info {};
  const bool existed = ::stat(path.c_str(), &info) == 0;
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) return "cannot write " + option + " " + path + ": " + std::strerror(errno);
  std::fclose(file);
  if (!existed) ::unlink(path.c_str());
  return {};
}

// Writes `text` to `path`; empty on success, else why (the path and strerror).
inline std::string write_text_file(const std::string& option, const std::string& path, const std::string& text) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return "cannot write " + option + " " + path + ": " + std::strerror(errno);
  int error = 0;
  if (std::fwrite(text.data(), 1, text.size(), file) != text.size()) error = errno;
  if (std::fclose(file) != 0 && error == 0) error = errno;  // a full disk shows here
  if (error != 0) return "cannot write " + option + " " + path + ": " + std::strerror(error);
  return {};
}

// This machine's physical memory in bytes (0 when the system does not say).
inline double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

// Empty when `bytes` (a lower bound of what `what` allocates; a double, so that
// products of large arguments cannot wrap) fits in physical memory, else an error
// naming both sizes.
inline std::string check_fits_in_memory(double bytes, const std::string& what) {
  const double memory = physical_memory_bytes();
  if (memory <= 0 || bytes <= memory) return {};
  auto gib = [](double b) {
    char text[64];
    std::snprintf(text, sizeof(text), b < 1e6 * (1 << 30) ? "%.1f" : "%.3g", b / (1 << 30));
    return std::string(text);
  };
  return what + " needs at least " + gib(bytes) + " GiB, more than this machine's " + gib(memory) +
         " GiB of memory";
}

// The median every benchmark quotes; of an even count, the mean of the two middle
// samples (v[n / 2] alone would be the upper one).
inline double median(std::vector<double> values) {
  if (values.empty()) throw std::logic_error("median of no samples");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace ringtrain::bench
