// mnist.cc: IDX parsing with every header field checked against the file size.
#include "nn/data/mnist.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>
#include <vector>

namespace ringtrain::data {
namespace {

uint32_t read_be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Element size and name of an IDX type code, or 0 for an unknown code.
size_t idx_type_size(unsigned code, const char** name) {
  switch (code) {
    case 0x08: *name = "uint8"; return 1;
    case 0x09: *name = "int8"; return 1;
    case 0x0B: *name = "int16"; return 2;
    case 0x0C: *name = "int32"; return 4;
    case 0x0D: *name = "float32"; return 4;
    case 0x0E: *name = "float64"; return 8;
    default: *name = "unknown"; return 0;
  }
}

// Decodes element i (big-endian) of an IDX payload as double.
template <typename Sink>
void decode_all(unsigned code, const unsigned char* p, size_t count, Sink&& sink) {
  switch (code) {
    case 0x08: for (size_t i = 0; i < count; ++i) sink(i, static_cast<double>(p[i])); break;
    case 0x09: for (size_t i = 0; i < count; ++i) sink(i, static_cast<double>(static_cast<int8_t>(p[i]))); break;
    case 0x0B:
      for (size_t i = 0; i < count; ++i) {
        auto v = static_cast<int16_t>((p[2 * i] << 8) | p[2 * i + 1]);
        sink(i, static_cast<double>(v));
      }
      break;
    case 0x0C:
      for (size_t i = 0; i < count; ++i) sink(i, static_cast<double>(static_cast<int32_t>(read_be32(p + 4 * i))));
      break;
    case 0x0D:
      for (size_t i = 0; i < count; ++i) sink(i, static_cast<double>(std::bit_cast<float>(read_be32(p + 4 * i))));
      break;
    case 0x0E:
      for (size_t i = 0; i < count; ++i) {
        uint64_t bits = (uint64_t{read_be32(p + 8 * i)} << 32) | read_be32(p + 8 * i + 4);
        sink(i, std::bit_cast<double>(bits));
      }
      break;
  }
}

std::string find_mnist_file(const std::string& directory, const std::string& stem) {
  namespace fs = std::filesystem;
  fs::path plain = fs::path(directory) / stem;
  fs::path gz = fs::path(directory) / (stem + ".gz");
  if (fs::exists(plain)) return plain.string();
  if (fs::exists(gz)) return gz.string();
  throw FileFormatError(plain.string(), "not found (nor " + gz.filename().string() +
                                            "); download MNIST or Fashion-MNIST into " + directory);
}

}  // namespace

Tensor read_idx(const std::string& path, DType dtype, double scale) {
  const std::string bytes = read_file_maybe_gzip(path);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 4) {
    throw FileFormatError(path, "too short for an IDX header (" + std::to_string(bytes.size()) + " bytes)");
  }
  if (p[0] != 0 || p[1] != 0) {
    std::ostringstream os;
    os << "bad IDX magic number 0x" << std::hex << read_be32(p)
       << " (the first two bytes must be zero; is this an IDX file?)";
    throw FileFormatError(path, os.str());
  }
  const unsigned code = p[2];
  const unsigned ndim = p[3];
  const char* type_name = nullptr;
  const size_t elem = idx_type_size(code, &type_name);
  if (elem == 0) {
    std::ostringstream os;
    os << "unknown IDX element type 0x" << std::hex << code << " in magic number";
    throw FileFormatError(path, os.str());
  }
  if (ndim == 0) throw FileFormatError(path, "IDX header declares 0 dimensions");
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  if (bytes.size() < header) {
    throw FileFormatError(path, "truncated header: " + std::to_string(ndim) + " dimensions need " +
                                    std::to_string(header) + " bytes, file has " +
                                    std::to_string(bytes.size()));
  }
  Shape shape;
  for (unsigned d = 0; d < ndim; ++d) shape.push_back(read_be32(p + 4 + 4 * d));
  // Checked: up to 255 dims of 2^32 could wrap the product around and "match" a short file.
  const std::optional<uint64_t> data_bytes = checked_byte_count(shape, elem);
  if (!data_bytes) {
    throw FileFormatError(path, std::string("header declares ") + type_name + shape_str(shape) +
                                    ", too large (its byte count overflows 63 bits)");
  }
  const size_t count = static_cast<size_t>(shape_numel(shape));  // fits: checked above
  const size_t expected = header + *data_bytes;
  if (bytes.size() != expected) {
    throw FileFormatError(path, std::string(bytes.size() < expected ? "truncated" : "trailing bytes") +
                                    ": header says " + type_name + shape_str(shape) + " = " +
                                    std::to_string(expected) + " bytes, file has " +
                                    std::to_string(bytes.size()));
  }
  Tensor out = Tensor::empty(shape, dtype, Device::cpu());
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* dst = out.data<T>();
    decode_all(code, p + header, count, [&](size_t i, double v) {
      const double value = v * scale;
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        dst[i] = T(static_cast<float>(value));
      } else if constexpr (std::is_integral_v<T>) {
        // A static_cast of NaN, inf or an out-of-range value to an integer is undefined
        // behaviour, and 3.7 would silently become 3: an integer dtype takes only values
        // it holds exactly. [-2^k, 2^k) is T's range; both ends are exact in double.
        const double limit = std::ldexp(1.0, std::numeric_limits<T>::digits);
        if (!(std::isfinite(value) && value == std::trunc(value) && value >= -limit && value < limit)) {
          std::ostringstream os;
          os << "element " << i << " is " << value << (scale != 1.0 ? " after scaling" : "")
             << ", not an integer that " << dtype_name(dtype)
             << " holds; read this file into a floating-point dtype (read_idx(path, DType::kFloat32))";
          throw FileFormatError(path, os.str());
        }
        dst[i] = static_cast<T>(value);
      } else {
        dst[i] = static_cast<T>(value);
      }
    });
  });
  return out;
}

