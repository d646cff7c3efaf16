#include "controller/training_state.h"

#include "absl/strings/str_cat.h"

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
