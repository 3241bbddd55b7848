// data_files_test.cc: the IDX (MNIST) reader and the digits CSV loader, on
// files the tests write themselves (plain and gzip) and on the real digits file
// Debian's python3-sklearn ships. Every malformed-file case checks that the error
// names the file and says what was wrong.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "nn/data/digits.h"
#include "nn/data/file_reader.h"
#include "nn/data/mnist.h"
#include "tensor/ops.h"

namespace ringtrain::data {
namespace {

namespace fs = std::filesystem;

class DataFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ringtrain_data_files_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream f(path(name), std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  void write_gz(const std::string& name, const std::string& bytes) const {
    gzFile f = gzopen(path(name).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    gzclose(f);
  }
  std::string read(const std::string& name) const {
    std::ifstream f(path(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  // A tiny MNIST split: n images of rows x cols with pixel (i, r, c) = (i + r + c) % 256.
  void write_mnist(const std::string& prefix, uint32_t n, uint32_t rows, uint32_t cols, bool gz) {
    std::vector<uint8_t> px, labels;
    for (uint32_t i = 0; i < n; ++i) {
      labels.push_back(static_cast<uint8_t>(i % 10));
      for (uint32_t r = 0; r < rows; ++r)
        for (uint32_t c = 0; c < cols; ++c) px.push_back(static_cast<uint8_t>((i * 40 + r + c) % 256));
    }
    std::string img = prefix + "-images-idx3-ubyte", lab = prefix + "-labels-idx1-ubyte";
    write_idx_u8(path(img), px, {n, rows, cols});
    write_idx_u8(path(lab), labels, {n});
    if (gz) {
      std::string a = read(img), b = read(lab);
      fs::remove(path(img));
      fs::remove(path(lab));
      write_gz(img + ".gz", a);
      write_gz(lab + ".gz", b);
    }
  }
  fs::path dir_;
};

// Asserts that `fn` throws FileFormatError mentioning `file` and `problem`.
template <typename Fn>
void expect_file_error(Fn&& fn, const std::string& file, const std::string& problem) {
  try {
    fn();
    ADD_FAILURE() << "expected a FileFormatError about " << file;
  } catch (const FileFormatError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << "expected '" << problem << "' in: " << msg;
  }
}

TEST_F(DataFilesTest, ReadsPlainAndGzipMnist) {
  for (bool gz : {false, true}) {
    write_mnist("train", 3, 28, 28, gz);
    TensorDataset ds = load_mnist(dir_.string(), MnistSplit::kTrain);
    ASSERT_EQ(ds.inputs().shape(), (Shape{3, 1, 28, 28}));
    EXPECT_EQ(ds.inputs().dtype(), DType::kFloat32);
    EXPECT_EQ(ds.targets().to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
    std::vector<float> x = ds.inputs().to_vector<float>();
    // image 2, row 3, col 5: (80 + 8) / 255
    EXPECT_FLOAT_EQ(x[2 * 784 + 3 * 28 + 5], static_cast<float>(88 / 255.0));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
}

TEST_F(DataFilesTest, ReadIdxOtherTypesBigEndian) {
  // int16 [2]: -2, 300 ; float32 [1, 1]: 1.5 ; float64 [1]: -0.25
  write("i16", std::string("\0\0\x0b\x01\0\0\0\x02\xff\xfe\x01\x2c", 12));
  EXPECT_EQ(read_idx(path("i16"), DType::kInt64).to_vector<int64_t>(), (std::vector<int64_t>{-2, 300}));
  write("f32", std::string("\0\0\x0d\x02\0\0\0\x01\0\0\0\x01\x3f\xc0\0\0", 16));
  Tensor f = read_idx(path("f32"));
  EXPECT_EQ(f.shape(), (Shape{1, 1}));
  EXPECT_EQ(f.item(), 1.5);
  write("f64", std::string("\0\0\x0e\x01\0\0\0\x01\xbf\xd0\0\0\0\0\0\0", 16));
  EXPECT_EQ(read_idx(path("f64"), DType::kFloat64).item(), -0.25);
}

// A float IDX payload read into an integer dtype: NaN, inf and out-of-range values were a
// static_cast with undefined behaviour, and 3.7 silently became 3. Now each is an error that
// names the file and the element; integral values (and float dtypes) still load.
TEST_F(DataFilesTest, ReadIdxRejectsNonIntegralValuesForIntegerDtypes) {
  // float32 [3]: 1, <bad>, 2 (big-endian bits)
  auto f32_file = [&](const std::string& name, const char* bad_bits) {
    write(name, std::string("\0\0\x0d\x01\0\0\0\x03\x3f\x80\0\0", 12) + std::string(bad_bits, 4) +
                    std::string("\x40\0\0\0", 4));
  };
  f32_file("frac", "\x40\x6c\xcc\xcd");  // 3.7
  f32_file("nan", "\x7f\xc0\0\0");
  f32_file("inf", "\xff\x80\0\0");        // -inf
  f32_file("huge", "\x60\xad\x78\xec");  // 1e20: beyond int64
  f32_file("big32", "\x4f\x00\0\0");     // 2^31: fits int64, not int32
  f32_file("ok", "\xc0\x40\0\0");        // -3
  for (DType dtype : {DType::kInt64, DType::kInt32}) {
    SCOPED_TRACE(dtype_name(dtype));
    for (const char* name : {"frac", "nan", "inf", "huge"})
      expect_file_error([&] { read_idx(path(name), dtype); }, path(name), "element 1 is");
    EXPECT_EQ(read_idx(path("ok"), dtype).to(DType::kInt64).to_vector<int64_t>(),
              (std::vector<int64_t>{1, -3, 2}));
  }
  expect_file_error([&] { read_idx(path("frac"), DType::kInt64); }, path("frac"), "3.7");
  expect_file_error([&] { read_idx(path("big32"), DType::kInt32); }, path("big32"), "int32");
  EXPECT_EQ(read_idx(path("big32"), DType::kInt64).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 2147483648, 2}));
  EXPECT_FLOAT_EQ(read_idx(path("frac")).to_vector<float>()[1], 3.7f);  // a float dtype takes it as it is
  // uint8 pixels scaled into an integer dtype are fractions too.
  write_idx_u8(path("u8"), {0, 51}, {2});
  expect_file_error([&] { read_idx(path("u8"), DType::kInt64, 1.0 / 255.0); }, path("u8"), "after scaling");
}

TEST_F(DataFilesTest, MissingMnistFileNamesIt) {
  expect_file_error([&] { load_mnist(dir_.string(), MnistSplit::kTest); },
                    path("t10k-images-idx3-ubyte"), "not found");
  expect_file_error([&] { read_idx(path("nope.idx")); }, path("nope.idx"), "cannot open");
}

TEST_F(DataFilesTest, BadMagicTruncatedAndTrailingBytes) {
  write("text", "hello, this is not an IDX file");
  expect_file_error([&] { read_idx(path("text")); }, path("text"), "bad IDX magic");
  write("type", std::string("\0\0\x07\x01\0\0\0\x01\x01", 9));
  expect_file_error([&] { read_idx(path("type")); }, path("type"), "unknown IDX element type");
  write("short", std::string("\0\0", 2));
  expect_file_error([&] { read_idx(path("short")); }, path("short"), "too short");
  write_idx_u8(path("full"), std::vector<uint8_t>(20, 7), {2, 10});
  std::string bytes = read("full");
  write("trunc", bytes.substr(0, bytes.size() - 3));
  expect_file_error([&] { read_idx(path("trunc")); }, path("trunc"), "truncated");
  write("trail", bytes + "xx");
  expect_file_error([&] { read_idx(path("trail")); }, path("trail"), "trailing bytes");
  write("hdr", bytes.substr(0, 6));
  expect_file_error([&] { read_idx(path("hdr")); }, path("hdr"), "truncated header");
  // u8, 4 dims of 65536: 2^64 elements, which wraps to 0 in 64 bits, so a file of the
  // header alone would have passed the size check with a tensor claiming 2^64 elements.
  write("huge", std::string("\0\0\x08\x04", 4) + std::string("\0\x01\0\0", 4) + std::string("\0\x01\0\0", 4) +
                    std::string("\0\x01\0\0", 4) + std::string("\0\x01\0\0", 4));
  expect_file_error([&] { read_idx(path("huge")); }, path("huge"), "too large");
}

TEST_F(DataFilesTest, TruncatedGzipIsReported) {
  write_mnist("train", 50, 28, 28, /*gz=*/true);
  std::string gz = read("train-images-idx3-ubyte.gz");
  write("train-images-idx3-ubyte.gz", gz.substr(0, gz.size() / 2));
  expect_file_error([&] { load_mnist(dir_.string(), MnistSplit::kTrain); },
                    path("train-images-idx3-ubyte.gz"), "truncated gzip");
}

TEST_F(DataFilesTest, MnistLabelChecks) {
  write_mnist("train", 4, 28, 28, false);
  write_idx_u8(path("train-labels-idx1-ubyte"), {1, 2, 3}, {3});
  expect_file_error([&] { load_mnist(dir_.string(), MnistSplit::kTrain); },
                    path("train-labels-idx1-ubyte"), "3 labels but");
  write_idx_u8(path("train-labels-idx1-ubyte"), {1, 2, 12, 3}, {4});
  expect_file_error([&] { load_mnist(dir_.string(), MnistSplit::kTrain); },
                    path("train-labels-idx1-ubyte"), "label 12 at index 2");
  write_idx_u8(path("train-labels-idx1-ubyte"), {1, 2, 3, 4}, {2, 2});
  expect_file_error([&] { load_mnist(dir_.string(), MnistSplit::kTrain); },
                    path("train-labels-idx1-ubyte"), "expected labels [N]");
}

TEST_F(DataFilesTest, DigitsCsvErrorsNameFileAndLine) {
  std::string good_row;
  for (int i = 0; i < 64; ++i) good_row += std::to_string(i % 17) + ",";
  write_gz("ok.csv.gz", good_row + "3\n" + good_row + "7\n");
  TensorDataset ok = load_digits({.path = path("ok.csv.gz")});
  EXPECT_EQ(ok.inputs().shape(), (Shape{2, 64}));
  EXPECT_EQ(ok.targets().to_vector<int64_t>(), (std::vector<int64_t>{3, 7}));
  EXPECT_FLOAT_EQ(ok.inputs().to_vector<float>()[16], 16.0f / 16.0f);

  write("few.csv", good_row + "3\n1,2,3\n");
  expect_file_error([&] { load_digits({.path = path("few.csv")}); }, path("few.csv"), "line 2: expected 65");
  write("nan.csv", good_row + "x\n");
  expect_file_error([&] { load_digits({.path = path("nan.csv")}); }, path("nan.csv"), "line 1: field 65");
  write("range.csv", "17," + good_row.substr(2) + "3\n");
  expect_file_error([&] { load_digits({.path = path("range.csv")}); }, path("range.csv"), "integer in 0..16");
  // from_chars reads "nan" and fractions: NaN failed no comparison and loaded silently, and a
  // NaN label reached an integer cast (undefined behaviour); now both are named errors.
  write("nan_pixel.csv", "nan," + good_row.substr(2) + "3\n");
  expect_file_error([&] { load_digits({.path = path("nan_pixel.csv")}); }, path("nan_pixel.csv"), "pixel 1 = nan");
  write("half_pixel.csv", "3.5," + good_row.substr(2) + "3\n");
  expect_file_error([&] { load_digits({.path = path("half_pixel.csv")}); }, path("half_pixel.csv"), "pixel 1 = 3.5");
  write("nan_label.csv", good_row + "nan\n");
  expect_file_error([&] { load_digits({.path = path("nan_label.csv")}); }, path("nan_label.csv"), "label nan");
  write("float_ok.csv", good_row + "3.0\n");  // some copies of the file write ".0"
  EXPECT_EQ(load_digits({.path = path("float_ok.csv")}).targets().to_vector<int64_t>(), (std::vector<int64_t>{3}));
  write("empty.csv", "");
  expect_file_error([&] { load_digits({.path = path("empty.csv")}); }, path("empty.csv"), "no examples");
  expect_file_error([&] { load_digits({.path = path("missing.csv.gz")}); }, path("missing.csv.gz"),
                    "python3-sklearn");
}

TEST(Digits, RealFileFromPython3Sklearn) {
  if (!fs::exists(kDigitsDefaultPath)) GTEST_SKIP() << kDigitsDefaultPath << " absent (apt-get install python3-sklearn)";
  TensorDataset ds = load_digits();
  ASSERT_EQ(ds.size(), kDigitsSamples);
  EXPECT_EQ(ds.inputs().shape(), (Shape{1797, 64}));
  std::vector<float> x = ds.inputs().to_vector<float>();
  // The first row of the file: 0,0,5,13,9,1,0,0,... label 0.
  EXPECT_FLOAT_EQ(x[2], 5.0f / 16.0f);
  EXPECT_FLOAT_EQ(x[3], 13.0f / 16.0f);
  EXPECT_EQ(ds.targets().to_vector<int64_t>()[0], 0);
  std::vector<int> counts(10, 0);
  for (int64_t y : ds.targets().to_vector<int64_t>()) ++counts.at(y);
  for (int c : counts) EXPECT_GT(c, 170);  // 174..183 of each digit
  EXPECT_EQ(*std::max_element(x.begin(), x.end()), 1.0f);
  TensorDataset images = load_digits({.as_images = true});
  EXPECT_EQ(images.inputs().shape(), (Shape{1797, 1, 8, 8}));
}

}  // namespace
}  // namespace ringtrain::data
