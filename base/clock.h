// The one clock for durations and cross-process timestamps: CLOCK_MONOTONIC, shared by every
// process on the node (workers, pswitchd, the main job), so their timestamps compare directly.
#ifndef PSWITCH_BASE_CLOCK_H_
#define PSWITCH_BASE_CLOCK_H_

#include <cstdint>

namespace pswitch::base {

int64_t MonotonicNowNs();

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_CLOCK_H_
