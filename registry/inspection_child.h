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
//
// An Inspector keeps one child started ahead (a standby): it has exec'd, loaded libtorch and
// created the profile device's context before a registration comes, and then inspects that one
// registration's model and exits. One process per registration still: nothing a model did in
// one inspection is there for the next. The next standby starts once an inspection ends. A
// child that ends before it took its request (its first progress report says it did) is the
// inspector's failure, never blamed on the model: the inspection is tried once more in a child
// started for it. A standby dies with the thread that started it (PR_SET_PDEATHSIG): call
// Inspect from a long-lived thread (pswitchd's registration thread), or lose the standby.
#ifndef PSWITCH_REGISTRY_INSPECTION_CHILD_H_
#define PSWITCH_REGISTRY_INSPECTION_CHILD_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/child_process.h"
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
  // Keep a standby child (pswitchd's --inspector-standby). Off: each inspection starts its own.
  bool standby = true;
};

using models::InspectionRequest;

// The model's facts. The child's refusal as it reports it (InvalidArgument naming the layer or
// parameter, NotFound for an unknown zoo model, FailedPrecondition, ...); ResourceExhausted past
// the memory bound or for facts over `max_facts_bytes`; DeadlineExceeded past the timeout;
// InvalidArgument for an archive that crashed the inspector or facts that are malformed;
// Internal for a zoo model's build that crashed it.
absl::StatusOr<models::ModelFacts> InspectInChild(const InspectionChildOptions& options,
                                                  const InspectionRequest& request);

// Inspections in children, one kept started ahead when options.standby. Thread-safe: concurrent
// registrations each get a child (one the standby, the others started for them).
class Inspector {
 public:
  explicit Inspector(InspectionChildOptions options);
  ~Inspector();  // the standby, if any, is killed and reaped
  Inspector(const Inspector&) = delete;
  Inspector& operator=(const Inspector&) = delete;

  // As InspectInChild. Bounds count from the request: a standby's idle time is not its own.
  absl::StatusOr<models::ModelFacts> Inspect(const InspectionRequest& request);
  // Inspections that found a standby ready (logs, tests).
  uint64_t standby_used() const;
  // The standby's pid; 0 when there is none (tests).
  pid_t standby_pid() const;

 private:
  struct Child;
  // One child's run of `request`: how it ended, and how many progress reports it sent (none: it
  // never took the request).
  struct Attempt {
    base::BoundedChildResult run;
    size_t reports = 0;
  };
  // Reports forwarded per inspection at most (a real one makes a few dozen).
  static constexpr size_t kMaxReports = 256;
  // An inspector child's nice value, above pswitchd's and its workers'.
  static constexpr int kInspectorNice = 10;

  // A child that prepares (libraries, the profile device's context) when it is a `standby`.
  absl::StatusOr<std::unique_ptr<Child>> StartChild(bool standby) const;
  // The standby if it is still alive, else a child started now.
  absl::StatusOr<std::unique_ptr<Child>> TakeChild();
  // Runs `request` in the standby (`standby`) or a child started for it.
  absl::StatusOr<Attempt> TryOnce(const InspectionRequest& request, base::BoundedChildSpec bounds,
                                  bool standby);
  void Replenish();

  const InspectionChildOptions options_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Child> standby_ ABSL_GUARDED_BY(mu_);
  uint64_t standby_used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pswitch::registry

#endif  // PSWITCH_REGISTRY_INSPECTION_CHILD_H_
