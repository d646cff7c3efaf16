// The switch of one GPU: which worker runs a task's model, and getting the model's weights into
// a region of the GPU's weights pool under it.
//
//   1. A task whose model is resident (WeightsCache) runs on a free worker that has it loaded,
//      the last active one when it can: nothing is copied, and Prepare moves the worker's views
//      to the model's region (one pointer per model in the worker).
//   2. Otherwise the cache gives the model a region (a hole, or evicted models' space) and its
//      own ready flags, and a free standby worker takes it (the active one only when none is
//      free). A busy old tenant whose region the new one overlaps is told to stop; it drains at
//      its next sync point and writes its drain flag. A new region that overlaps nothing a
//      busy tenant may write starts copying without waiting for anyone.
//   3. The memdaemon's transmission starts at once: its copies wait on that drain flag on the
//      copy stream when there is one, and the new worker's layers wait on their groups' ready
//      flags (Prepare), so no CPU round trip sits between a group and its compute.
//   4. The copy's end is reported by the copy engine itself (no thread waits for it); a copy
//      that never saw its old tenant drain gets that tenant killed, since its stream may wait on
//      a flag no one will write. On CUDA that copy is reported *stalled* first (its work is
//      still queued behind the drain wait): the kill comes then, and the copy counts as in
//      flight (Copying) until the engine reports its end, once the device is done with it.
// A region counts as holding its model only while nothing went wrong: a copy that did not
// complete, a task that failed on its switch, or the death of a worker that last ran it (a
// half-finished training step may have touched the weights) make the next task transmit again.
//
// Loop thread only. Copy ends are posted to the loop with a raw `this`: destroy it only after
// the loop has ended.
#ifndef PSWITCH_CONTROLLER_SWITCHER_H_
#define PSWITCH_CONTROLLER_SWITCHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "controller/event_loop.h"
#include "controller/task_spec.h"
#include "controller/weights_cache.h"
#include "controller/worker_pool.h"
#include "memdaemon/transmitter.h"
#include "registry/model_catalog.h"

namespace pswitch::controller {

struct SwitcherOptions {
  int gpu = 0;
  // The weights pool (a memdaemon lease) and how it caches models.
  WeightsCacheOptions cache;
  // An old tenant that has not drained this long after being told to stop is killed.
  absl::Duration drain_timeout = absl::Seconds(30);
};

class Switcher {
 public:
  // Task `task`'s copy ended (on the loop): OK once its model is fully in place, else why not
  // (then the region is already untrusted). Runs once per switch, success or failure, after
  // Copying() stopped counting it, so whoever waits for the copy's end (a task answered before
  // it) gets it either way; the copy engine's own bounds (stall, device lost) bound the wait.
  // `epoch` is the copy's: a task placed again (its first placement's worker died) may see the
  // end of its earlier copy, which is not its current one's.
  using CopyEnded = std::function<void(uint64_t task, uint32_t epoch, const absl::Status& status)>;
  // `transmitter` and `pool` must outlive it.
  Switcher(SwitcherOptions options, memdaemon::Transmitter* transmitter, WorkerPool* pool,
           std::shared_ptr<EventLoop> loop, CopyEnded on_copy_ended);

  struct Placement {
    int slot = -1;
    std::shared_ptr<memdaemon::Transmission> transmission;  // null when the model was resident
    uint64_t weights_offset = 0;  // where the model's weights are in the arena
  };
  // Whether a task for `model` can be placed now, as WorkerPool::Outlook says; for a resident
  // model also kLater while a worker that last ran it is still busy (an abandoned training run
  // may still write its weights).
  WorkerPool::Outlook ForModel(const std::string& model, absl::Status* never) const;
  // Places task `task` of `entry`'s model on a worker, copying the model into a region of the
  // pool when it is not resident, and sends that worker Prepare. `timeline.stop_sent_ns` is set
  // when a Stop went out for it. ResourceExhausted when the model is larger than the pool (or
  // the operator's cap) or its plan has more groups than the GPU has ready flags.
  //
  // With `ahead`, the task is placed while the tenant in `ahead->busy_slot` is still stopping
  // (placement at arrival): on another free worker, in a region and flags apart from those of
  // `ahead->keep`'s models, so nothing of it waits for that tenant; Unavailable (nothing
  // changed) when no such place exists, and the task waits for the GPU as before.
  struct Ahead {
    int busy_slot = -1;
    std::set<std::string> keep;
  };
  absl::StatusOr<Placement> Place(uint64_t task, const registry::CatalogEntry& entry,
                                  SwitchTimeline& timeline, const Ahead* ahead = nullptr);
  // Copies `entry`'s model into a region of the pool with no task (a model pinned resident, at
  // its registration), apart from every busy tenant's region so it waits for nobody; OK at once
  // when it is resident. Its end is reported like a switch's, for task 0.
  // `keep`: the models of tasks placed (the scheduler's running and ahead tasks), also untaken.
  absl::Status Preload(const registry::CatalogEntry& entry, std::set<std::string> keep);
  // Compaction, while the GPU is idle: the move of a resident model that would merge the pool's
  // free space (WeightsCache::PlanMove), apart from every region in use; nullopt when none, or
  // while any copy runs (a move queued behind it would delay nothing, but a request's copy
  // queued behind a move would).
  // `wanted`: the region bytes of the registered models not resident here.
  std::optional<RegionMove> PlanMove(const std::vector<uint64_t>& wanted) const;
  // Moves `entry`'s model as `move` plans: a copy on the device from its region into the hole,
  // with no task (its end reported like a switch's, for task 0), the old room free at once.
  // FailedPrecondition when the region is no longer as planned, or holds older weights than the
  // pinned store's (then freed: the next request copies it again anyway). A move whose copy
  // cannot start leaves the model where it was; after a failed move none is planned until a
  // copy succeeds.
  absl::Status Move(const registry::CatalogEntry& entry, const RegionMove& move);
  // Tells `slot`'s worker to stop at its next sync point (preemption, or a switch).
  std::optional<uint32_t> Stop(int slot);
  // When the latest Stop went out (CLOCK_MONOTONIC ns; 0: none yet).
  int64_t last_stop_sent_ns() const { return last_stop_sent_ns_; }

