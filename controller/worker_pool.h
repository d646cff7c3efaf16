// One GPU's worker processes (1 active + N standby), each in a numbered slot: spawning them,
// replacing the dead ones (at once when they had been serving, with a growing back-off when
// they fail to start), loading every registered model into each, and knowing which can take a
// task now. Commands go out through it; RunDone, Drained and deaths come back to its Listener.
// It decides nothing about tasks: the scheduler does. It keeps what each worker has mapped of
// the transfer regions (docs/dataplane.md): a Run's regions are mapped before it, and unmapped
// once nothing holds them (checked at every Run and every heartbeat).
//
// Sending never blocks the loop (WorkerLink::Send queues). A worker whose unread backlog passes
// its bound is killed at once; one that takes none of its commands for silence_timeout is
// killed by the same watchdog as a silent one (KillSilent). Either way the slot is respawned and
// the scheduler hears of the death (its task fails with the reason, unless its Run was never
// sent: GpuScheduler requeues that once).
//
// Loop thread only (every method, and the Listener's calls), except AwaitReady. Its workers'
// events are posted to the loop with a raw `this`: destroy it only after the loop has ended.
#ifndef PSWITCH_CONTROLLER_WORKER_POOL_H_
#define PSWITCH_CONTROLLER_WORKER_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/log.h"
#include "base/unique_fd.h"
#include "controller/event_loop.h"
#include "controller/model_loads.h"
#include "controller/region_mappings.h"
#include "controller/respawn_backoff.h"
#include "controller/worker_process.h"
#include "dataplane/transfer_region.h"
#include "memdaemon/weight_layout.h"

namespace pswitch::proto {
struct RunDone;
struct Drained;
}  // namespace pswitch::proto

namespace pswitch::controller {

// What a worker warms after binding a model (proto::WarmUp, worker/warm_up.h); batch 0: nothing.
struct WarmUpSpec {
  uint32_t batch = 0;
  bool train = false;
  bool train_required = false;
  bool measure = false;
};

// What a worker is told to load (LoadModel).
struct WorkerModel {
  std::string name;
  std::string zoo_model;
  // Its weight layout and training order as registration inspected them: workers bind by these
  // (a zoo model records no forward pass of its own).
  std::vector<memdaemon::LayerSpec> layout;
  std::vector<uint32_t> train_order;
  uint64_t bytes = 0;
  // A pswitch.export model: its archive as a sealed memory file (shared by every worker), and
  // its size. Null for zoo models.
  std::shared_ptr<const UniqueFd> archive;
  uint64_t archive_bytes = 0;
  WarmUpSpec warm;
  std::string dtype;  // a zoo model's precision (registration's); empty: float32
};

struct WorkerPoolOptions {
  int gpu = 0;  // named on its log lines
  int workers = 3;
  uint64_t region_offset = 0;  // where every model's weights live in the arena
  // Starts slot `worker_id`'s process; its events go to the handler (any thread).
  std::function<absl::StatusOr<std::unique_ptr<WorkerLink>>(uint32_t worker_id,
                                                            WorkerProcess::EventHandler)>
      launch;
  // A worker that announced itself and then says nothing this long (it sends a heartbeat every
  // worker::kWorkerHeartbeatInterval) is stopped or wedged: it is killed and replaced. So is
  // one that takes none of the commands waiting for it this long (it stopped reading).
  absl::Duration silence_timeout = absl::Seconds(10);
  // A ready worker silent this long (three missed 500 ms heartbeats) gets no new task until it
  // is heard again or killed: a stopped worker must not take the task the last one failed.
  absl::Duration suspect_after = absl::Milliseconds(1500);
  // Every registered model, in registration order: a fresh worker loads them all.
  std::function<std::vector<WorkerModel>()> models;
  // Nothing of `slot`'s dead process is in flight: a copy waiting for its drain value
  // `promised` may go on (memdaemon::MemDaemon::ReleaseDrain).
  std::function<void(uint32_t slot, uint32_t promised)> release_drain;
};

class WorkerPool {
 public:
  class Listener {
   public:
    virtual ~Listener() = default;
    // The slot's worker finished a Run (the pool already counts it idle again).
    virtual void OnRunDone(int slot, const proto::RunDone& done) = 0;
    // The slot's worker drained after `task` and cleaned up.
    virtual void OnDrained(int slot, uint64_t task, const proto::Drained& drained) = 0;
    // The slot's worker, running `task`, has done `iterations` of it (its heartbeat says).
    virtual void OnProgress(int /*slot*/, uint64_t /*task*/, uint32_t /*iterations*/) {}
    // The slot's worker died. `why` says how; `killed` when the pool killed it (Kill), `why`
    // then being the kill's reason; `was_busy` when it died with a Run (or a Prepare's gate)
    // in flight, not idle. A replacement is already scheduled.
    virtual void OnWorkerDied(int slot, const absl::Status& why, bool killed, bool was_busy) = 0;
  };

  // What a task for some model can expect of the pool.
  enum class Outlook {
    kNow,    // a worker can take it now
    kLater,  // one is starting, loading, restarting or busy
    kNever,  // none can: its load failed everywhere, or every slot gave up starting
  };

  WorkerPool(WorkerPoolOptions options, std::shared_ptr<EventLoop> loop, Listener* listener);
  ~WorkerPool();  // shuts every worker down (Close)
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Start();  // spawns every slot
  // Shutting down: nothing is respawned any more.
  void StopRespawning() { stopping_ = true; }
  // Shuts every worker down and reaps it, releasing its drain; no Listener call after.
  void Close();

