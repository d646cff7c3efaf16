// The host-to-device link as the switch sees it: pinned host memory copied into the arena by the
// memdaemon's own copy engine, timed by the engine's group timings (device events on CUDA). The
// grouping search plans with this figure, so it is measured once at start-up on the path the
// switch really uses instead of assumed.
#ifndef PSWITCH_MEMDAEMON_LINK_PROBE_H_
#define PSWITCH_MEMDAEMON_LINK_PROBE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "memdaemon/memdaemon.h"

namespace pswitch::memdaemon {

struct LinkProbeOptions {
  uint64_t bytes = 256ull << 20;
  int repeats = 3;
  absl::Duration timeout = absl::Seconds(30);  // per copy
};

// Median bytes/s of `repeats` single-group copies of `bytes`. Call before any switch has run:
// it borrows ready flag 0 and a lease, and leaves the flag at 0 and the lease released.
absl::StatusOr<double> MeasureLinkBandwidth(MemDaemon& daemon, const LinkProbeOptions& options);

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_LINK_PROBE_H_
