// Single-process tests of the shared-memory pieces: the slot layout read from
// RINGTRAIN_SHM_SLOT_BYTES / RINGTRAIN_SHM_SLOTS / RINGTRAIN_SHM_STREAMING_STORES, the
// slot copy routines, ShmSegment's cleanup, and the sliced waits of the rendezvous
// (wait_in_slices, also PeerMesh's setup, whose deadline is checked here too).
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "comm/reduce.h"
#include "comm/shm_segment.h"
#include "comm/store.h"
#include "comm/transport.h"
#include "comm/types.h"
#include "comm/wait_in_slices.h"

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

// An attempt that waits (sleeps) until the end of its slice and finds nothing there,
// recording every slice end it was given.
struct NothingYet {
  std::vector<Deadline>* slice_ends;
  int operator()(Deadline slice_end) const {
    slice_ends->push_back(slice_end);
    std::this_thread::sleep_until(slice_end);
    throw CommTimeoutError("not yet");
  }
};

// The wait goes in slices of kMemberCheckSlice, checks the members between them, and
// never reaches past its deadline: the last slice is clipped to it, and its timeout
// goes out to the caller.
TEST(WaitInSlices, SlicesEndAtTheDeadlineAndTheLastTimeoutPropagates) {
  const Deadline start = Clock::now();
  const Deadline deadline = start + 2 * kMemberCheckSlice + std::chrono::milliseconds(100);
  std::vector<Deadline> slice_ends;
  int checks = 0;
  EXPECT_THROW(wait_in_slices(deadline, [&](const std::string& what) {
                 EXPECT_EQ(what, "rank 1's entry");
                 ++checks;
               }, "rank 1's entry", NothingYet{&slice_ends}),
               CommTimeoutError);
  ASSERT_GE(slice_ends.size(), 2u);
  for (size_t i = 0; i < slice_ends.size(); ++i) {
    EXPECT_LE(slice_ends[i], deadline) << "slice " << i << " of " << slice_ends.size() << " ends past the deadline by "
                                       << std::chrono::duration<double, std::milli>(slice_ends[i] - deadline).count()
                                       << " ms";
  }
  EXPECT_EQ(slice_ends.back(), deadline);
  EXPECT_LE(slice_ends.front(), start + kMemberCheckSlice + std::chrono::milliseconds(50));
  EXPECT_EQ(checks, static_cast<int>(slice_ends.size()) - 1);  // between slices, not after the last
}

// A member check that throws ends the wait with its error (the member's failure, not a
// timeout at the deadline). With LastLook::kNo the attempt is not run again.
TEST(WaitInSlices, AFailedMemberEndsTheWaitWithItsError) {
  std::vector<Deadline> slice_ends;
  try {
    wait_in_slices(Clock::now() + std::chrono::seconds(30),
                   [](const std::string& what) { throw PeerLostError(1, "rank 1 died while waiting for " + what); },
                   "rank 1 to connect", NothingYet{&slice_ends});
    FAIL() << "expected the member's failure";
  } catch (const PeerLostError& e) {
    EXPECT_STREQ(e.what(), "rank 1 died while waiting for rank 1 to connect");
  }
  EXPECT_EQ(slice_ends.size(), 1u);
}

// LastLook::kYes: once the check reports a failed member, the attempt gets one more
// look that waits for nothing (its slice ends now); what the member did before it
// failed is still taken, and its failure goes out only when that look finds nothing.
TEST(WaitInSlices, LastLookTakesWhatAFailedMemberLeftAndOtherwiseRethrows) {
  auto member_failed = [](const std::string&) { throw PeerLostError(1, "rank 1 died"); };
  int attempts = 0;
  Deadline last_look{};
  const int value = wait_in_slices(
      Clock::now() + std::chrono::seconds(30), member_failed, "rank 1's entry",
      [&](Deadline slice_end) {
        if (++attempts == 1) {
          std::this_thread::sleep_until(slice_end);
          throw CommTimeoutError("not yet");
        }
        last_look = slice_end;
        return 7;  // it published before it died
      },
      LastLook::kYes);
  EXPECT_EQ(value, 7);
  EXPECT_EQ(attempts, 2);
  EXPECT_LE(last_look, Clock::now());  // no time to wait in the last look
  std::vector<Deadline> slice_ends;
  EXPECT_THROW(wait_in_slices(Clock::now() + std::chrono::seconds(30), member_failed, "rank 1's entry",
                              NothingYet{&slice_ends}, LastLook::kYes),
               PeerLostError);
  EXPECT_EQ(slice_ends.size(), 2u);
}

