#include "worker/fill_steps.h"

#include <algorithm>

#include "base/clock.h"
#include "base/status.h"
#include "gpu/copy_engine.h"
#include "worker/iterative_task.h"

namespace pswitch::worker {

int64_t FillCutAtNs(const proto::FillRun& fill) {
  if (fill.test_only_ignore_pause()) return 0;
  return fill.bubble_end_ns() - fill.margin_ns() / 2;
}

absl::StatusOr<std::unique_ptr<FillSteps>> FillSteps::Create(const proto::FillRun& fill,
                                                             const std::atomic<bool>* stop,
                                                             absl::Duration measured) {
  if (fill.step_ns() <= 0 || fill.margin_ns() < 0) {
    return absl::InvalidArgumentError("fill run needs a positive step duration and margin >= 0");
  }
  PSWITCH_ASSIGN_OR_RETURN(
      fill::StepProfile profile,
      fill::StepProfile::Create(std::max(absl::Nanoseconds(fill.step_ns()), measured)));
  std::unique_ptr<FillSteps> steps(new FillSteps(std::move(profile), fill, stop));
  if (fill.device_lock_path() != nullptr && fill.device_lock_path()->size() > 0) {
    PSWITCH_ASSIGN_OR_RETURN(gpu::ComputeLock lock,
                             gpu::ComputeLock::Open(fill.device_lock_path()->str()));
    steps->lock_.emplace(std::move(lock));
  }
  return steps;
}

bool FillSteps::MayStart() const {
  if (ignore_pause_) return true;
  if (stop_->load()) return false;
  absl::Duration remaining = absl::Nanoseconds(bubble_end_ns_ - base::MonotonicNowNs());
  return fill::MayStartStep(remaining, profile_.Predicted(), margin_);
}

absl::StatusOr<bool> FillSteps::Run(const std::function<absl::Status()>& step) {
  std::optional<gpu::ComputeLock::Hold> hold;
  if (lock_) {
    // Waiting for the device is not part of the step; but the wait may have used up the
    // bubble, so the step must still fit once the device is ours.
    hold.emplace(lock_->Acquire());
    if (!MayStart()) return false;
  }
  const int64_t start = base::MonotonicNowNs();
  absl::Status status = step();
  const int64_t took = base::MonotonicNowNs() - start;
  hold.reset();
  if (IsStepCut(status)) {
    // Cut by a Stop (a preemption, the pause), it says nothing of how long a step takes; cut at
    // the bubble's end, it overran its prediction by at least this much, and the steps after it
    // must not be predicted as short again.
    if (cut_at_ns_ != 0 && base::MonotonicNowNs() >= cut_at_ns_) {
      overran_ = true;
      (void)profile_.Record(absl::Nanoseconds(took));
    }
    return status;
  }
  step_ns_ += took;
  ++steps_;
  (void)profile_.Record(absl::Nanoseconds(took));
  PSWITCH_RETURN_IF_ERROR(status);
  return true;
}

}  // namespace pswitch::worker
