// safetensors reader/writer: round trips, the exact on-disk layout the Python
// package expects, and clear errors for truncated or corrupt files.
#include "tensor/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <typeinfo>

#include "tensor/ops.h"

namespace ringtrain {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ringtrain_safetensors_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string read_bytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  static void write_bytes(const std::string& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary);
    out << bytes;
  }
  // A file in the format's own terms: u64 header length, JSON, data.
  static std::string make_file(const std::string& json, const std::string& data) {
    std::string bytes(8, '\0');
    uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return bytes + json + data;
  }
  void expect_load_error(const std::string& p, const std::string& fragment) {
    try {
      load_safetensors(p);
      FAIL() << "expected an error containing '" << fragment << "'";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripsEveryDTypeAndMetadata) {
  Generator gen(7);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType dtype : kAllDTypes) {
    Tensor t = is_floating_point(dtype) ? randn({3, 5}, gen).to(dtype)
                                        : arange(-7, 8, 1, dtype).reshape({3, 5});
    tensors.emplace_back(std::string("t_") + dtype_name(dtype), t);
  }
  tensors.emplace_back("empty", zeros({0, 4}));
  tensors.emplace_back("scalar", scalar_tensor(2.5));
  save_safetensors(path("a.safetensors"), tensors, {{"step", "12"}, {"format", "pt"}});

  SafetensorsFile file = load_safetensors(path("a.safetensors"));
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file.tensors[i].first, tensors[i].first);
    const Tensor& got = file.tensors[i].second;
    EXPECT_EQ(got.dtype(), tensors[i].second.dtype());
    EXPECT_EQ(got.shape(), tensors[i].second.shape());
    EXPECT_EQ(got.to_vector<double>(), tensors[i].second.to_vector<double>()) << tensors[i].first;
  }
  EXPECT_EQ(file.metadata.at("step"), "12");
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.at("scalar").item(), 2.5);
  EXPECT_THROW(file.at("nope"), Error);
}

TEST_F(SafetensorsTest, SavesNonContiguousViewsByValue) {
  Tensor base = arange(0, 12, 1, DType::kFloat32).reshape({3, 4});
  Tensor view = base.t().slice(0, 1, 4, 2);  // [2, 3] strided view
  save_safetensors(path("v.safetensors"), {{"v", view}});
  Tensor got = load_safetensors(path("v.safetensors")).at("v");
  EXPECT_EQ(got.shape(), (Shape{2, 3}));
  EXPECT_EQ(got.to_vector<float>(), view.to_vector<float>());
}

TEST_F(SafetensorsTest, WritesTheExactLayoutPythonReads) {
  save_safetensors(path("x.safetensors"), {{"x", Tensor::from_vector<float>({1.0f, 2.0f}, {2})}});
  std::string bytes = read_bytes(path("x.safetensors"));
  std::string json = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  json.append((8 - json.size() % 8) % 8, ' ');
  float values[2] = {1.0f, 2.0f};
  EXPECT_EQ(bytes, make_file(json, std::string(reinterpret_cast<char*>(values), 8)));
}

TEST_F(SafetensorsTest, ReadsAHandWrittenFileWithOutOfOrderEntries) {
  int32_t ints[3] = {4, -5, 6};
  double d = 0.25;
  std::string data(reinterpret_cast<char*>(&d), 8);
  data += std::string(reinterpret_cast<char*>(ints), 12);
  std::string json = R"({"b":{"dtype":"I32","shape":[3],"data_offsets":[8,20]},)"
                     R"("__metadata__":{"k":"v"},"a":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})";
  write_bytes(path("h.safetensors"), make_file(json, data));
  SafetensorsFile file = load_safetensors(path("h.safetensors"));
  EXPECT_EQ(file.at("b").to_vector<int32_t>(), (std::vector<int32_t>{4, -5, 6}));
  EXPECT_EQ(file.at("a").item(), 0.25);
  EXPECT_EQ(file.metadata.at("k"), "v");
}

TEST_F(SafetensorsTest, TruncatedFileIsRejectedWithItsName) {
  save_safetensors(path("t.safetensors"), {{"w", ones({16})}});
  std::string bytes = read_bytes(path("t.safetensors"));
  write_bytes(path("t.safetensors"), bytes.substr(0, bytes.size() - 5));
  expect_load_error(path("t.safetensors"), "truncated");
  write_bytes(path("t.safetensors"), bytes.substr(0, 4));
  expect_load_error(path("t.safetensors"), "truncated");
  write_bytes(path("t.safetensors"), bytes.substr(0, 20));  // cut inside the header
  expect_load_error(path("t.safetensors"), "exceeds the file size");
}

