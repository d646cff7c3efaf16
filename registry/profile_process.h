// Registration's heavy or risky work on a model, in a pswitch-worker child bounded in time and
// resident memory, whose output is read back as untrusted input:
// - "auto" plans profile the model at the client's batch: seconds of compute and hundreds of MiB
//   that pswitchd must not spend in its own process (a batch-64 registration once took 26 s and
//   +522 MiB of pswitchd's memory): ProfileInChild (`--profile-model`).
// - a pswitch.export archive is hostile input to libtorch's loader, which is not hardened against
//   it (a crafted archive can crash or hang it): InspectInChild (`--inspect-name`) loads and
//   checks it there, and pswitchd takes only the facts it needs (models/model_facts.h).
#ifndef PSWITCH_REGISTRY_PROFILE_PROCESS_H_
#define PSWITCH_REGISTRY_PROFILE_PROCESS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grouping/profile.h"
#include "models/model_facts.h"

namespace pswitch::registry {

struct ProfileChildOptions {
  std::string binary;                   // pswitch-worker
  std::string device = "cpu";           // "cpu" or "cuda:N"
  double bandwidth_bytes_per_s = 12e9;  // the link the plan is made for
  // The child's resident memory, sampled every 10 ms: beyond it, it is killed. An inspection
  // may use this plus four times the archive's size (the archive, the model, the weights'
  // copies and their encoding).
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

// The facts of the script model in sealed memory file `archive_fd`, registered as `name`, with
// the safetensors checkpoint in sealed memory file `weights_fd` (>= 0; `weights_name` names it in
// messages) applied. The archive's refusal as the child reports it (InvalidArgument naming the
// layer or parameter, FailedPrecondition, ...); ResourceExhausted past the memory bound or for
// facts over `max_facts_bytes`; DeadlineExceeded past the timeout; InvalidArgument for an archive
// that crashed the inspector or whose facts are malformed.
absl::StatusOr<models::ModelFacts> InspectInChild(const ProfileChildOptions& options,
                                                  const std::string& name, int archive_fd,
                                                  int weights_fd, const std::string& weights_name,
                                                  uint64_t max_facts_bytes);

}  // namespace pswitch::registry

#endif  // PSWITCH_REGISTRY_PROFILE_PROCESS_H_
