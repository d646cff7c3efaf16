// Pipelined transmission: streams a stored model into its arena region group by group and
// publishes each group's ready flag with the transmission's epoch.
//
// Epochs and supersession. Each transmission takes two epoch values, E (odd: "group ready")
// and E + 1 ("retired"). A transmission that is cancelled, superseded by a newer one, or fails
// writes E + 1 into the flags of the groups it never published, so every waiter on E is
// released (and told it was superseded) instead of hanging, while waiters on the next
// transmission's epoch E + 2 are not released by it. This is also how a GPU-side wait
// (cuStreamWaitValue32, which the CPU cannot interrupt) is always unblocked.
//
// Retiring waits for the device. A copy that failed with work still queued on the device (a
// copy stream stuck behind a drain flag no one writes) is *stalled*, not finished: its queued
// copies still read the pinned store and its queued flag writes still write E. Its flags are
// retired to E + 1 only once the copy engine reports it finished, after that work has run (or
// the device was declared lost), so a late write of E never lands on top of E + 1; and the
// model's pinned store must not be freed before then either (Transmission::finished()).
#ifndef PSWITCH_MEMDAEMON_TRANSMITTER_H_
#define PSWITCH_MEMDAEMON_TRANSMITTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/copy_engine.h"
#include "grouping/plan.h"
#include "memdaemon/weight_store.h"

namespace pswitch::memdaemon {

struct DrainCondition {
  uint32_t index = 0;  // drain flag of the previous tenant
  uint32_t value = 0;  // value it writes once nothing of it is in flight
  absl::Duration timeout = absl::Seconds(10);
};

struct TransmitRequest {
  const StoredModel* model = nullptr;
  grouping::GroupPlan groups;   // validated against the model's layers by Start
  uint64_t weights_offset = 0;  // arena offset of the model's region (from a lease)
  uint32_t flag_base = 0;       // group g publishes to ready flag flag_base + g
  // Where set, the bytes come from a complete copy of the model's region at this arena offset
  // (a move on the device, WeightsCache::PlanMove) rather than from the pinned store. The two
  // ranges must not overlap; nothing may write the source before the copy has read it (a later
  // copy on the same engine runs after this one).
  std::optional<uint64_t> source_offset;
  std::optional<DrainCondition> drain;
  // Runs once on the copy thread when the copy ended, however (CopyJob::on_finished); the
  // Transmission's Wait then returns at once.
  std::function<void()> on_finished;
  // Runs once on the copy thread when the copy failed while work of it is still queued on the
  // device (CopyJob::on_stalled): the owner must release what that work waits for (kill the
  // tenant that never drained). on_finished follows once the work has run.
  std::function<void(const absl::Status&)> on_stalled;
};

struct GroupTrace {
  uint32_t group = 0;
  grouping::LayerGroup layers;
  uint64_t bytes = 0;
  int64_t copy_start_ns = 0;  // CLOCK_MONOTONIC
  int64_t ready_ns = 0;
};

// One transmission in flight. Thread-safe.
class Transmission {
 public:
  Transmission(uint32_t epoch, TransmitRequest request, std::shared_ptr<gpu::CopyTicket> ticket,
               gpu::FlagArray* ready_flags)
      : epoch_(epoch),
        request_(std::move(request)),
        ticket_(std::move(ticket)),
        ready_flags_(ready_flags) {}

  uint32_t epoch() const { return epoch_; }
  const TransmitRequest& request() const { return request_; }
  // Waits up to `timeout`. On success, per-group traces; otherwise the failure (Cancelled when
  // cancelled or superseded), after the unpublished groups were retired; DeadlineExceeded with
  // finished() false when the copy is still running or stalled (nothing retired yet: the device
  // may still write this epoch).
  absl::StatusOr<std::vector<GroupTrace>> Wait(absl::Duration timeout);
  // Asks the copy to stop within about one look-ahead window; returns at once. The unpublished
  // groups are retired by the Wait that sees the job end.
  void Cancel() { ticket_->Cancel(); }
  // True once the device is done with the copy: its pinned sources may be freed.
  bool finished() const { return ticket_->finished(); }
  // True once the copy failed with work still queued on the device (see the file comment).
  bool stalled() const { return ticket_->stalled(); }
  size_t groups_done() const { return ticket_->groups_done(); }

 private:
  const uint32_t epoch_;
  const TransmitRequest request_;
  const std::shared_ptr<gpu::CopyTicket> ticket_;
  gpu::FlagArray* const ready_flags_;
  absl::Mutex mu_;
  bool retired_ ABSL_GUARDED_BY(mu_) = false;
};

// Thread-safe. The engine and flag arrays are borrowed and must outlive the transmitter and
// every Transmission it returned.
class Transmitter {
 public:
  // `arena_base`: the arena as this process maps it (a device pointer on CUDA), the source of
  // moves (TransmitRequest::source_offset); null: no moves.
  Transmitter(gpu::CopyEngine* engine, gpu::FlagArray* ready_flags, gpu::FlagArray* drain_flags,
              uint64_t arena_bytes, const std::byte* arena_base = nullptr)
      : engine_(engine),
        ready_flags_(ready_flags),
        drain_flags_(drain_flags),
        arena_bytes_(arena_bytes),
        arena_base_(arena_base) {}

  // Validates the plan and region, supersedes (cancels, without waiting) the previous
  // transmission if it is still running into an overlapping region, and queues the copy behind
  // it. InvalidArgument /
  // OutOfRange for a bad request. Never blocks on the copy engine.
  absl::StatusOr<std::shared_ptr<Transmission>> Start(TransmitRequest request);

 private:
  gpu::CopyEngine* const engine_;
  gpu::FlagArray* const ready_flags_;
  gpu::FlagArray* const drain_flags_;
  const uint64_t arena_bytes_;
  const std::byte* const arena_base_;

  absl::Mutex mu_;
  uint32_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
  std::shared_ptr<Transmission> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_TRANSMITTER_H_
