// wait_in_slices.h: waiting for another member of a group in short slices, so
// that a member that failed or died is named within a fraction of a second.
//
// defines: MemberCheck (throws when a member failed or died),
//          kMemberCheckSlice (how long one slice lasts),
//          LastLook (whether the awaited thing is looked for once more after a failure),
//          wait_in_slices (the loop).
//
// Why. While a group is being set up, a rank waits for things only other members
// can make happen: a key they publish in the store, a connection they accept, a
// counter they raise. A single blocking wait until the deadline learns nothing
// while it waits, so a member that threw during setup, or was killed, would show
// up minutes later as a bare timeout ("key ... did not appear"). Instead the wait
// goes in slices of kMemberCheckSlice; when a slice ends with nothing, the caller's
// MemberCheck looks for a member that published a failure or whose connection is
// closed, and throws naming it and `what` this rank waited for. So a dead member
// is named within about one slice, not at the deadline.
//
// The slices never reach past the caller's deadline: each ends at
// min(deadline, now + kMemberCheckSlice), and the CommTimeoutError of the slice that
// ends at the deadline goes out to the caller as it is (the caller rewrites it into
// its own message). Users: PeerMesh's setup (peer_mesh.cc) and the shared-memory
// rendezvous (share_shm_segments in shm_segment.cc).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>

#include "comm/types.h"

namespace ringtrain::comm {

// Throws (PeerLostError, or CommError) when a member of the group failed or died,
// naming it and `what` this rank was waiting for; returns when none did.
// PeerMesh::check_members is one.
using MemberCheck = std::function<void(const std::string& what)>;

// How long one slice of a wait lasts before the members are checked (a few store
// round trips per member), and so about how long a dead member goes unnoticed.
inline constexpr std::chrono::milliseconds kMemberCheckSlice{250};

// What wait_in_slices does when the member check throws.
enum class LastLook {
  // Rethrow the member's failure at once. For things that die with their maker
  // (a connection to accept, a reply on a socket).
  kNo,
  // Try the attempt once more with no time to wait, and return its result if it
  // succeeds; rethrow the failure only if it does not. For things that outlive
  // their maker (a store key, a counter): a member may have done its part and
  // only then failed, and its part is still good.
  kYes,
};

// Runs attempt(slice_end) until it returns, where slice_end is a Deadline no later
// than `deadline`. A CommTimeoutError from a slice that ends before `deadline`
// means "not yet": check_members(what) runs (it throws if a member failed or died;
// see LastLook for what happens then) and the next slice starts. The
// CommTimeoutError of the slice that ends at `deadline` propagates, as does any
// other exception of attempt. Returns what attempt returned.
template <typename Attempt>
auto wait_in_slices(Deadline deadline, const MemberCheck& check_members, const std::string& what,
                    Attempt&& attempt, LastLook last_look = LastLook::kNo) {
  while (true) {
    const Deadline slice_end = std::min(deadline, Clock::now() + kMemberCheckSlice);
    try {
      return attempt(slice_end);
    } catch (const CommTimeoutError&) {
      if (slice_end >= deadline) throw;
    }
    try {
      check_members(what);
    } catch (const CommError&) {
      if (last_look == LastLook::kYes) {
        try {
          return attempt(Clock::now());  // no wait: only what is already there
        } catch (const CommTimeoutError&) {
        }
      }
      throw;  // the member's failure
    }
  }
}

}  // namespace ringtrain::comm
