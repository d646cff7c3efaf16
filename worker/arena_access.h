// What of the shared arena a worker may touch (issue 29 item 2). Every worker maps the whole
// arena, since any region may hold the next model it runs; once restricted, its mapping grants
// nothing but the flag words (memdaemon::ArenaClient::RestrictToFlags), its activation lease
// (granted for its life), the region of the model it runs (read-only unless it trains) and a
// training run's optimizer state. A model that escaped its tensors then faults on another
// tenant's weights, inputs or lease instead of reading them.
//
// The model's grant stays until the worker is given another model (or the same one to train, or
// to infer after training): a grant costs about 8 us per MB on the host backend (an mprotect of
// pages populated at import; docs/performance.md, "Per-task arena access"), so it is made at
// Prepare, while the copy runs, and a run of the model the worker already holds costs none. Nothing
// else runs in the worker between its tasks, so at any task's run the worker reaches that task's
// model alone. Where the arena cannot restrict access (the CUDA arena until it maps with VMM) every
// grant is a no-op and enforced() says so. Not thread-safe: the worker's control thread owns it.
#ifndef PSWITCH_WORKER_ARENA_ACCESS_H_
#define PSWITCH_WORKER_ARENA_ACCESS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace pswitch::worker {

class ArenaAccess {
 public:
  // `arena` already restricted (enforced) or not; borrowed.
  ArenaAccess(gpu::Arena* arena, bool enforced) : arena_(arena), enforced_(enforced) {}
  ~ArenaAccess();
  ArenaAccess(const ArenaAccess&) = delete;
  ArenaAccess& operator=(const ArenaAccess&) = delete;

  bool enforced() const { return enforced_; }
  // For the worker's life.
  absl::Status GrantForever(uint64_t offset, uint64_t bytes);
  // The model region at `at` (a pointer into the arena's mapping), with `access`: the one
  // granted before goes unless it is this one.
  absl::Status GrantModel(const std::byte* at, uint64_t bytes, gpu::Arena::Access access);
  // Until EndTask: `bytes` at `at` (a training run's optimizer state).
  absl::Status GrantForTask(const std::byte* at, uint64_t bytes, gpu::Arena::Access access);
  // Takes back every task grant, and write access to the model; call once no work of the task
  // is in flight.
  absl::Status EndTask();
  // Takes back the model's grant too (its model was dropped).
  absl::Status EndModel();

 private:
  struct Range {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    gpu::Arena::Access access = gpu::Arena::Access::kNone;
  };
  absl::StatusOr<uint64_t> OffsetOf(const std::byte* at, uint64_t bytes) const;

  gpu::Arena* const arena_;
  const bool enforced_;
  Range model_;
  std::vector<Range> task_;
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_ARENA_ACCESS_H_
