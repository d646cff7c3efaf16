// What a training run keeps outside its worker. Its optimizer state (SGD momentum, Adam moments)
// lives in the GPU's weights pool while the run is on the GPU, in a room the scheduler's weights
// cache gives it (WeightsCache::ReserveState). A preempted task's state stays there for its next
// run, which then copies nothing; the scheduler saves it to a host checkpoint only when the pool
// needs its room, or when it belongs to a fill job (whose next bubble may be on another GPU). A
// run with no resident state is filled from its host checkpoint.
// Its trained weights are copied from the region back to the model's pinned store when it ends
// for good, or when a preempted run's region is evicted (the scheduler decides which: Ending).
// Every copy is the memdaemon's; this only decides when, and frees no room (the cache's, on the
// scheduler's loop). Begin (a restore, for a run with optimizer state) and End (a stopped run's
// save) block: the scheduler runs both off its loop (BlockingWork), in order.
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

// Saves a kept optimizer state (`bytes` in `room`) to `key`'s host checkpoint; blocks (call it
// off the loop). The room is the caller's to free once this returned OK; on failure the state
// is lost to its task, which must not resume from zeros.
absl::Status SaveKeptState(memdaemon::MemDaemon& daemon, StateCheckpoints& checkpoints,
                           CheckpointKey key, memdaemon::StateArea::Room room, uint64_t bytes);

class TrainingState {
 public:
  // The state of a run of task `task` whose checkpoints are `key`'s (the task's, or its fill
  // job's across bubbles). `optimizer_bytes` 0 (inference, a stateless optimizer): no state,
  // nothing copied. Otherwise the state lives in `room`: as the task's last run left it there
  // when `resident` (restored_resident(): nothing copied), else filled from `key`'s host
  // checkpoint (blocks for that copy; call it off the loop).
  static absl::StatusOr<std::unique_ptr<TrainingState>> Begin(
      memdaemon::MemDaemon* daemon, StateCheckpoints* checkpoints, uint64_t task, CheckpointKey key,
      uint64_t optimizer_bytes, memdaemon::StateArea::Room room = {}, bool resident = false);
  // Drops what was not saved (its room is the scheduler's to free).
  ~TrainingState() = default;

  // Where the worker trains the optimizer state in place; 0 bytes: none.
  uint64_t optimizer_offset() const { return area_ ? area_->offset() : 0; }
  uint64_t optimizer_bytes() const { return area_ ? area_->bytes() : 0; }
  // Its area was the one kept resident from the task's last run: nothing was copied.
  bool restored_resident() const { return restored_resident_; }

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
    // The run resumes later and its trained weights stay in its region, unsaved (the scheduler
    // writes them back when that region is evicted): nothing of them is copied now.
    bool weights_stay_resident = false;
    // The run resumes later on this GPU and its optimizer state stays in its room (the
    // scheduler saves it when the room is needed): not copied now.
    bool state_stays_resident = false;
  };
  // Saves what a stopped run leaves (blocks: call it off the loop). Its weights go back to the
  // pinned store only when the run succeeded, trained, and the transmission that brought them
  // ended without error (waited for up to copy_timeout): a failed run, or one whose copy did not
  // complete, never overwrites the master weights, and then its optimizer state is dropped too.
  // The optimizer state is kept when keep_optimizer (and nothing failed): left in its room when
  // state_stays_resident, else saved to its host checkpoint; dropped otherwise. Returns why
  // something asked for was not saved (a failed run's own error is the caller's);
  // `optimizer_kept` says whether the state was kept (either way).
  absl::Status End(const Ending& ending, bool& optimizer_kept);
  // After an End that saved the weights: the pinned weights' generation they became (the
  // region holds exactly it); 0 when none were saved.
  uint64_t saved_generation() const { return saved_generation_; }

  // The run stopped (nothing writes the region): its weights go back to the pinned store.
  absl::Status SaveWeights(uint64_t region_offset, const memdaemon::StoredModel& model);
  // Ends the optimizer state: kept for the run's resume when `keep` (where it is when
  // `in_place`, else saved to host memory), dropped otherwise. Once.
  absl::Status EndOptimizer(bool keep, bool in_place);

 private:
  TrainingState(memdaemon::MemDaemon* daemon, StateCheckpoints* checkpoints, CheckpointKey key,
                std::unique_ptr<memdaemon::StateArea> area, bool restored_resident)
      : daemon_(daemon),
        checkpoints_(checkpoints),
        key_(key),
        area_(std::move(area)),
        restored_resident_(restored_resident) {}

  memdaemon::MemDaemon* const daemon_;
  StateCheckpoints* const checkpoints_;
  const CheckpointKey key_;
  std::unique_ptr<memdaemon::StateArea> area_;
  const bool restored_resident_;
  uint64_t saved_generation_ = 0;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_TRAINING_STATE_H_
