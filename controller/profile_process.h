// "auto" plans profile the model at the client's batch: seconds of compute and hundreds of MiB
// that pswitchd must not spend in its own process (a batch-64 registration once took 26 s and
// +522 MiB of pswitchd's memory). ProfileInChild runs the profile in a pswitch-worker child
// (`--profile-model`), bounded in time and resident memory, and reads its profile JSON back as
// untrusted input.
#ifndef PSWITCH_CONTROLLER_PROFILE_PROCESS_H_
#define PSWITCH_CONTROLLER_PROFILE_PROCESS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grouping/profile.h"

namespace pswitch::controller {

struct ProfileChildOptions {
  std::string binary;                   // pswitch-worker
  std::string device = "cpu";           // "cpu" or "cuda:N"
  double bandwidth_bytes_per_s = 12e9;  // the link the plan is made for
  // The child's resident memory, sampled every 50 ms: beyond it, it is killed.
  uint64_t memory_bytes = 4ull << 30;
  absl::Duration timeout = absl::Minutes(2);
};

// The per-layer profile of zoo model `zoo` at `batch`, or with `archive_fd` >= 0 of the script
// model in that sealed memory file (the child inherits it). ResourceExhausted past the memory
// bound, DeadlineExceeded past the timeout, Internal if the child fails otherwise (its stderr goes
// to pswitchd's log).
absl::StatusOr<grouping::Profile> ProfileInChild(const ProfileChildOptions& options,
                                                 const std::string& zoo, uint32_t batch,
                                                 int archive_fd = -1);

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_PROFILE_PROCESS_H_
