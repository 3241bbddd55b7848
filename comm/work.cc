#include "comm/work.h"

namespace ringtrain::comm {

void WorkState::mark_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  completed_ = true;
  completed_at_ = Clock::now();
  done_.notify_all();
}

void WorkState::mark_failed(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  error_ = std::move(error);
  completed_ = true;
  completed_at_ = Clock::now();
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
