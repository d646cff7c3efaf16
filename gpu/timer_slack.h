// Linux lets a sleeping thread wake up to its "timer slack" late (50 us by default) so that
// timers can be batched. A thread that polls the device every few microseconds (the CUDA copy
// engine's observer) would then see each event up to 50 us late, and every group time it
// reports would be late by as much. Setting the calling thread's slack to 1 ns makes short
// sleeps short again.
#ifndef PSWITCH_GPU_TIMER_SLACK_H_
#define PSWITCH_GPU_TIMER_SLACK_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace pswitch::gpu {

// Sets the calling thread's timer slack to `slack_ns` (>= 1; PR_SET_TIMERSLACK). Affects only
// this thread. InvalidArgument for 0 (which would restore the process default instead).
absl::Status SetThreadTimerSlackNs(uint64_t slack_ns);
// The calling thread's timer slack in ns (PR_GET_TIMERSLACK).
absl::StatusOr<uint64_t> ThreadTimerSlackNs();

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_TIMER_SLACK_H_
