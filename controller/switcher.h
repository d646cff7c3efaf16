// The switch of one GPU: which worker runs a task's model, and getting the model's weights into
// the region under it.
//
//   1. A task whose model the region holds runs on the active worker: nothing moves.
//   2. Otherwise a free standby worker takes it (the active one only when none is free). A busy
//      active tenant is told to stop; it drains at its next sync point and writes its drain flag.
//   3. The memdaemon's transmission starts at once: its copies wait on that drain flag on the
//      copy stream, and the new worker's layers wait on their groups' ready flags (Prepare), so
//      no CPU round trip sits between a group and its compute.
//   4. The copy's end is reported by the copy engine itself (no thread waits for it); a copy
//      that never saw its old tenant drain gets that tenant killed, since its stream may wait on
//      a flag no one will write. On CUDA that copy is reported *stalled* first (its work is
//      still queued behind the drain wait): the kill comes then, and the copy counts as in
//      flight (Copying) until the engine reports its end, once the device is done with it.
// Residency tracks which model the region holds and whether it can be trusted.
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
#include <string>

#include "absl/status/statusor.h"
#include "controller/event_loop.h"
#include "controller/residency.h"
#include "controller/task_spec.h"
#include "controller/worker_pool.h"
#include "memdaemon/transmitter.h"
#include "registry/model_catalog.h"

namespace pswitch::controller {

struct SwitcherOptions {
  int gpu = 0;
  uint64_t region_offset = 0;  // the weights region
  // An old tenant that has not drained this long after being told to stop is killed.
  absl::Duration drain_timeout = absl::Seconds(30);
};

class Switcher {
 public:
  // Task `task`'s copy ended (on the loop): OK once its model is fully in place, else why not
  // (then the region is already untrusted). Runs once per switch, success or failure, after
  // Copying() stopped counting it, so whoever waits for the copy's end (a task answered before
  // it) gets it either way; the copy engine's own bounds (stall, device lost) bound the wait.
  using CopyEnded = std::function<void(uint64_t task, const absl::Status& status)>;
  // `transmitter` and `pool` must outlive it.
  Switcher(SwitcherOptions options, memdaemon::Transmitter* transmitter, WorkerPool* pool,
           std::shared_ptr<EventLoop> loop, CopyEnded on_copy_ended);

  struct Placement {
    int slot = -1;
    std::shared_ptr<memdaemon::Transmission> transmission;  // null when the model was resident
  };
  // Places task `task` of `entry`'s model on a worker, switching the region to it when it does
  // not hold it, and sends that worker Prepare. `timeline.stop_sent_ns` is set when a Stop went
  // out for it. ResourceExhausted when the plan has more groups than the GPU has ready flags.
  absl::StatusOr<Placement> Place(uint64_t task, const registry::CatalogEntry& entry,
                                  SwitchTimeline& timeline);
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
  // The worker in `slot` died: a half-finished step may have touched the region.
  void SlotDied(int slot) { residency_.SlotDied(slot); }
  bool Holds(const std::string& model) const { return residency_.Holds(model); }
  // A copy of `model` into the region is in flight (its end not seen yet, also while it is
  // stalled on the device): its pinned weights may still be read.
  bool Copying(const std::string& model) const;
  // `model` was unloaded: the region no longer counts as holding it.
  void Unloaded(const std::string& model) { residency_.Dropped(model); }
  int active_slot() const { return residency_.active_slot(); }
  std::string resident_model() const { return residency_.model(); }

 private:
  struct InFlight {
    std::shared_ptr<memdaemon::Transmission> transmission;
    uint64_t task = 0;
    int drain_slot = -1;  // the old tenant whose drain it waits for; -1: none (or killed)
    std::string model;
  };
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

  Residency residency_;
  int64_t last_stop_sent_ns_ = 0;
  uint64_t next_id_ = 1;
  std::map<uint64_t, InFlight> in_flight_;  // transmissions whose end was not seen yet
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_SWITCHER_H_
