// work.h: the handle an asynchronous collective returns.
//
// defines: Work (wait with a timeout, is_completed, rethrows the failure),
//          WorkState (the shared state the comm thread completes).
//
// A collective is queued on its process group's comm thread and returns at
// once; the Work is how the caller meets the result later. wait() rethrows the
// exception the collective failed with (PeerLostError, CommTimeoutError,
// CommError with a peer's published message), so an error raised on the comm
// thread surfaces on the thread that asked for the work.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "comm/types.h"

namespace ringtrain::comm {

// Shared between the Work handles and the comm thread that runs the collective.
// How long a waiter (Work::wait, the idle comm thread) spins before it sleeps.
inline constexpr std::chrono::microseconds kSpinBeforeBlocking{50};

class WorkState {
 public:
  // describe() is called only when a description is needed (an error, a timeout):
  // formatting it for every collective would cost more than a small allreduce.
  explicit WorkState(std::function<std::string()> describe) : describe_(std::move(describe)) {}
  void mark_completed();
  void mark_failed(std::exception_ptr error);
  bool is_completed() const;
  // When the collective finished (steady clock); the epoch while it has not.
  Clock::time_point completed_at() const;
  // Waits; returns false when `timeout` elapsed first. Rethrows a failure.
  bool wait_for(std::chrono::milliseconds timeout) const;
  std::string description() const { return describe_(); }

 private:
  std::function<std::string()> describe_;  // -> "allreduce #12 (float32 x 1024, sum) on ring group rank 0/2"
  mutable std::mutex mutex_;
  mutable std::condition_variable done_;
  bool completed_ = false;
  std::atomic<bool> completed_flag_{false};  // completed_, readable without the mutex (spin)
  Clock::time_point completed_at_{};  // set with completed_ (for timelines)
  std::exception_ptr error_;  // set when the collective failed
};

class Work {
 public:
  static constexpr std::chrono::milliseconds kWaitForever = std::chrono::milliseconds::max();

  Work() = default;  // an empty handle: already completed (e.g. a no-op collective)
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
  // Copyable: every copy refers to the same collective.
  Work(const Work&) = default;
  Work& operator=(const Work&) = default;
  Work(Work&&) noexcept = default;
  Work& operator=(Work&&) noexcept = default;

  // True when finished, successfully or not (wait() then returns or throws at once).
  bool is_completed() const;
  // When it finished (steady clock), for timelines; the epoch while still running.
  Clock::time_point completed_at() const;
  // Blocks until done; rethrows the collective's failure. Throws CommTimeoutError
  // (the collective keeps running on the comm thread; its own timeout ends it) when
  // `timeout` passes first.
  void wait(std::chrono::milliseconds timeout = kWaitForever) const;
  std::string description() const;

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace ringtrain::comm