// An error of the attempt other than a timeout is not "not yet": it goes out at once.
TEST(WaitInSlices, OtherErrorsOfTheAttemptPropagateAtOnce) {
  int checks = 0;
  EXPECT_THROW(wait_in_slices(Clock::now() + std::chrono::seconds(30), [&](const std::string&) { ++checks; }, "x",
                              [](Deadline) -> int { throw SocketClosed("connection closed"); }),
               SocketClosed);
  EXPECT_EQ(checks, 0);
}

// A member that published its segment but then never mapped the others' (stuck, or it
// failed in there and went on) is named by the rank whose wait for the mapping times
// out. The message used to give a count only ("allocate_symmetric: 1 of 2 ranks had
// mapped every shared memory segment after 0 s (rank 3 waited for the rest)").
// One process plays group rank 0 (world rank 3); group rank 1 (world rank 5) is a
// segment and its store entry, made here, and nothing more.
TEST(ShareShmSegments, AMappingTimeoutNamesTheRankThatDidNotMap) {
  StoreServer server("127.0.0.1", 0, "t");
  Store store("127.0.0.1", server.port(), "t");
  const std::string prefix = "/ringtrain-test-share-" + std::to_string(getpid());
  const size_t bytes = 4096;
  ShmSegment theirs(prefix + "-r1", bytes, /*create=*/true);
  store.set("sym/1", nlohmann::json{{"name", prefix + "-r1"}, {"bytes", bytes}}.dump());
  std::string error = "(no error)";
  try {
    share_shm_segments(store, "sym", /*rank=*/0, /*group_size=*/2, /*members=*/{0, 1}, /*world_ranks=*/{3, 5},
                       prefix + "-r0", bytes, Clock::now() + std::chrono::milliseconds(600),
                       [](const std::string&) {}, "allocate_symmetric", "the fix");
  } catch (const CommTimeoutError& e) {
    error = e.what();
  }
  shm_unlink((prefix + "-r1").c_str());
  EXPECT_NE(error.find("allocate_symmetric: rank 5 had not mapped"), std::string::npos) << error;
  EXPECT_NE(error.find("1 of 2 ranks had"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 3 waited"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + prefix + "-r0")) << "its own name was left behind";
}

// PeerMesh's setup gives up at its deadline, not a slice after it: a group of 2 whose
// rank 1 never comes, with 600 ms to form (slices of 250 ms: an unclipped last slice
// would end 150 ms late), fails naming rank 1 within the deadline and a little.
TEST(PeerMeshSetup, GivesUpAtItsDeadlineNamingTheRankThatNeverCame) {
  StoreServer server("127.0.0.1", 0, "t");
  Store store("127.0.0.1", server.port(), "t");
  const auto limit = std::chrono::milliseconds(600);
  const Deadline start = Clock::now();
  std::string error = "(no error)";
  try {
    PeerMesh mesh(store, "mesh-test", /*rank=*/0, /*size=*/2, /*world_ranks=*/{0, 1}, "token", "tcp",
                  start + limit, [](const std::string&) {});
  } catch (const CommTimeoutError& e) {
    error = e.what();
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  EXPECT_NE(error.find("rank 1 of 2 did not join"), std::string::npos) << error;
  EXPECT_GE(took, limit - std::chrono::milliseconds(50));  // (millis_until rounds down)
  EXPECT_LT(took, limit + std::chrono::milliseconds(100)) << "setup overran its deadline";
}

}  // namespace
}  // namespace ringtrain::comm
