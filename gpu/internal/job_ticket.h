// The CopyTicket both backends hand out: completion state shared by a copy thread (producer)
// and any number of waiters.
#ifndef PSWITCH_GPU_INTERNAL_JOB_TICKET_H_
#define PSWITCH_GPU_INTERNAL_JOB_TICKET_H_

#include <atomic>
#include <functional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gpu/copy_engine.h"

namespace pswitch::gpu::internal {

// Thread-safe.
class JobTicket : public CopyTicket {
 public:
  JobTicket(size_t groups, std::function<void()> on_finished,
            std::function<void(const absl::Status&)> on_stalled = nullptr)
      : timings_(groups),
        on_finished_(std::move(on_finished)),
        on_stalled_(std::move(on_stalled)) {}

  void Cancel() override { cancelled_.store(true, std::memory_order_relaxed); }
  absl::StatusOr<std::vector<GroupTiming>> Wait(absl::Duration timeout) override;
  bool finished() const override;
  bool stalled() const override { return stalled_.load(std::memory_order_acquire); }
  size_t groups_done() const override { return groups_done_.load(std::memory_order_acquire); }

  // Producer side.
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  void RecordGroup(size_t group, const GroupTiming& timing);
  // The job failed with `status` but work of it may still be on the device: runs on_stalled,
  // once. Finish follows when that work has run.
  void Stall(const absl::Status& status);
  // Marks the job finished with `status` (OK = all groups published), then runs on_finished.
  void Finish(absl::Status status);

 private:
  std::atomic<bool> cancelled_{false};
  std::atomic<size_t> groups_done_{0};
  std::atomic<bool> stalled_{false};
  mutable absl::Mutex mu_;
  std::vector<GroupTiming> timings_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_finished_;  // producer thread only
  std::function<void(const absl::Status&)> on_stalled_;  // likewise
};

}  // namespace pswitch::gpu::internal

#endif  // PSWITCH_GPU_INTERNAL_JOB_TICKET_H_
