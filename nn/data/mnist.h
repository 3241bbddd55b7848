// mnist.h: the IDX file format of MNIST and Fashion-MNIST, and loaders for both.
//
// defines: read_idx(), write_idx_u8(), load_mnist(), MnistSplit.
//
// IDX (LeCun's format): a 4-byte magic number {0, 0, type, ndim}, then ndim
// big-endian uint32 dimension sizes, then the values, big-endian, row-major.
// Types: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32,
// 0x0E float64. MNIST images are 0x00000803 (uint8, [N, 28, 28]) and labels
// 0x00000801 (uint8, [N]); Fashion-MNIST uses the same files and names.
//
// Files may be gzip-compressed or not (train-images-idx3-ubyte or
// train-images-idx3-ubyte.gz both work). Every malformed input — missing file,
// bad magic, a size that does not match the header, labels out of range, image
// and label counts that disagree — throws FileFormatError naming the file and
// the problem.
#pragma once

#include <cstdint>
#include <string>

#include "nn/data/dataset.h"
#include "nn/data/file_reader.h"
#include "tensor/tensor.h"

namespace ringtrain::data {

// Reads an IDX file into a CPU tensor of `dtype` (values converted, then multiplied by `scale`).
// Into an integer dtype, a value that is not a whole number in its range after scaling (a
// float payload's 3.7, NaN, inf, 1e20) is a FileFormatError naming the file and element.
Tensor read_idx(const std::string& path, DType dtype = DType::kFloat32, double scale = 1.0);

// Writes `values` (row-major, shape `dims`) as an uncompressed uint8 IDX file. Used by tests
// and by users who convert their own data; values must be in [0, 255].
void write_idx_u8(const std::string& path, const std::vector<uint8_t>& values,
                  const std::vector<uint32_t>& dims);

enum class MnistSplit { kTrain, kTest };

// The MNIST (or Fashion-MNIST) split in `directory`: inputs float32 [N, 1, 28, 28] scaled to
// [0, 1], targets int64 [N] in 0..9. Looks for the standard file names
// ({train,t10k}-{images-idx3,labels-idx1}-ubyte), plain or with ".gz".
TensorDataset load_mnist(const std::string& directory, MnistSplit split);

}  // namespace ringtrain::data
