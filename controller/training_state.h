// What a training run keeps outside its worker. Its optimizer state (SGD momentum, Adam moments)
// is an arena area while the run is on the GPU, filled from the task's host checkpoint, and goes
// back to a host checkpoint when the run is preempted, so the preempting model gets the memory.
// Its trained weights are copied from the region back to the model's pinned store whenever it
// stops. Both copies are the memdaemon's; this only decides when. Begin (a restore, for a run
// with optimizer state) and End (a stopped run's save) block: the scheduler runs both off its
// loop (BlockingWork), in order, so a restore finds the checkpoint saved before it.
// Not thread-safe: one thread at a time.
#ifndef PSWITCH_CONTROLLER_TRAINING_STATE_H_
#define PSWITCH_CONTROLLER_TRAINING_STATE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "controller/state_checkpoints.h"
#include "memdaemon/memdaemon.h"
#include "memdaemon/state_area.h"
#include "memdaemon/transmitter.h"

namespace pswitch::controller {

class TrainingState {
 public:
  // The state of a run of task `task` whose checkpoints are `key`'s (the task's, or its fill
  // job's across bubbles): leases its optimizer area and copies the checkpoint into it (blocks
  // for that copy; call it off the loop). `optimizer_bytes` 0 (inference, a stateless
  // optimizer): no area, nothing copied. ResourceExhausted when the arena cannot hold the state.
  static absl::StatusOr<std::unique_ptr<TrainingState>> Begin(memdaemon::MemDaemon* daemon,
                                                              StateCheckpoints* checkpoints,
                                                              uint64_t task, CheckpointKey key,
                                                              uint64_t optimizer_bytes);
  // Drops what was not saved (the lease goes).
  ~TrainingState() = default;

  // Where the worker trains the optimizer state in place; 0 bytes: none.
  uint64_t optimizer_offset() const { return area_ ? area_->offset() : 0; }
  uint64_t optimizer_bytes() const { return area_ ? area_->bytes() : 0; }

  // How a stopped run's state is saved, decided on the loop when its RunDone came.
  struct Ending {
    bool run_ok = false;   // the run, and its switch as far as known then, succeeded
    bool trained = false;  // it completed at least one iteration (else its weights are as loaded)
    // The transmission that brought the model's weights for the run; null: they were resident.
    std::shared_ptr<memdaemon::Transmission> transmission;
    absl::Duration copy_timeout = absl::Seconds(10);  // how long End waits for its end
    uint64_t region_offset = 0;
    const memdaemon::StoredModel* model = nullptr;  // must stay registered until End returns
    bool keep_optimizer = false;  // the run resumes later: checkpoint its optimizer state
  };
  // Saves what a stopped run leaves (blocks: call it off the loop). Its weights go back to the
  // pinned store only when the run succeeded, trained, and the transmission that brought them
  // ended without error (waited for up to copy_timeout): a failed run, or one whose copy did not
  // complete, never overwrites the master weights, and then its optimizer state is dropped too.
  // The optimizer state is checkpointed when keep_optimizer (and nothing failed), dropped
  // otherwise. Returns why something asked for was not saved (a failed run's own error is the
  // caller's); `optimizer_kept` says whether the state was checkpointed.
  absl::Status End(const Ending& ending, bool& optimizer_kept);
  // After an End that saved the weights: the pinned weights' generation they became (the
  // region holds exactly it); 0 when none were saved.
  uint64_t saved_generation() const { return saved_generation_; }

  // The run stopped (nothing writes the region): its weights go back to the pinned store.
  absl::Status SaveWeights(uint64_t region_offset, const memdaemon::StoredModel& model);
  // Ends the optimizer area: checkpointed to host memory when `keep` (the run will resume),
  // dropped otherwise. Once.
  absl::Status EndOptimizer(bool keep);

 private:
  TrainingState(memdaemon::MemDaemon* daemon, StateCheckpoints* checkpoints, CheckpointKey key,
                std::unique_ptr<memdaemon::StateArea> area)
      : daemon_(daemon), checkpoints_(checkpoints), key_(key), area_(std::move(area)) {}

  memdaemon::MemDaemon* const daemon_;
  StateCheckpoints* const checkpoints_;
  const CheckpointKey key_;
  std::unique_ptr<memdaemon::StateArea> area_;
  uint64_t saved_generation_ = 0;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_TRAINING_STATE_H_
