#include "comm/work.h"

#include <thread>

namespace ringtrain::comm {

void WorkState::mark_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  completed_ = true;
  completed_at_ = Clock::now();
  completed_flag_.store(true, std::memory_order_release);
  done_.notify_all();
}

void WorkState::mark_failed(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  error_ = std::move(error);
  completed_ = true;
  completed_at_ = Clock::now();
  completed_flag_.store(true, std::memory_order_release);
  done_.notify_all();
}

bool WorkState::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

Clock::time_point WorkState::completed_at() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_at_;
}

bool WorkState::wait_for(std::chrono::milliseconds timeout) const {
  // Spin a little first: a collective that finishes within microseconds is
  // common (small buffers, the last bucket), and sleeping on the condition
  // variable adds a futex wake-up and a context switch, about 5-10 us on this VM
  // (the 32 KiB -> 64 KiB step in docs/collective-benchmark.md).
  const auto spin_until = Clock::now() + kSpinBeforeBlocking;
  while (!completed_flag_.load(std::memory_order_acquire) && Clock::now() < spin_until) {
    std::this_thread::yield();  // on a full machine the comm thread needs this core
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == Work::kWaitForever) {
    done_.wait(lock, [&] { return completed_; });
  } else if (!done_.wait_for(lock, timeout, [&] { return completed_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::is_completed() const { return !state_ || state_->is_completed(); }

Clock::time_point Work::completed_at() const { return state_ ? state_->completed_at() : Clock::time_point{}; }

void Work::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return;
  if (!state_->wait_for(timeout)) {
    throw CommTimeoutError(detail::concat("Work::wait: ", state_->description(),
                                          " did not complete within ", timeout.count(), " ms"));
  }
}

std::string Work::description() const { return state_ ? state_->description() : "(no-op)"; }

}  // namespace ringtrain::comm
