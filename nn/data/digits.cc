// digits.cc: a strict parser for digits.csv(.gz).
#include "nn/data/digits.h"

#include <charconv>
#include <cmath>
#include <vector>

namespace ringtrain::data {

TensorDataset load_digits(const DigitsOptions& options) {
  const std::string& path = options.path;
  std::string text;
  try {
    text = read_file_maybe_gzip(path);
  } catch (const FileFormatError& e) {
    throw FileFormatError(path, std::string(e.what()).substr(path.size() + 2) +
                                    " (Debian ships this file in python3-sklearn: apt-get install python3-sklearn)");
  }
  constexpr int kFeatures = 64;
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  pixels.reserve(kDigitsSamples * kFeatures);
  labels.reserve(kDigitsSamples);

  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    auto fail = [&](const std::string& what) {
      throw FileFormatError(path, "line " + std::to_string(line_no) + ": " + what);
    };
    int field = 0;
    size_t p = 0;
    while (true) {
      size_t comma = line.find(',', p);
      std::string_view tok = line.substr(p, comma == std::string_view::npos ? std::string_view::npos : comma - p);
      // Values are written as integers, possibly with a ".0" (some copies of the file).
      double value = 0;
      auto [ptr, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), value);
      if (ec != std::errc() || ptr != tok.data() + tok.size() || tok.empty()) {
        fail("field " + std::to_string(field + 1) + " is not a number: '" + std::string(tok) + "'");
      }
      // from_chars also reads "nan" and "inf", and NaN fails every comparison: the checks
      // say what a value must be, so NaN fails them (and never reaches an integer cast).
      const bool whole = std::isfinite(value) && value == std::floor(value);
      if (field < kFeatures) {
        if (!(whole && value >= 0 && value <= 16)) {
          fail("pixel " + std::to_string(field + 1) + " = " + std::string(tok) + " is not an integer in 0..16");
        }
        pixels.push_back(static_cast<float>(options.normalize ? value / 16.0 : value));
      } else if (field == kFeatures) {
        if (!(whole && value >= 0 && value <= 9)) {
          fail("label " + std::string(tok) + " is not an integer in 0..9");
        }
        labels.push_back(static_cast<int64_t>(value));
      }
      ++field;
      if (comma == std::string_view::npos) break;
      p = comma + 1;
    }
    if (field != kFeatures + 1) {
      fail("expected " + std::to_string(kFeatures + 1) + " comma-separated fields (64 pixels + label), got " +
           std::to_string(field));
    }
  }
  const auto n = static_cast<int64_t>(labels.size());
  if (n == 0) throw FileFormatError(path, "no examples (empty file?)");
  Shape shape = options.as_images ? Shape{n, 1, 8, 8} : Shape{n, kFeatures};
  return TensorDataset(Tensor::from_vector(pixels, shape), Tensor::from_vector(labels, {n}));
}

}  // namespace ringtrain::data