  // Task `task`, run on a switch (`placement.transmission` set), answered: its timeline gets
  // the copy's phases and the switch is logged. Never waits. A failed task, or a copy that
  // failed, leaves the region untrusted; the copy's failure is returned. A copy still running
  // (or stalled) is no success: OK is returned only for the task's own answer, which its worker
  // checked against the flags of every group it used; the copy's phases are then missing, its
  // end is still handled when it comes (on_copy_ended), and whoever wants the phases calls this
  // again then (GpuScheduler holds such a task's answer until the copy ended).
  absl::Status Completed(uint64_t task, const std::string& model,
                         memdaemon::Transmission& transmission, bool task_ok,
                         SwitchTimeline& timeline, absl::Duration& copy_time);
  // The worker in `slot` died: when it was busy, a half-finished step may have touched the
  // weights it last ran.
  void SlotDied(int slot, bool was_busy);
  bool Holds(const std::string& model) const { return cache_.Find(model) != nullptr; }
  // A copy of `model` into the pool is in flight (its end not seen yet, also while it is
  // stalled on the device): its pinned weights may still be read.
  bool Copying(const std::string& model) const;
  // A training run of `model` failed on its resident weights: they may be half updated.
  void Untrust(const std::string& model) { cache_.Untrust(model); }
  // A training run's weights were checkpointed to the pinned store, now of `generation`: the
  // resident copy is that generation (and holds nothing unsaved).
  void Checkpointed(const std::string& model, uint64_t generation) {
    cache_.Checkpointed(model, generation);
  }
  // Training task `task`, preempted, left its trained weights in `model`'s region without
  // writing them back: they stay resident until evicted, and are written back first.
  void KeepUnsaved(const std::string& model, uint64_t task) { cache_.MarkUnsaved(model, task); }
  // The task whose unsaved weights `model`'s region holds; 0: none (saved, or lost).
  uint64_t UnsavedTask(const std::string& model) const { return cache_.UnsavedTask(model); }
  // A training run's checkpoint reads `model`'s region off the loop (the GPU is not held for
  // it): until CheckpointRead, nothing runs on the model (ForModel: kLater) and no reservation
  // takes its region or flags.
  void CheckpointReading(const std::string& model) { cache_.Hold(model); }
  void CheckpointRead(const std::string& model) { cache_.Release(model); }
  bool BeingCheckpointed(const std::string& model) const { return cache_.Held(model); }
  // A miss for `entry`'s model that has room only where a checkpoint still reads, or where
  // unsaved training weights or kept optimizer state are: it waits (and those are to be written
  // back). `state_bytes` > 0: a training run whose optimizer state (`state`'s, not resident)
  // needs that room too, once the weights have theirs.
  RoomWait WaitsForRoom(const registry::CatalogEntry& entry, uint64_t state_bytes = 0,
                        CheckpointKey state = {}) const;
  // Room in the pool for training run `state`'s optimizer state, where nothing in use is
  // (InUse) nor `model`'s weights (the run's own): models evicted as for a miss, the state's
  // region taken until FreeState (KeepState keeps it for a preempted task). Its offset.
  absl::StatusOr<uint64_t> ReserveState(CheckpointKey state, uint64_t bytes,
                                        const std::string& model);
  const ResidentModel* FindState(CheckpointKey state) const { return cache_.FindState(state); }
  void KeepState(CheckpointKey state, uint64_t task) { cache_.KeepState(state, task); }
  void UseState(CheckpointKey state) { cache_.UseState(state); }
  void FreeState(CheckpointKey state) { cache_.FreeState(state); }
  // A state goes off the loop (a kept one saved to host memory, or its run's end under way): it
  // is held meanwhile, each hold released once (a reservation waits for its room).
  void HoldState(CheckpointKey state) { cache_.Hold(WeightsCache::StateName(state)); }
  void ReleaseState(CheckpointKey state) { cache_.Release(WeightsCache::StateName(state)); }
  bool StateHeld(CheckpointKey state) const { return cache_.Held(WeightsCache::StateName(state)); }
  // The operator pinned `model` resident (registration's pin_resident): never evicted.
  void Pin(const std::string& model, bool pinned) { cache_.Pin(model, pinned); }
  // `model` was unloaded: its region is freed.
  void Unloaded(const std::string& model) { cache_.Drop(model); }
  // A task of `model` computed for `compute` (its first layer's start to its result), for the
  // cache's reload costs.
  void ObserveCompute(const std::string& model, absl::Duration compute) {
    cache_.ObserveCompute(model, absl::ToDoubleSeconds(compute));
  }
  int active_slot() const { return active_slot_; }
  // The model the active worker last ran, while it is resident; empty otherwise.
  std::string active_model() const;
  const WeightsCache& cache() const { return cache_; }
  // A compaction move's copy is under way (its source, free in the cache, is still read).
  bool MoveInFlight() const;
  // Called (on the loop) for each model evicted, with the model it made room for: the trace.
  void set_on_evicted(std::function<void(const std::string&, const std::string&)> on_evicted) {
    on_evicted_ = std::move(on_evicted);
  }
  // Posted to the loop when a placement took a pinned model's region (fragmentation), with the
  // model placed: the owner copies it in again elsewhere (Preload), behind the placement's copy.
  // Posted whether or not the rest of that placement succeeded.
  void set_on_pinned_moved(std::function<void(const std::string&, const std::string&)> moved) {
    on_pinned_moved_ = std::move(moved);
  }

