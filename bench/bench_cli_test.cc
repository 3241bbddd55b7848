// bench_cli_test.cc: the command-line pieces the benchmarks share (bench/bench_cli.h).
#include "bench/bench_cli.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ringtrain::bench {
namespace {

std::optional<uint64_t> parse(const std::string& text) {
  std::string error;
  std::optional<uint64_t> bytes = parse_byte_size(text, &error);
  EXPECT_EQ(bytes.has_value(), error.empty()) << text;
  return bytes;
}

std::string parse_error(const std::string& text) {
  std::string error;
  EXPECT_FALSE(parse_byte_size(text, &error).has_value()) << text;
  return error;
}

TEST(ParseByteSize, DigitsAndUnitsInAnyCase) {
  EXPECT_EQ(parse("0"), 0u);
  EXPECT_EQ(parse("4096"), 4096u);
  EXPECT_EQ(parse("007"), 7u);
  EXPECT_EQ(parse("4k"), 4096u);
  EXPECT_EQ(parse("4K"), 4096u);
  EXPECT_EQ(parse("64KiB"), 64u << 10);
  EXPECT_EQ(parse("64kib"), 64u << 10);
  EXPECT_EQ(parse("256M"), 256u << 20);
  EXPECT_EQ(parse("2MiB"), 2u << 20);
  EXPECT_EQ(parse("1G"), uint64_t{1} << 30);  // the old parser read "1G" as 1 byte
  EXPECT_EQ(parse("3gib"), uint64_t{3} << 30);
}

TEST(ParseByteSize, RejectsAnythingElseNamingTheForms) {
  for (const char* text : {"", "abc", "1.5K", "-1", "+4", " 4", "4 ", "4K ", "K", "4KB", "4T", "1e3", "0x10",
                           "4KiBs", "4\n"}) {
    const std::string error = parse_error(text);
    EXPECT_NE(error.find("is not a byte count; expected digits with an optional K, M or G"), std::string::npos)
        << text << ": " << error;
  }
}

TEST(ParseByteSize, OverflowIsAnError) {
  EXPECT_EQ(parse("18446744073709551615"), UINT64_MAX);
  EXPECT_NE(parse_error("18446744073709551616").find("is too large"), std::string::npos);
  EXPECT_NE(parse_error("99999999999999999999999").find("is too large"), std::string::npos);
  EXPECT_EQ(parse("17179869183G"), uint64_t{17179869183} << 30);
  EXPECT_NE(parse_error("17179869184G").find("is too large"), std::string::npos);  // 2^64 bytes
  EXPECT_NE(parse_error("18014398509481984K").find("is too large"), std::string::npos);
}

TEST(FormatByteSize, ShortestTypedForm) {
  EXPECT_EQ(format_byte_size(0), "0");
  EXPECT_EQ(format_byte_size(1000), "1000");
  EXPECT_EQ(format_byte_size(1536), "1536");
  EXPECT_EQ(format_byte_size(3072), "3K");
  EXPECT_EQ(format_byte_size(256u << 20), "256M");
  EXPECT_EQ(format_byte_size(uint64_t{4} << 30), "4G");
  EXPECT_EQ(format_byte_size(uint64_t{1} << 40), "1024G");
  for (uint64_t bytes : {uint64_t{1}, uint64_t{4095}, uint64_t{1} << 20, UINT64_MAX}) {
    EXPECT_EQ(parse(format_byte_size(bytes)), bytes);
  }
}

// Parses `args` (after the program name) with one byte-size option; returns CLI11's
// error message, empty when the parse succeeded.
std::string parse_option(std::vector<std::string> args, uint64_t& bytes, uint64_t min = 0,
                         uint64_t max = UINT64_MAX) {
  CLI::App app{"test"};
  add_byte_size_option(app, "--size", bytes, "a size", min, max);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return {};
}

TEST(ByteSizeOption, StoresTheCountAndNamesTheOptionOnError) {
  uint64_t bytes = 8;
  EXPECT_EQ(parse_option({"--size", "64K"}, bytes), "");
  EXPECT_EQ(bytes, 64u << 10);
  EXPECT_EQ(parse_option({"--size", "1.5K"}, bytes),
            std::string("--size: '1.5K' is not a byte count; expected ") + kByteSizeForms);
  EXPECT_EQ(bytes, 64u << 10);
  EXPECT_EQ(parse_option({"--size", "8G"}, bytes, 4, uint64_t{4} << 30), "--size: '8G' is not in [4 - 4G]");
  EXPECT_EQ(parse_option({"--size", "0"}, bytes, 1), "--size: '0' is less than 1");
  EXPECT_EQ(parse_option({"--size", "4G"}, bytes, 4, uint64_t{4} << 30), "");
  EXPECT_EQ(bytes, uint64_t{4} << 30);
}

TEST(ByteSizeOption, HelpShowsTheDefaultAsTyped) {
  CLI::App app{"test"};
  uint64_t bytes = 256u << 20;
  add_byte_size_option(app, "--max-bytes", bytes, "largest size", 4, uint64_t{4} << 30);
  const std::string help = app.help();
  EXPECT_NE(help.find("SIZE in [4 - 4G]=256M"), std::string::npos) << help;
  EXPECT_NE(help.find(kByteSizeForms), std::string::npos) << help;
}

class OutputFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/bench_cli_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    ::unlink((dir_ + "/out.json").c_str());
    ::rmdir(dir_.c_str());
  }
  static bool exists(const std::string& path) {
    struct stat info {};
    return ::stat(path.c_str(), &info) == 0;
  }
  std::string dir_;
};