TEST_F(SafetensorsTest, CorruptHeadersAreRejected) {
  write_bytes(path("c.safetensors"), make_file("{not json", ""));
  expect_load_error(path("c.safetensors"), "not valid JSON");
  write_bytes(path("c.safetensors"), make_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                                               std::string(8, '\0')));
  expect_load_error(path("c.safetensors"), "needs 12 bytes");
  write_bytes(path("c.safetensors"), make_file(R"({"w":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}})",
                                               std::string(1, '\0')));
  expect_load_error(path("c.safetensors"), "unsupported dtype 'Q8'");
  write_bytes(path("c.safetensors"),
              make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        std::string(12, '\0')));
  expect_load_error(path("c.safetensors"), "overlap");
  write_bytes(path("c.safetensors"), make_file(R"({"w":{"dtype":"F32","shape":[1]}})", std::string(4, '\0')));
  expect_load_error(path("c.safetensors"), "malformed");
  // 2^32 x 2^32 x 4 bytes wraps to 0 in 64 bits: without an overflow check the empty
  // data range would "match" and the tensor would claim 2^64 elements over no storage.
  write_bytes(path("c.safetensors"),
              make_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""));
  expect_load_error(path("c.safetensors"), "too large");
  write_bytes(path("c.safetensors"),
              make_file(R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})", ""));
  expect_load_error(path("c.safetensors"), "too large");
}

// Every way a file can be damaged one byte at a time, and every truncation: the loader
// either returns tensors or throws ringtrain::Error naming the file. Never another
// exception type (a JSON library's type_error, std::bad_alloc from a huge shape), never a
// crash or an out-of-bounds read (this test also runs under AddressSanitizer:
// scripts/sanitize.sh address).
// Shapes that are not int64 integers, and repeated names, get messages saying so (not "has a
// negative dim", not silently truncated, not "regions overlap or leave gaps").
TEST_F(SafetensorsTest, ShapesThatAreNotDimsAndDuplicateNamesAreNamedPrecisely) {
  const std::string data(16, '\0');
  auto header = [](const std::string& shape) {
    return R"({"w":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[0,16]}})";
  };
  write_bytes(path("huge.safetensors"), make_file(header("[1e30]"), data));
  expect_load_error(path("huge.safetensors"), "too large");
  write_bytes(path("u64.safetensors"), make_file(header("[18446744073709551615]"), data));
  expect_load_error(path("u64.safetensors"), "too large for a dim");
  write_bytes(path("frac.safetensors"), make_file(header("[4.5]"), data));
  expect_load_error(path("frac.safetensors"), "is not an integer");
  write_bytes(path("neg.safetensors"), make_file(header("[-4]"), data));
  expect_load_error(path("neg.safetensors"), "negative dim");
  write_bytes(path("dup.safetensors"),
              make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                        data));
  expect_load_error(path("dup.safetensors"), "duplicate tensor name");
  write_bytes(path("ok.safetensors"), make_file(header("[4]"), data));
  EXPECT_EQ(load_safetensors(path("ok.safetensors")).at("w").shape(), (Shape{4}));
}

TEST_F(SafetensorsTest, EveryOneByteCorruptionAndTruncationLoadsOrThrowsError) {
  save_safetensors(path("good.safetensors"),
                   {{"weight", arange(0, 6).reshape({2, 3})},
                    {"bias", full({3}, 0.5, DType::kFloat64)},
                    {"step", full({1}, 7, DType::kInt64)},
                    {"half", ones({2}, DType::kBFloat16)}},
                   {{"format", "pt"}});
  const std::string good = read_bytes(path("good.safetensors"));
  const std::string p = path("bad.safetensors");
  int loaded = 0, rejected = 0;
  auto try_load = [&](const std::string& bytes, const std::string& what) {
    write_bytes(p, bytes);
    try {
      SafetensorsFile file = load_safetensors(p);
      // Read every element (a storage shorter than the shape says would show here,
      // under ASan as an out-of-bounds read).
      for (const auto& [name, tensor] : file.tensors) (void)tensor.to(DType::kFloat64);
      ++loaded;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find(p), std::string::npos) << what << ": " << e.what();
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << what << ": threw a " << typeid(e).name() << " instead of ringtrain::Error: " << e.what();
    }
  };
  const unsigned char replacements[] = {0x00, 0xff, '0', '9', '-', '"', '{', '}', '[', ']', ',', ':'};
  for (size_t i = 0; i < good.size(); ++i) {
    for (unsigned char r : replacements) {
      if (static_cast<unsigned char>(good[i]) == r) continue;
      std::string bytes = good;
      bytes[i] = static_cast<char>(r);
      try_load(bytes, "byte " + std::to_string(i) + " set to " + std::to_string(r));
      if (HasFatalFailure()) return;
    }
  }
  for (size_t n = 0; n < good.size(); ++n) {
    try_load(good.substr(0, n), "truncated to " + std::to_string(n) + " bytes");
    if (HasFatalFailure()) return;
  }
  // Both outcomes happen: data bytes can take any value, header bytes mostly cannot.
  EXPECT_GT(loaded, 0);
  EXPECT_GT(rejected, static_cast<int>(good.size()));
}

