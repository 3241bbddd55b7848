// Single-process tests of the shared-memory pieces: the slot layout read from
// RINGTRAIN_SHM_SLOT_BYTES / RINGTRAIN_SHM_SLOTS, and ShmSegment's cleanup.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "comm/shm_segment.h"
#include "comm/transport.h"
#include "comm/types.h"

namespace ringtrain::comm {
namespace {

// Sets the two layout variables for one test and restores "unset" after it.
class ShmLayoutEnv : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("RINGTRAIN_SHM_SLOT_BYTES");
    unsetenv("RINGTRAIN_SHM_SLOTS");
  }
  static std::string error_of(int channels) {
    try {
      ShmLayout::from_env(channels);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(no error)";
  }
};

TEST_F(ShmLayoutEnv, DefaultsAndValidValues) {
  ShmLayout layout = ShmLayout::from_env(3);
  EXPECT_EQ(layout.slot_bytes, 131072u);
  EXPECT_EQ(layout.slots, 8);
  EXPECT_EQ(layout.channels, 3);
  setenv("RINGTRAIN_SHM_SLOT_BYTES", "65536", 1);
  setenv("RINGTRAIN_SHM_SLOTS", "1024", 1);
  layout = ShmLayout::from_env(2);
  EXPECT_EQ(layout.slot_bytes, 65536u);
  EXPECT_EQ(layout.slots, 1024);
  EXPECT_EQ(layout.segment_bytes(), 2 * (layout.channel_bytes()));
}

// 4294967296 slots used to become 0 as an int: every send found no free slot and hung.
TEST_F(ShmLayoutEnv, RejectsSlotCountsThatDoNotFit) {
  for (const char* slots : {"4294967296", "1025"}) {
    setenv("RINGTRAIN_SHM_SLOTS", slots, 1);
    EXPECT_EQ(error_of(2), std::string("RINGTRAIN_SHM_SLOTS=") + slots +
                               " is not in [1, 1024]; unset it or give one such as 8");
  }
  // too large for any integer: refused as not a number, still by name
  setenv("RINGTRAIN_SHM_SLOTS", "18446744073709551616", 1);
  EXPECT_NE(error_of(2).find("RINGTRAIN_SHM_SLOTS='18446744073709551616'"), std::string::npos);
}

// A slot size near 2^64 / slots used to wrap the segment size: a short segment, then SIGSEGV.
TEST_F(ShmLayoutEnv, RejectsSlotSizesThatWouldWrapTheSegment) {
  for (const char* bytes : {"2305843009213693952", "1073741888"}) {
    setenv("RINGTRAIN_SHM_SLOT_BYTES", bytes, 1);
    std::string error = error_of(2);
    EXPECT_NE(error.find("RINGTRAIN_SHM_SLOT_BYTES=" + std::string(bytes)), std::string::npos) << error;
    EXPECT_NE(error.find("1073741824"), std::string::npos) << error;
  }
  setenv("RINGTRAIN_SHM_SLOT_BYTES", "1073741824", 1);  // the cap itself is allowed
  EXPECT_EQ(error_of(1), "(no error)");
}

// A segment that is created but cannot be mapped (128 TiB: ftruncate on tmpfs takes
// it, mmap does not) used to stay behind in /dev/shm.
TEST(ShmSegment, UnmappableSegmentIsNotLeftInDevShm) {
  const std::string name = "/ringtrain-test-unmappable-" + std::to_string(getpid());
  try {
    ShmSegment segment(name, (size_t{1} << 47) + 4096, /*create=*/true);
    GTEST_SKIP() << "this machine mapped 128 TiB of shared memory";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + name)) << "/dev/shm" << name << " was left behind";
}

}  // namespace
}  // namespace ringtrain::comm
