// A registration's one look at a model, in a pswitch-worker child bounded in time and resident
// memory, whose output is read back as untrusted input (`--inspect-name`):
// - the child builds the model (a zoo architecture with seeded random weights, or a
//   pswitch.export archive: hostile input to libtorch's loader, which is not hardened against
//   it), applies the weights checkpoint, and reports its facts (models/model_facts.h: layers in
//   layout order with their weights, input and output, optimizer slots, whether it trains);
// - for an "auto" plan it also profiles the model at the registered batch, in the same process
//   and on the workers' device: seconds of compute and hundreds of MiB that pswitchd must not
//   spend in its own process (a batch-64 profile once took 26 s and +522 MiB of pswitchd's).
// pswitchd never builds a model to register it. Every registration is held to the child's
// bounds (--profile-memory-bytes, --profile-timeout-s), whatever its plan.
#ifndef PSWITCH_REGISTRY_INSPECTION_CHILD_H_
#define PSWITCH_REGISTRY_INSPECTION_CHILD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "models/model_facts.h"

namespace pswitch::registry {

using models::AutoPlanProfile;

struct InspectionChildOptions {
  std::string binary;                   // pswitch-worker
  models::AutoPlanProfile auto_plan;    // where and for which link profiles are measured
  // The child's resident memory, sampled every 10 ms: beyond it, it is killed. An inspection
  // may use this plus four times the archive's size (the archive, the model, the weights'
  // copies and their encoding) and the checkpoint's.
  uint64_t memory_bytes = 4ull << 30;
  absl::Duration timeout = absl::Minutes(2);
  // Its compute libraries' threads (base::CpuThreadsEnv), the workers' count so its profile
  // measures what they will do; 0: all cores.
  int cpu_threads = 0;
};

using models::InspectionRequest;

// The model's facts. The child's refusal as it reports it (InvalidArgument naming the layer or
// parameter, NotFound for an unknown zoo model, FailedPrecondition, ...); ResourceExhausted past
// the memory bound or for facts over `max_facts_bytes`; DeadlineExceeded past the timeout;
// InvalidArgument for an archive that crashed the inspector or facts that are malformed;
// Internal for a zoo model's build that crashed it.
absl::StatusOr<models::ModelFacts> InspectInChild(const InspectionChildOptions& options,
                                                  const InspectionRequest& request);

}  // namespace pswitch::registry

#endif  // PSWITCH_REGISTRY_INSPECTION_CHILD_H_
