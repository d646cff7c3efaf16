#include "controller/training_state.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::controller {

absl::StatusOr<std::unique_ptr<TrainingState>> TrainingState::Begin(
    memdaemon::MemDaemon* daemon, StateCheckpoints* checkpoints, uint64_t task, CheckpointKey key,
    uint64_t optimizer_bytes) {
  std::unique_ptr<memdaemon::StateArea> area;
  if (optimizer_bytes > 0) {
    absl::StatusOr<std::unique_ptr<memdaemon::StateArea>> acquired =
        memdaemon::StateArea::Acquire(*daemon, absl::StrCat("task-", task, "-optimizer"),
                                      optimizer_bytes, checkpoints->Take(key));
    if (!acquired.ok()) return acquired.status();
    area = std::move(*acquired);
  }
  return std::unique_ptr<TrainingState>(
      new TrainingState(daemon, checkpoints, key, std::move(area)));
}

absl::Status TrainingState::End(const Ending& ending, bool& optimizer_kept) {
  optimizer_kept = false;
  if (!ending.run_ok) {
    // The region may hold a half-done step or partly copied weights: nothing of it is saved.
    (void)EndOptimizer(/*keep=*/false);
    return absl::OkStatus();
  }
  if (ending.trained) {
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
  absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> saved = area->SaveAndRelease();
  if (!saved.ok()) return saved.status();
  checkpoints_->Put(key_, std::move(*saved));
  return absl::OkStatus();
}

}  // namespace pswitch::controller
