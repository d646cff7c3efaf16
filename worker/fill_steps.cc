#include "worker/fill_steps.h"

#include <algorithm>

#include "base/clock.h"
#include "base/status.h"
#include "gpu/copy_engine.h"
#include "worker/iterative_task.h"

namespace pswitch::worker {
namespace {

// A resident run waiting between bubbles looks at its Stop flag this often: a Stop also rings the
// bell (pswitchd's scheduler stops the word too), so this only bounds a lost wake.
constexpr absl::Duration kBellPoll = absl::Milliseconds(10);

}  // namespace

int64_t FillCutAtNs(const proto::FillRun& fill) {
  if (fill.test_only_ignore_pause()) return 0;
  return fill.bubble_end_ns() - fill.margin_ns() / 2;
}

absl::StatusOr<std::unique_ptr<FillSteps>> FillSteps::Create(const proto::FillRun& fill,
                                                             const std::atomic<bool>* stop,
                                                             absl::Duration measured,
                                                             fill::BellLayout* bell) {
  if (fill.step_ns() <= 0 || fill.margin_ns() < 0) {
    return absl::InvalidArgumentError("fill run needs a positive step duration and margin >= 0");
  }
  PSWITCH_ASSIGN_OR_RETURN(
      fill::StepProfile profile,
      fill::StepProfile::Create(std::max(absl::Nanoseconds(fill.step_ns()), measured)));
  std::unique_ptr<FillSteps> steps(new FillSteps(std::move(profile), fill, stop, bell));
  if (fill.device_lock_path() != nullptr && fill.device_lock_path()->size() > 0) {
    PSWITCH_ASSIGN_OR_RETURN(gpu::ComputeLock lock,
                             gpu::ComputeLock::Open(fill.device_lock_path()->str()));
    steps->lock_.emplace(std::move(lock));
  }
  if (bell != nullptr) steps->Publish(/*stepping=*/false, base::MonotonicNowNs());
  return steps;
}

bool FillSteps::stopping() const {
  return stop_->load() || (bell_ != nullptr && bell_->stop.load() != 0);
}

const std::atomic<int64_t>* FillSteps::cut_at() const {
  if (ignore_pause_) return nullptr;
  return bell_ != nullptr ? &bell_->cut_at_ns : &own_cut_at_ns_;
}

bool FillSteps::HasRoom() const {
  if (ignore_pause_) return true;
  if (stopping()) return false;
  const int64_t end = bell_ != nullptr ? bell_->bubble_end_ns.load() : bubble_end_ns_;
  // A splittable step needs room for one of its rows, a suspendable one for one of its parts.
  const absl::Duration need = split_rows_ > 0 ? profile_.Predicted() / split_rows_
                              : suspend_      ? profile_.Predicted() / fill::kSuspendParts
                                              : profile_.Predicted();
  return fill::MayStartStep(absl::Nanoseconds(end - base::MonotonicNowNs()), need, margin_);
}

void FillSteps::PartDone() {
  if (bell_ != nullptr) bell_->parts.store(++parts_);
}

void FillSteps::SetSuspendable(std::function<void()> drain) {
  if (bell_ == nullptr || ignore_pause_) return;  // a run of one bubble has no next one
  drain_ = std::move(drain);
  suspend_ = [this] { return Suspend(); };
}

bool FillSteps::Suspend() {
  // Whatever the step queued runs inside the bubble's margin (the point is at its cut, half the
  // margin before its end), then the device is the main job's.
  if (drain_) drain_();
  const int64_t paused_at = base::MonotonicNowNs();
  active_ns_ += paused_at - part_start_ns_;
  part_start_ns_ = -1;
  suspended_in_step_ = true;
  hold_.reset();
  PartDone();
  Publish(/*stepping=*/false, paused_at);
  while (true) {
    if (!MayStart()) return false;  // the bell's wait for a bubble with room; false: stopping
    if (!lock_) break;
    hold_.emplace(lock_->Acquire());
    if (HasRoom()) break;  // waiting for the device may have used the bubble up
    hold_.reset();
  }
  part_start_ns_ = base::MonotonicNowNs();
  Publish(/*stepping=*/true, part_start_ns_);
  return true;
}

void FillSteps::SetSplittable(int64_t rows_per_step) {
  split_rows_ = std::max<int64_t>(rows_per_step, 1);
}

int64_t FillSteps::RowsThatFit() const {
  if (split_rows_ <= 0) return 0;
  if (ignore_pause_) return split_rows_;
  if (stopping()) return 0;
  const int64_t end = bell_ != nullptr ? bell_->bubble_end_ns.load() : bubble_end_ns_;
  const absl::Duration left = absl::Nanoseconds(end - base::MonotonicNowNs()) - margin_;
  const absl::Duration per_row = profile_.Predicted() / split_rows_;
  // As MayStartStep: strictly more than the rows' predicted time left.
  if (left <= absl::ZeroDuration() || left <= per_row) return 0;
  if (per_row <= absl::ZeroDuration()) return split_rows_;
  const double fit = absl::FDivDuration(left, per_row);
  return fit >= static_cast<double>(split_rows_) ? split_rows_ : static_cast<int64_t>(fit);
}

bool FillSteps::MayStart() {
  if (bell_ == nullptr || ignore_pause_) return HasRoom();
  while (true) {
    // Read before the check: a bubble opened after the check changes it, and the wait returns.
    const uint32_t seen = bell_->seq.load();
    if (stopping()) return false;
    if (HasRoom()) return true;
    fill::BellWait(*bell_, seen, kBellPoll);
  }
}

void FillSteps::Publish(bool stepping, int64_t now_ns) {
  if (stepping) {
    bell_->last_step_start_ns.store(now_ns);
    bell_->stepping.store(1);
    return;
  }
  bell_->steps.store(static_cast<uint64_t>(steps_));
  bell_->step_ns.store(step_ns_);
  bell_->overruns.store(overruns_);
  bell_->overrun_ns.store(overrun_ns_);
  bell_->idle_since_ns.store(now_ns);
  bell_->stepping.store(0);
}

absl::StatusOr<bool> FillSteps::Run(uint32_t index, const std::function<absl::Status()>& step) {
  // The device is held for the step (host backend), but not through a suspension (Suspend).
  struct Release {
    std::optional<gpu::ComputeLock::Hold>& hold;
    ~Release() { hold.reset(); }
  } release{hold_};
  if (lock_) {
    // Waiting for the device is not part of the step; but the wait may have used up the
    // bubble, so the step must still fit once the device is ours.
    hold_.emplace(lock_->Acquire());
    if (!HasRoom()) return false;
  }
  const int64_t start = base::MonotonicNowNs();
  // Descheduled between the room check and here past the bubble's cut (it ended early): the step
  // would be cut at once; it does not begin.
  if (bell_ != nullptr && !ignore_pause_ && start >= bell_->cut_at_ns.load()) return false;
  active_ns_ = 0;
  part_start_ns_ = start;
  suspended_in_step_ = false;
  if (bell_ != nullptr) {
    // Begun with no bubble open: only a task that ignores the bell does (a room check passed for
    // every other step); pswitchd kills a run for it.
    if (ignore_pause_ && start >= bell_->bubble_end_ns.load()) {
      bell_->late_starts.store(++late_starts_);
    }
    Publish(/*stepping=*/true, start);
  }
  absl::Status status = step();
  const int64_t end = base::MonotonicNowNs();
  // Its computing time: a suspended step's parts, not its waits between bubbles.
  const int64_t took = active_ns_ + (part_start_ns_ >= 0 ? end - part_start_ns_ : 0);
  part_start_ns_ = -1;
  hold_.reset();
  if (IsStepCut(status)) {
    // Cut by a Stop (a preemption, the pause), it says nothing of how long a step takes; cut at
    // the bubble's end, it overran its prediction by at least this much, and the steps after it
    // must not be predicted as short again.
    // A split step keeps the parts it finished: their time is the step's when it is done (a part
    // cut here is done again: its time too, a conservative estimate).
    if (split_rows_ > 0) partial_ns_ += took;
    // A step that was suspended waited at its bubbles' ends rather than overrun them: its cut
    // is a Stop's.
    const std::atomic<int64_t>* cut = cut_at();
    if (!suspended_in_step_ && cut != nullptr && end >= cut->load()) {
      // At least this long: the step so far, all its parts.
      const int64_t at_least = split_rows_ > 0 ? partial_ns_ : took;
      overran_ = true;
      ++overruns_;
      overrun_ns_ = at_least;
      (void)profile_.Record(absl::Nanoseconds(at_least));
    }
    if (bell_ != nullptr) Publish(/*stepping=*/false, end);
    return status;
  }
  if (status.ok()) {
    const int64_t step = took + partial_ns_;
    partial_ns_ = 0;
    step_ns_ += step;
    ++steps_;
    (void)profile_.Record(absl::Nanoseconds(step));
    if (bell_ != nullptr) bell_->iterations_done.store(uint64_t{index} + 1);
  }
  if (bell_ != nullptr) Publish(/*stepping=*/false, end);
  PSWITCH_RETURN_IF_ERROR(status);
  return true;
}

}  // namespace pswitch::worker
