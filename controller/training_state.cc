#include "controller/training_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::controller {

void ResidentStates::Keep(CheckpointKey key, std::unique_ptr<memdaemon::StateArea> area) {
  if (area == nullptr) return;
  lost_.erase(key);
  kept_bytes_ += area->bytes();
  kept_.push_back(Kept{key, std::move(area)});
  while (kept_bytes_ > budget_bytes_ && MakeRoom()) {
  }
}

absl::StatusOr<std::unique_ptr<memdaemon::StateArea>> ResidentStates::Take(CheckpointKey key) {
  if (auto lost = lost_.find(key); lost != lost_.end()) return lost->second;
  auto it = std::find_if(kept_.begin(), kept_.end(), [&](const Kept& k) { return k.key == key; });
  if (it == kept_.end()) return nullptr;
  std::unique_ptr<memdaemon::StateArea> area = std::move(it->area);
  kept_bytes_ -= area->bytes();
  kept_.erase(it);
  return area;
}

void ResidentStates::Drop(CheckpointKey key) {
  lost_.erase(key);
  (void)Take(key);  // its lease goes with it
  // A spill queued on this thread before the drop may have put it in host memory since the
  // task's own drop there.
  checkpoints_->Drop(key);
}

bool ResidentStates::MakeRoom() {
  if (kept_.empty()) return false;
  Kept oldest = std::move(kept_.front());
  kept_.erase(kept_.begin());
  kept_bytes_ -= oldest.area->bytes();
  absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> saved = oldest.area->SaveAndRelease();
  if (saved.ok()) {
    checkpoints_->Put(oldest.key, std::move(*saved));
  } else {
    // Its task must not resume from zeros: Take reports the loss.
    lost_[oldest.key] = absl::DataLossError(absl::StrCat(
        "its optimizer state, kept in the arena while it was preempted, could not be saved to "
        "host memory when the arena needed the room: ",
        saved.status().message()));
  }
  return true;
}

absl::StatusOr<std::unique_ptr<TrainingState>> TrainingState::Begin(
    memdaemon::MemDaemon* daemon, StateCheckpoints* checkpoints, uint64_t task, CheckpointKey key,
    uint64_t optimizer_bytes, ResidentStates* resident) {
  std::unique_ptr<memdaemon::StateArea> area;
  bool restored_resident = false;
  if (optimizer_bytes > 0 && resident != nullptr) {
    PSWITCH_ASSIGN_OR_RETURN(area, resident->Take(key));
    if (area != nullptr && (area->bytes() != optimizer_bytes || area->daemon() != daemon)) {
      return absl::InternalError(absl::StrCat("task ", task, ": its kept optimizer state has ",
                                              area->bytes(), " bytes, not ", optimizer_bytes));
    }
    restored_resident = area != nullptr;
  }
  if (optimizer_bytes > 0 && area == nullptr) {
    std::function<bool()> make_room;
    if (resident != nullptr) {
      // Kept areas and this one stay within the optimizer room together, whatever else is free.
      while (resident->kept_bytes() + optimizer_bytes > resident->budget_bytes() &&
             resident->MakeRoom()) {
      }
      make_room = [resident] { return resident->MakeRoom(); };
    }
    absl::StatusOr<std::unique_ptr<memdaemon::StateArea>> acquired =
        memdaemon::StateArea::Acquire(*daemon, absl::StrCat("task-", task, "-optimizer"),
                                      optimizer_bytes, checkpoints->Take(key), make_room);
    if (!acquired.ok()) return acquired.status();
    area = std::move(*acquired);
  }
  return std::unique_ptr<TrainingState>(
      new TrainingState(daemon, checkpoints, resident, key, std::move(area), restored_resident));
}

absl::Status TrainingState::End(const Ending& ending, bool& optimizer_kept) {
  optimizer_kept = false;
  if (!ending.run_ok) {
    // The region may hold a half-done step or partly copied weights: nothing of it is saved.
    (void)EndOptimizer(/*keep=*/false);
    return absl::OkStatus();
  }
  if (ending.trained && !ending.weights_stay_resident) {
    if (ending.model == nullptr) {
      (void)EndOptimizer(/*keep=*/false);
      return absl::InternalError("training state without its model");
    }
    if (ending.transmission != nullptr) {
      // The worker checked every group it used, so the copy has ended or is about to: this
      // only waits for the copy engine to have seen it. A copy that failed or never ended
      // left bytes of another model in the region.
      absl::Status copied = ending.transmission->Wait(ending.copy_timeout).status();
      if (!copied.ok()) {
        (void)EndOptimizer(/*keep=*/false);
        return absl::Status(copied.code(),
                            absl::StrCat("weights not saved: the transmission that brought them "
                                         "did not complete (",
                                         copied.message(), ")"));
      }
    }
    absl::Status saved =
        daemon_->CheckpointWeights(ending.region_offset, *ending.model, &saved_generation_);
    if (!saved.ok()) saved_generation_ = 0;
    if (!saved.ok()) {
      (void)EndOptimizer(/*keep=*/false);
      return saved;
    }
  }
  PSWITCH_RETURN_IF_ERROR(EndOptimizer(ending.keep_optimizer));
  optimizer_kept = ending.keep_optimizer;
  return absl::OkStatus();
}

absl::Status TrainingState::SaveWeights(uint64_t region_offset,
                                        const memdaemon::StoredModel& model) {
  return daemon_->CheckpointWeights(region_offset, model);
}

absl::Status TrainingState::EndOptimizer(bool keep) {
  std::unique_ptr<memdaemon::StateArea> area = std::move(area_);
  if (area == nullptr || !keep) return absl::OkStatus();  // dropped: its lease goes with it
  // A task resumes on this GPU (a fill job's next bubble may be on another): kept as it is.
  if (resident_ != nullptr && key_.owner == CheckpointKey::Owner::kTask) {
    resident_->Keep(key_, std::move(area));
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> saved = area->SaveAndRelease();
  if (!saved.ok()) return saved.status();
  checkpoints_->Put(key_, std::move(*saved));
  return absl::OkStatus();
}

}  // namespace pswitch::controller
