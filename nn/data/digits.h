// digits.h: the 8x8 handwritten digits data set (UCI "optdigits" test part, as
// shipped by scikit-learn and by Debian's python3-sklearn).
//
// defines: kDigitsDefaultPath, load_digits().
//
// The file is gzip-compressed CSV without a header: 1797 lines, each 64 pixel
// intensities in 0..16 (an 8x8 image, row-major) followed by the label 0..9.
// load_digits() checks every line (field count, integer values, ranges) and
// names the file and line of the first problem.
#pragma once

#include <string>

#include "nn/data/dataset.h"
#include "nn/data/file_reader.h"

namespace ringtrain::data {

inline constexpr const char* kDigitsDefaultPath =
    "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
inline constexpr int64_t kDigitsSamples = 1797;

struct DigitsOptions {
  std::string path = kDigitsDefaultPath;
  bool normalize = true;  // pixels / 16 -> [0, 1] (otherwise the raw 0..16 values as float)
  bool as_images = false; // inputs [N, 1, 8, 8] for a CNN instead of [N, 64]
};

// All 1797 examples: inputs float32 [N, 64] (or [N, 1, 8, 8]), targets int64 [N].
// Split them with train_test_split(dataset, fraction, seed).
TensorDataset load_digits(const DigitsOptions& options = {});

}  // namespace ringtrain::data