  // The earliest pending restart (InfiniteFuture: none), and starting the due ones.
  absl::Time NextRespawn() const;
  void RespawnDue();
  // When the first live worker would have been silent too long (InfiniteFuture: none), and
  // killing those that have been at `now`.
  absl::Time NextSilenceDeadline() const;
  void KillSilent(absl::Time now);

  // A newly registered model goes to every live worker; `done` gets the first load error or
  // OK, and the slowest warm steps measured, once each worker asked has answered (or died). A
  // busy worker loads it after its run and is not waited for. So that a load (and its warm-up)
  // never holds up a task that arrives meanwhile, one free worker is held back while the others
  // load, and loads it once no other worker is loading anything; it is not waited for either.
  void AddModel(const WorkerModel& model, ModelLoads::Done done);

  // Unloads `model` from every live worker that holds or is loading it (DropModel; commands are
  // handled in order, so a later load of the same name finds it gone). No task of it may be
  // running or queued.
  void RemoveModel(const std::string& model);

  int size() const { return static_cast<int>(slots_.size()); }
  // Idle with every load answered.
  bool Free(int slot) const;
  // Free and holding `model`.
  bool Usable(int slot, const std::string& model) const;
  // Not running anything (a Run's RunDone came back).
  bool Idle(int slot) const { return slots_[slot].state == State::kIdle; }
  // `slot`'s worker was sent SIGKILL and its death is not handled yet.
  bool Killing(int slot) const { return !slots_[slot].kill_reason.empty(); }
  // When `slot`'s worker last sent anything (a heartbeat every 500 ms from its own thread, so
  // a busy worker is heard too); InfinitePast for a dead one.
  absl::Time LastHeard(int slot) const {
    return slots_[slot].state == State::kDead ? absl::InfinitePast() : slots_[slot].last_heard;
  }
  // `*never` (when not null) gets why, for kNever.
  Outlook ForModel(const std::string& model, absl::Status* never) const;
  // For work that needs no model: any free worker.
  Outlook ForAnyWorker() const;
  // A free worker, `preferred` when it is free; -1 when none.
  int FreeSlot(int preferred) const;
  // A slot other than `except` that can run `model` now; -1 when none.
  int UsableOther(const std::string& model, int except) const;

  // Sends (queues) a command. A worker whose backlog is past its bound is killed here (its
  // death follows) and Unavailable names why.
  absl::Status Send(int slot, const flatbuffers::FlatBufferBuilder& command);
  // Sends a Run of `task` whose tensors lie in `regions`: first an UnmapRegion for each region
  // the worker maps that nothing holds any more, then a MapRegion (with the region's fd) for
  // each of `regions` it has not mapped, then the Run. The slot is busy until its RunDone.
  // ResourceExhausted (nothing sent) when the worker would map too many regions.
  absl::Status SendRun(
      int slot, uint64_t task, const flatbuffers::FlatBufferBuilder& run,
      const std::vector<std::shared_ptr<const dataplane::TransferRegion>>& regions = {});
  // Unmaps, on every live worker, the regions nothing holds any more.
  void SweepRegions();
  // Whether `slot`'s current process has region `region_id` mapped (tests, diagnostics).
  bool Maps(int slot, uint64_t region_id) const { return slots_[slot].regions.mapped(region_id); }
  // Tells the worker to stop at its next sync point and drain; returns the drain value it will
  // write, or nullopt when it cannot be reached (its death event follows).
  std::optional<uint32_t> SendStop(int slot);
  // SIGKILLs a live worker; its death reaches OnWorkerDied with `reason`.
  void Kill(int slot, std::string reason);
  pid_t pid(int slot) const;
  // "starting", "idle", "busy" or "dead" (GET /v1/gpus).
  const char* StateName(int slot) const;

  // Every slot is up and has answered every load (tests, start-up). Any thread.
  bool AwaitReady(absl::Duration timeout) const;

 private:
  enum class State { kStarting, kIdle, kBusy, kDead };
  struct Slot {
    std::unique_ptr<WorkerLink> process;
    State state = State::kStarting;
    uint32_t drain_value = 0;  // the last one promised; kept across processes
    uint64_t last_task = 0;    // whose leftovers its next drain cleans
    std::string kill_reason;   // set by Kill
    absl::Time last_heard;     // its latest event (any counts as a heartbeat)
    RegionMappings regions;    // what this process has mapped
    std::vector<WorkerModel> deferred;  // held back by AddModel: sent by SendDeferredLoads
  };

  base::Log Event(base::LogLevel level, absl::string_view event) const;
  void Spawn(int slot);
  void OnEvent(int slot, const absl::StatusOr<std::vector<uint8_t>>& event);
  void OnDied(int slot, const absl::Status& why);
  void ScheduleRespawn(int slot, bool was_ready, const absl::Status& why);
  void SendLoad(int slot, const WorkerModel& model);
  // Sends each held-back load whose slot is the only one with loads to make.
  void SendDeferredLoads();
  // Every command goes out here: Send's backlog rule, with an fd (-1: none).
  absl::Status SendTo(int slot, const flatbuffers::FlatBufferBuilder& command, int fd);
  void SweepRegions(int slot);
  // kStarting -> kIdle once the worker announced itself and answered every load it was sent.
  void MarkIdleOnceLoaded(int slot);
  void RefreshReadiness();

  const WorkerPoolOptions options_;
  const std::shared_ptr<EventLoop> loop_;
  Listener* const listener_;

  std::vector<Slot> slots_;
  RespawnBackoff respawns_;
  ModelLoads loads_;
  bool stopping_ = false;

  mutable absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_WORKER_POOL_H_