TEST_F(OutputFiles, CheckWritableLeavesNoTrace) {
  const std::string path = dir_ + "/out.json";
  EXPECT_EQ(check_writable("--json", path), "");
  EXPECT_FALSE(exists(path));  // created to try, then removed
  std::ofstream(path) << "kept";
  EXPECT_EQ(check_writable("--json", path), "");
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  EXPECT_EQ(text.str(), "kept");  // an existing file is not truncated
}

TEST_F(OutputFiles, CheckWritableSaysWhy) {
  EXPECT_EQ(check_writable("--json", dir_ + "/missing/out.json"),
            "cannot write --json " + dir_ + "/missing/out.json: No such file or directory");
  EXPECT_EQ(check_writable("--trace", dir_), "cannot write --trace " + dir_ + ": Is a directory");
}

TEST_F(OutputFiles, WriteTextFile) {
  const std::string path = dir_ + "/out.json";
  EXPECT_EQ(write_text_file("--json", path, "{}\n"), "");
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  EXPECT_EQ(text.str(), "{}\n");
  EXPECT_EQ(write_text_file("--json", dir_ + "/missing/out.json", "{}"),
            "cannot write --json " + dir_ + "/missing/out.json: No such file or directory");
  if (exists("/dev/full")) {  // a full disk shows when the file is closed
    EXPECT_EQ(write_text_file("--json", "/dev/full", "{}"), "cannot write --json /dev/full: No space left on device");
  }
}

TEST(CheckFitsInMemory, NamesBothSizes) {
  EXPECT_EQ(check_fits_in_memory(1 << 20, "a little"), "");
  const std::string error = check_fits_in_memory(1e30, "--message 1000G");
  if (physical_memory_bytes() > 0) {
    EXPECT_EQ(error.rfind("--message 1000G needs at least ", 0), 0u) << error;
    EXPECT_NE(error.find("GiB, more than this machine's "), std::string::npos) << error;
  }
}

}  // namespace
// An even count's median is the mean of the two middle samples (ddp_step and
// core_to_core used to quote the upper one).
TEST(Median, OddAndEvenCounts) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median({5}), 5);
  EXPECT_THROW(median({}), std::logic_error);
}

}  // namespace ringtrain::bench
