#include "controller/training_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::controller {

absl::Status SaveKeptState(memdaemon::MemDaemon& daemon, StateCheckpoints& checkpoints,
                           CheckpointKey key, memdaemon::StateArea::Room room, uint64_t bytes) {
  absl::StatusOr<std::unique_ptr<memdaemon::StateArea>> area =
      memdaemon::StateArea::InPlace(daemon, room, bytes);
  absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> saved =
      area.ok() ? (*area)->Save() : area.status();
  if (!saved.ok()) {
    // Lost to its task whatever the cause: it must not resume from zeros.
    return absl::DataLossError(absl::StrCat(
        "its optimizer state, kept on the GPU while it was preempted, could not be saved to host "
        "memory when the GPU needed the room: ",
        saved.status().message()));
  }
  checkpoints.Put(key, std::move(*saved));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TrainingState>> TrainingState::Begin(
    memdaemon::MemDaemon* daemon, StateCheckpoints* checkpoints, uint64_t task, CheckpointKey key,
    uint64_t optimizer_bytes, memdaemon::StateArea::Room room, bool resident) {
  std::unique_ptr<memdaemon::StateArea> area;
  if (optimizer_bytes > 0) {
    absl::StatusOr<std::unique_ptr<memdaemon::StateArea>> placed =
        resident
            ? memdaemon::StateArea::InPlace(*daemon, room, optimizer_bytes)
            : memdaemon::StateArea::Fill(*daemon, room, optimizer_bytes, checkpoints->Take(key));
    if (!placed.ok()) {
      return absl::Status(placed.status().code(),
                          absl::StrCat("task ", task, ": ", placed.status().message()));
    }
    area = std::move(*placed);
  }
  const bool restored_resident = resident && area != nullptr;
  return std::unique_ptr<TrainingState>(
      new TrainingState(daemon, checkpoints, key, std::move(area), restored_resident));
}

absl::Status TrainingState::End(const Ending& ending, bool& optimizer_kept) {
  optimizer_kept = false;
  if (!ending.run_ok) {
    // The region may hold a half-done step or partly copied weights: nothing of it is saved.
    (void)EndOptimizer(/*keep=*/false, /*in_place=*/false);
    return absl::OkStatus();
  }
  if (ending.trained && !ending.weights_stay_resident) {
    if (ending.model == nullptr) {
      (void)EndOptimizer(/*keep=*/false, /*in_place=*/false);
      return absl::InternalError("training state without its model");
    }
    if (ending.transmission != nullptr) {
      // The worker checked every group it used, so the copy has ended or is about to: this
      // only waits for the copy engine to have seen it. A copy that failed or never ended
      // left bytes of another model in the region.
      absl::Status copied = ending.transmission->Wait(ending.copy_timeout).status();
      if (!copied.ok()) {
        (void)EndOptimizer(/*keep=*/false, /*in_place=*/false);
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
      (void)EndOptimizer(/*keep=*/false, /*in_place=*/false);
      return saved;
    }
  }
  PSWITCH_RETURN_IF_ERROR(EndOptimizer(ending.keep_optimizer, ending.state_stays_resident));
  optimizer_kept = ending.keep_optimizer;
  return absl::OkStatus();
}

absl::Status TrainingState::SaveWeights(uint64_t region_offset,
                                        const memdaemon::StoredModel& model) {
  return daemon_->CheckpointWeights(region_offset, model);
}

absl::Status TrainingState::EndOptimizer(bool keep, bool in_place) {
  std::unique_ptr<memdaemon::StateArea> area = std::move(area_);
  if (area == nullptr || !keep || in_place) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> saved = area->Save();
  if (!saved.ok()) return saved.status();
  checkpoints_->Put(key_, std::move(*saved));
  return absl::OkStatus();
}

}  // namespace pswitch::controller