TEST_F(SafetensorsTest, MissingFileAndDirectoryNameThePath) {
  expect_load_error(path("absent.safetensors"), "cannot open");
  std::string bad = path("no/such/dir/x.safetensors");
  try {
    save_safetensors(bad, {{"w", ones({1})}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, SaveReplacesAtomicallyAndLeavesNoTemporaryFiles) {
  save_safetensors(path("m.safetensors"), {{"w", ones({4})}});
  save_safetensors(path("m.safetensors"), {{"w", full({4}, 3.0)}});
  EXPECT_EQ(load_safetensors(path("m.safetensors")).at("w").to_vector<float>(),
            (std::vector<float>{3, 3, 3, 3}));
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "m.safetensors");
  }
  EXPECT_EQ(files, 1);
  EXPECT_THROW(save_safetensors(path("d.safetensors"), {{"w", ones({1})}, {"w", ones({1})}}), Error);
}

// A directory fsync that fails with `errno_value`, and counts its calls.
int g_directory_fsyncs = 0;
int g_directory_fsync_errno = 0;
int failing_directory_fsync(int) {
  ++g_directory_fsyncs;
  errno = g_directory_fsync_errno;
  return -1;
}

// Puts ::fsync back however the test ends.
struct DirectoryFsyncStandIn {
  explicit DirectoryFsyncStandIn(int errno_value) {
    g_directory_fsyncs = 0;
    g_directory_fsync_errno = errno_value;
    set_directory_fsync_for_testing(&failing_directory_fsync);
  }
  ~DirectoryFsyncStandIn() { set_directory_fsync_for_testing(nullptr); }
};

// The rename is durable only once the directory is synced: a failed directory fsync
// (EIO from a failing disk) is reported, naming the file (which is in place) and the
// directory, not swallowed as if the save were safe.
TEST_F(SafetensorsTest, AFailedDirectoryFsyncIsReportedNotIgnored) {
  {
    DirectoryFsyncStandIn stand_in(EIO);
    try {
      save_safetensors(path("m.safetensors"), {{"w", ones({4})}});
      ADD_FAILURE() << "a failed directory fsync was not reported";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("m.safetensors was written and renamed into place"), std::string::npos) << what;
      EXPECT_NE(what.find("fsync of its directory " + dir_.string()), std::string::npos) << what;
      EXPECT_NE(what.find(std::strerror(EIO)), std::string::npos) << what;
      EXPECT_NE(what.find("not durable"), std::string::npos) << what;
    }
    EXPECT_EQ(g_directory_fsyncs, 1);
    // The bytes are there (only their durability is in doubt), and no temporary is left.
    EXPECT_EQ(load_safetensors(path("m.safetensors")).at("w").to_vector<float>(),
              (std::vector<float>{1, 1, 1, 1}));
    EXPECT_FALSE(fs::exists(dir_ / (".m.safetensors.tmp." + std::to_string(::getpid()))));
  }
  // A file system that cannot sync directories at all (EINVAL): nothing more to do, no error.
  {
    DirectoryFsyncStandIn stand_in(EINVAL);
    EXPECT_NO_THROW(write_file_atomically(path("a.json"), "{}"));
    EXPECT_EQ(g_directory_fsyncs, 1);
  }
  // And the real ::fsync is back.
  EXPECT_NO_THROW(write_file_atomically(path("b.json"), "{}"));
  EXPECT_EQ(g_directory_fsyncs, 1);
}

// A close that really closes the descriptor (no leak) but reports EIO, as a network file
// system may when the data cannot be written back; counts its calls.
int g_file_closes = 0;
int failing_close(int fd) {
  ++g_file_closes;
  ::close(fd);
  errno = EIO;
  return -1;
}

// A failed close of the temporary file is an error like a failed write or fsync: the save
// throws naming the close, the previous file stays as it was, and the temporary is removed
// (it was left behind, the close being outside the cleanup).
TEST_F(SafetensorsTest, AFailedCloseOfTheTemporaryRemovesItAndKeepsThePreviousFile) {
  save_safetensors(path("m.safetensors"), {{"w", ones({2})}});
  g_file_closes = 0;
  set_file_close_for_testing(&failing_close);
  try {
    save_safetensors(path("m.safetensors"), {{"w", zeros({3})}});
    ADD_FAILURE() << "a failed close was not reported";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("close of"), std::string::npos) << what;
    EXPECT_NE(what.find(std::strerror(EIO)), std::string::npos) << what;
  }
  set_file_close_for_testing(nullptr);
  EXPECT_EQ(g_file_closes, 1);
  EXPECT_FALSE(fs::exists(dir_ / (".m.safetensors.tmp." + std::to_string(::getpid()))));
  EXPECT_EQ(load_safetensors(path("m.safetensors")).at("w").to_vector<float>(), (std::vector<float>{1, 1}));
  // And the real ::close is back.
  EXPECT_NO_THROW(save_safetensors(path("m.safetensors"), {{"w", zeros({3})}}));
  EXPECT_EQ(g_file_closes, 1);
  EXPECT_EQ(load_safetensors(path("m.safetensors")).at("w").numel(), 3);
}

}  // namespace
}  // namespace ringtrain