void write_idx_u8(const std::string& path, const std::vector<uint8_t>& values,
                  const std::vector<uint32_t>& dims) {
  size_t count = 1;
  for (uint32_t d : dims) count *= d;
  RT_CHECK(count == values.size(), "write_idx_u8: ", values.size(), " values do not fill the dims");
  RT_CHECK(!dims.empty() && dims.size() < 256, "write_idx_u8: need 1..255 dims");
  std::string bytes = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<char>((d >> s) & 0xFF));
  }
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  RT_CHECK(f.good(), "write_idx_u8: cannot open ", path, " for writing");
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  RT_CHECK(f.good(), "write_idx_u8: write to ", path, " failed");
}

TensorDataset load_mnist(const std::string& directory, MnistSplit split) {
  const std::string prefix = split == MnistSplit::kTrain ? "train" : "t10k";
  const std::string images_path = find_mnist_file(directory, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_mnist_file(directory, prefix + "-labels-idx1-ubyte");

  Tensor images = read_idx(images_path, DType::kFloat32, 1.0 / 255.0);
  if (images.dim() != 3) {
    throw FileFormatError(images_path, "expected images [N, rows, cols], got shape " + shape_str(images.shape()));
  }
  Tensor labels = read_idx(labels_path, DType::kInt64);
  if (labels.dim() != 1) {
    throw FileFormatError(labels_path, "expected labels [N], got shape " + shape_str(labels.shape()));
  }
  if (labels.size(0) != images.size(0)) {
    throw FileFormatError(labels_path, std::to_string(labels.size(0)) + " labels but " + images_path +
                                           " has " + std::to_string(images.size(0)) + " images");
  }
  const int64_t* l = labels.data<int64_t>();
  for (int64_t i = 0; i < labels.size(0); ++i) {
    if (l[i] < 0 || l[i] > 9) {
      throw FileFormatError(labels_path, "label " + std::to_string(l[i]) + " at index " + std::to_string(i) +
                                             " is outside 0..9");
    }
  }
  return TensorDataset(images.unsqueeze(1), labels);
}

}  // namespace ringtrain::data