 private:
  struct InFlight {
    std::shared_ptr<memdaemon::Transmission> transmission;
    uint64_t task = 0;
    int drain_slot = -1;  // the old tenant whose drain it waits for; -1: none (or killed)
    std::string model;
    uint64_t bytes = 0;
    bool move = false;  // a copy on the device (compaction): says nothing of the link's speed
  };
  bool moves_paused_ = false;  // a move failed, and no copy succeeded since (PlanMove)
  // What a worker last ran, and where its weights were: a busy worker may still write them.
  struct Tenant {
    std::string model;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint32_t epoch = 0;  // of the copy that brought the weights it ran on
  };
  ReloadCost CostOf(const registry::CatalogEntry& entry) const;
  // Starts copying `entry`'s model into `room` for `task` (0: a preload or a move), behind
  // `drain_slot`'s drain when `drain` is set, from the region at `source` for a move; tracked in
  // in_flight_ until its end. On failure the reservation is freed.
  absl::StatusOr<std::shared_ptr<memdaemon::Transmission>> Transmit(
      uint64_t task, const registry::CatalogEntry& entry, const Reservation& room,
      std::optional<memdaemon::DrainCondition> drain, int drain_slot,
      std::optional<uint64_t> source = std::nullopt);
  // Logs (and reports, on_evicted_) the models `room` evicted to make room for `model`.
  void Evicted(const Reservation& room, const std::string& model) const;
  base::Log Event(base::LogLevel level, absl::string_view event) const;
  // A transmission failed with work still queued on the device (on the loop): the tenant it
  // waits for is killed now, so the work can run and the copy end.
  void Stalled(uint64_t id, const absl::Status& why);
  // A transmission's end (from the copy engine's completion, on the loop).
  void Ended(uint64_t id);
  // Kills `flight`'s old tenant when `why` says it never drained; once per transmission.
  void KillUndrained(InFlight& flight, const absl::Status& why);

  const SwitcherOptions options_;
  memdaemon::Transmitter* const transmitter_;
  WorkerPool* const pool_;
  const std::shared_ptr<EventLoop> loop_;
  const CopyEnded on_copy_ended_;
  std::function<void(const std::string& evicted, const std::string& for_model)> on_evicted_;
  std::function<void(const std::string& moved, const std::string& for_model)> on_pinned_moved_;
  // `keep` and every model a busy tenant may use or a copy still writes: what a copy with no
  // task (Preload) must leave alone.
  std::set<std::string> InUse(std::set<std::string> keep) const;

  WeightsCache cache_;
  int active_slot_ = -1;           // the worker placed last
  std::map<int, Tenant> tenants_;  // slot -> what it last ran
  double link_bytes_per_s_ = 0;    // the copies' measured bandwidth (0: none measured yet)
  int64_t last_stop_sent_ns_ = 0;
  uint64_t next_id_ = 1;
  std::map<uint64_t, InFlight> in_flight_;  // transmissions whose end was not seen yet
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_SWITCHER_H_
