// Single-process tests of the shared-memory pieces: the slot layout read from
// RINGTRAIN_SHM_SLOT_BYTES / RINGTRAIN_SHM_SLOTS / RINGTRAIN_SHM_STREAMING_STORES, the
// slot copy routines, and ShmSegment's cleanup.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <string>
#include <vector>

#include "comm/reduce.h"
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
    unsetenv("RINGTRAIN_SHM_STREAMING_STORES");
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

// Streaming (non-temporal) stores into the slots are on by default; 0 turns them off and
// anything but 0 or 1 is named.
TEST_F(ShmLayoutEnv, StreamingStoresAreOnByDefaultAndTheSwitchIsChecked) {
  EXPECT_TRUE(ShmLayout::from_env(2).streaming_stores);
  setenv("RINGTRAIN_SHM_STREAMING_STORES", "0", 1);
  EXPECT_FALSE(ShmLayout::from_env(2).streaming_stores);
  setenv("RINGTRAIN_SHM_STREAMING_STORES", "1", 1);
  EXPECT_TRUE(ShmLayout::from_env(2).streaming_stores);
  for (const char* bad : {"2", "yes"}) {
    setenv("RINGTRAIN_SHM_STREAMING_STORES", bad, 1);
    EXPECT_NE(error_of(2).find("RINGTRAIN_SHM_STREAMING_STORES"), std::string::npos) << error_of(2);
  }
}

// Both slot copies must equal memcpy for every length and every alignment of either side:
// the streaming one writes an unaligned head and the tail with ordinary stores and the
// middle in 32-byte vectors, and must not touch a byte outside [dst, dst + n).
TEST(SlotCopy, OrdinaryAndStreamingCopiesEqualMemcpyAtEveryAlignmentAndLength) {
  std::vector<unsigned char> src(70000), dst(70200), want(70200);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (size_t n : {4095, 4096, 4097, 65536, 69931}) lengths.push_back(n);
  for (auto copy : {&copy_bytes, &copy_bytes_streaming}) {
    for (size_t n : lengths) {
      for (size_t dst_offset : {0, 1, 7, 31, 32, 33, 63}) {
        for (size_t src_offset : {0, 3}) {
          std::fill(dst.begin(), dst.end(), 0xAB);
          want = dst;
          std::memcpy(want.data() + dst_offset, src.data() + src_offset, n);
          copy(dst.data() + dst_offset, src.data() + src_offset, n);
          ASSERT_EQ(dst, want) << (copy == &copy_bytes ? "copy_bytes" : "copy_bytes_streaming") << " n "
                               << n << " dst offset " << dst_offset << " src offset " << src_offset;
        }
      }
    }
  }
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

// The transport is a byte stream: one process, one channel looped back to itself (slots
// of 64 bytes, 4 of them), sends cut one way and receives another. Every receive must
// get exactly its bytes, in order, in pieces that are whole 8-byte groups except the
// receive's last (a group split across two slots comes through the carry), whatever
// the cut: receives that end inside a slot, sends of 13 and 3 bytes, a receive of 5.
TEST(ShmTransport, IsAByteStreamWhateverTheSendsAndReceivesCut) {
  ShmLayout layout;
  layout.slot_bytes = 64;
  layout.slots = 4;
  layout.channels = 1;
  const std::string name = "/ringtrain-test-stream-" + std::to_string(getpid());
  auto segment = std::make_shared<ShmSegment>(name, layout.segment_bytes(), /*create=*/true);
  shm_unlink(name.c_str());
  auto transport = make_shm_transport(segment, 0, segment, 0, layout);
  std::vector<char> stream(5000);
  for (size_t i = 0; i < stream.size(); ++i) stream[i] = static_cast<char>(i * 131 + i / 256);
  const std::vector<size_t> sends = {13, 3, 200, 1, 7, 64, 1000, 9, 2703};     // sums to 4000
  const std::vector<size_t> receives = {24, 5, 100, 333, 8, 1, 2000, 17, 1512};  // sums to 4000
  size_t sent = 0, send_index = 0, send_done = 0;  // send_done: bytes of sends[send_index] out
  size_t received_total = 0;
  for (size_t receive : receives) {
    std::vector<char> got(receive);
    std::vector<size_t> pieces;
    size_t received = 0;
    for (int spins = 0; received < receive; ++spins) {
      ASSERT_LT(spins, 100000) << "receive of " << receive << " bytes at stream offset " << received_total << " stalled";
      // push a little of the current send (the 4 slots fill up quickly)
      if (send_index < sends.size()) {
        size_t n = transport->try_send(stream.data() + sent, sends[send_index] - send_done);
        sent += n;
        send_done += n;
        if (send_done == sends[send_index]) ++send_index, send_done = 0;
      }
      received += transport->try_recv(received, receive - received, [&](const void* piece, size_t offset, size_t n) {
        std::memcpy(got.data() + offset, piece, n);
        pieces.push_back(n);
      });
    }
    EXPECT_EQ(0, std::memcmp(got.data(), stream.data() + received_total, receive))
        << "receive of " << receive << " bytes at stream offset " << received_total;
    for (size_t k = 0; k + 1 < pieces.size(); ++k) {
      EXPECT_EQ(pieces[k] % 8, 0u) << "piece " << k << " of the receive at " << received_total << " has "
                                   << pieces[k] << " bytes and is not its last";
    }
    received_total += receive;
  }
  EXPECT_EQ(received_total, sent);
}

}  // namespace
}  // namespace ringtrain::comm
