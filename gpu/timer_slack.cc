#include "gpu/timer_slack.h"

#include <sys/prctl.h>

#include "base/status.h"

namespace pswitch::gpu {

absl::Status SetThreadTimerSlackNs(uint64_t slack_ns) {
  if (slack_ns == 0) {
    return absl::InvalidArgumentError("timer slack 0 would restore the default, not set it");
  }
  if (::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack_ns), 0, 0, 0) != 0) {
    return ErrnoStatus("prctl(PR_SET_TIMERSLACK)");
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ThreadTimerSlackNs() {
  const int slack = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  if (slack < 0) return ErrnoStatus("prctl(PR_GET_TIMERSLACK)");
  return static_cast<uint64_t>(slack);
}

}  // namespace pswitch::gpu
