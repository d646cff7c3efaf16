// What a training run keeps outside its worker. Its optimizer state (SGD momentum, Adam moments)
// is an arena area while the run is on the GPU. A preempted task's area stays resident
// (ResidentStates) for its next run, which then copies nothing; it goes to a host checkpoint
// only when the arena needs the room, or when it belongs to a fill job (whose next bubble may be
// on another GPU). A run with no resident area is filled from its host checkpoint.
// Its trained weights are copied from the region back to the model's pinned store when it ends
// for good, or when a preempted run's region is evicted (the scheduler decides which: Ending).
// Every copy is the memdaemon's; this only decides when. Begin (a restore, for a run with
// optimizer state) and End (a stopped run's save) block: the scheduler runs both off its loop
// (BlockingWork), in order, so a restore finds the state saved or kept before it.
// Not thread-safe: one thread at a time.
#ifndef PSWITCH_CONTROLLER_TRAINING_STATE_H_
#define PSWITCH_CONTROLLER_TRAINING_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/state_checkpoints.h"
#include "memdaemon/memdaemon.h"
#include "memdaemon/state_area.h"
#include "memdaemon/transmitter.h"

namespace pswitch::controller {

// Preempted training tasks' optimizer areas kept in one GPU's arena, by checkpoint key, within a
// byte budget (the arena's room for optimizer state): beyond it, or when a new area does not fit
// (MakeRoom), the oldest kept area is saved to its host checkpoint and its lease freed. Used on
// the scheduler's state-copy thread only (every method may copy); not thread-safe.
class ResidentStates {
 public:
  ResidentStates(StateCheckpoints* checkpoints, uint64_t budget_bytes)
      : checkpoints_(checkpoints), budget_bytes_(budget_bytes) {}

  // Keeps `key`'s area resident, saving older ones to host memory as the budget needs (this one
  // too when it alone exceeds it).
  void Keep(CheckpointKey key, std::unique_ptr<memdaemon::StateArea> area);
  // `key`'s area when it is kept; null otherwise. DataLoss when it was lost (its save to host
  // memory failed): the run must not start from zeros.
  absl::StatusOr<std::unique_ptr<memdaemon::StateArea>> Take(CheckpointKey key);
  // Drops `key`'s area (its task ended), any record of its loss, and its host checkpoint.
  void Drop(CheckpointKey key);
  // Saves the oldest kept area to host memory, freeing its lease; false when none is kept.
  bool MakeRoom();
  uint64_t kept_bytes() const { return kept_bytes_; }
  uint64_t budget_bytes() const { return budget_bytes_; }
  size_t kept() const { return kept_.size(); }

 private:
  struct Kept {
    CheckpointKey key;
    std::unique_ptr<memdaemon::StateArea> area;
  };
  StateCheckpoints* const checkpoints_;
  const uint64_t budget_bytes_;
  std::vector<Kept> kept_;  // oldest first
  uint64_t kept_bytes_ = 0;
  std::map<CheckpointKey, absl::Status> lost_;
};

class TrainingState {
 public:
  // The state of a run of task `task` whose checkpoints are `key`'s (the task's, or its fill
  // job's across bubbles): leases its optimizer area and copies the checkpoint into it (blocks
  // for that copy; call it off the loop). `optimizer_bytes` 0 (inference, a stateless
  // optimizer): no area, nothing copied. ResourceExhausted when the arena cannot hold the state.
  // With `resident`, a task's area kept there from its last run is taken as it is
  // (restored_resident()), and a stopped run's area is kept there (End); without, every state
  // goes through host memory.
  static absl::StatusOr<std::unique_ptr<TrainingState>> Begin(memdaemon::MemDaemon* daemon,
                                                              StateCheckpoints* checkpoints,
                                                              uint64_t task, CheckpointKey key,
                                                              uint64_t optimizer_bytes,
                                                              ResidentStates* resident = nullptr);
  // Drops what was not saved (the lease goes).
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
  // Ends the optimizer area: kept for the run's resume when `keep` (resident when a task's and
  // there is a ResidentStates, else checkpointed to host memory), dropped otherwise. Once.
  absl::Status EndOptimizer(bool keep);

 private:
  TrainingState(memdaemon::MemDaemon* daemon, StateCheckpoints* checkpoints,
                ResidentStates* resident, CheckpointKey key,
                std::unique_ptr<memdaemon::StateArea> area, bool restored_resident)
      : daemon_(daemon),
        checkpoints_(checkpoints),
        resident_(resident),
        key_(key),
        area_(std::move(area)),
        restored_resident_(restored_resident) {}

  memdaemon::MemDaemon* const daemon_;
  StateCheckpoints* const checkpoints_;
  ResidentStates* const resident_;  // null: none kept
  const CheckpointKey key_;
  std::unique_ptr<memdaemon::StateArea> area_;
  const bool restored_resident_;
  uint64_t saved_generation_ = 0;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_TRAINING_STATE_H_
