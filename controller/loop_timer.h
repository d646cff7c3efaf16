// A deadline on an event loop, re-armed to whatever is due next: arming it for the time it is
// already armed for costs nothing, and InfiniteFuture disarms it. When it fires, `due` runs,
// then `after` (the owner's after-every-event step; may be empty). Loop thread only; destroy it
// only once the loop has ended (its handler holds `this`).
#ifndef PSWITCH_CONTROLLER_LOOP_TIMER_H_
#define PSWITCH_CONTROLLER_LOOP_TIMER_H_

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "asio/io_context.hpp"
#include "asio/steady_timer.hpp"

namespace pswitch::controller {

class LoopTimer {
 public:
  LoopTimer(asio::io_context& io, std::function<void()> due, std::function<void()> after = {})
      : timer_(io), due_(std::move(due)), after_(std::move(after)) {}
  LoopTimer(const LoopTimer&) = delete;
  LoopTimer& operator=(const LoopTimer&) = delete;

  void ArmAt(absl::Time deadline) {
    if (deadline == armed_) return;
    armed_ = deadline;
    timer_.cancel();
    if (deadline == absl::InfiniteFuture()) return;
    timer_.expires_after(
        absl::ToChronoNanoseconds(std::max(deadline - absl::Now(), absl::ZeroDuration())));
    timer_.async_wait([this](const asio::error_code& ec) {
      if (ec) return;  // re-armed, or the loop is shutting down
      armed_ = absl::InfiniteFuture();
      due_();
      if (after_) after_();
    });
  }
  bool armed() const { return armed_ != absl::InfiniteFuture(); }

 private:
  asio::steady_timer timer_;
  absl::Time armed_ = absl::InfiniteFuture();
  const std::function<void()> due_;
  const std::function<void()> after_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_LOOP_TIMER_H_
