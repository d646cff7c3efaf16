// The scheduler of one GPU: its task queue, its worker processes (1 active + N standby) and the
// switch. Everything below runs on one event-loop thread; other threads post to it.
//
// A switch (new task's model is not the one in the weights region):
//   1. the active worker is told to stop (it drains at its next sync point and writes its drain
//      flag), an idle standby worker is told to prepare the new model's gates and run the task;
//   2. the memdaemon starts the pipelined transmission at once; its copies wait on the old
//      worker's drain flag, and the new worker's layers wait on their groups' ready flags;
//   3. the standby becomes active. No CPU round trip sits between a group and its compute.
// Training stops at iteration boundaries; its weights (and buffers) are checkpointed from the
// region back to the pinned store whenever it stops, so a preempted task resumes exactly.
#ifndef PSWITCH_CONTROLLER_GPU_SCHEDULER_H_
#define PSWITCH_CONTROLLER_GPU_SCHEDULER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "controller/model_catalog.h"
#include "controller/state_checkpoints.h"
#include "controller/task_queue.h"
#include "controller/worker_process.h"
#include "asio/io_context.hpp"
#include "asio/post.hpp"
#include "asio/steady_timer.hpp"
#include "base/log.h"
#include "controller/model_loads.h"
#include "controller/residency.h"
#include "controller/respawn_backoff.h"
#include "controller/task_registry.h"
#include "memdaemon/lease_table.h"
#include "models/training.h"
#include "proto/host_tensor.h"

namespace pswitch::proto {
struct Drained;
}

namespace pswitch::controller {

// One bubble's run of a fill task (see fill/ and worker/fill_steps.h).
struct FillRunSpec {
  int64_t bubble_end_ns = 0;  // CLOCK_MONOTONIC
  absl::Duration margin = absl::Microseconds(200);
  absl::Duration step;      // the step's predicted duration so far
  uint64_t memory_cap = 0;  // bytes; 0 = the worker's activation lease
  bool synthetic = false;
  std::string dataset_path;  // dataset inference
  absl::Duration synthetic_step;
  uint64_t synthetic_alloc_bytes = 0;
  bool ignore_pause = false;
  std::string device_lock_path;  // host backend: the device's compute lock
  uint32_t first_iteration = 0;  // steps already done
  CheckpointKey state_key;       // keys the optimizer-state checkpoint across bubbles
};

struct TaskSpec {
  std::string model;
  TaskKind kind = TaskKind::kInference;
  std::vector<proto::HostTensor> inputs;
  uint32_t iterations = 1;  // training
  uint32_t batch = 0;       // training: samples per iteration; 0 = the model's registered batch
  uint64_t seed = 0;
  models::TrainerOptions trainer;   // training: optimizer and its hyperparameters
  std::optional<FillRunSpec> fill;  // a fill task's bubble run (SubmitFill)
  int priority = 0;
  absl::Time deadline = absl::InfiniteFuture();
  int64_t arrival_ns = 0;  // set by Submit/SubmitFill (CLOCK_MONOTONIC)
};

// Where a task's time went, on one clock (CLOCK_MONOTONIC ns; 0 = did not happen). The switch is
// reported as these parts; "switch overhead" is only ever client latency minus a ready model's
// latency measured in the same run (bench-switch), never one of these parts alone.
struct SwitchTimeline {
  int64_t arrival_ns = 0;           // the scheduler accepted the task
  int64_t stop_sent_ns = 0;         // the old tenant was told to stop (0: it was idle)
  int64_t drained_ns = 0;           // the copy could start: the old tenant had drained
  int64_t first_group_ready_ns = 0;
  int64_t first_layer_start_ns = 0;  // the first layer's compute started on the device
  int64_t first_layer_done_ns = 0;
  int64_t last_group_ready_ns = 0;
  int64_t result_ns = 0;  // the worker's answer reached the scheduler
};

struct TaskOutcome {
  uint64_t task_id = 0;
  std::vector<proto::HostTensor> outputs;
  uint32_t iterations_done = 0;
  double loss = 0;
  absl::Duration latency;      // submission to completion
  // The copy of the task's model (first group's copy start to last group ready), zero when it
  // was resident. Not the switch's cost: see SwitchTimeline.
  absl::Duration switch_time;
  SwitchTimeline timeline;
  // Fill runs: whether it paused before finishing, when it paused, and its steps.
  bool stopped_early = false;
  absl::Time paused_at;
  absl::Duration fill_step_time;
  uint32_t fill_steps = 0;
  absl::Duration fill_predicted_step;
};
using TaskCallback = std::function<void(const absl::StatusOr<TaskOutcome>&)>;

struct SchedulerOptions {
  int gpu = 0;  // this scheduler's GPU, named on each of its log lines
  Policy policy = Policy::kFcfs;
  bool inference_preempts_training = true;
  int workers = 3;  // 1 active + 2 standby
  WorkerSpawnOptions spawn;
  uint64_t region_offset = 0;  // the weights region (a memdaemon lease)
  // Optimizer-state checkpoints, shared by every GPU's scheduler; null = its own.
  std::shared_ptr<StateCheckpoints> checkpoints;
  // An old tenant that has not drained this long after a switch asked it to is killed (its
  // stream may wait on a flag no one will write) and replaced.
  absl::Duration drain_timeout = absl::Seconds(30);
};

// Thread-safe: every public method may be called from any thread.
class GpuScheduler {
 public:
  static absl::StatusOr<std::unique_ptr<GpuScheduler>> Start(const SchedulerOptions& options,
                                                             memdaemon::MemDaemon* daemon,
                                                             ModelCatalog* catalog);
  // Graceful: queued tasks are cancelled, a running task is stopped at its next sync point and
  // answered, workers are shut down and reaped.
  ~GpuScheduler();

  // Loads a newly registered model into every worker; `done` gets the first load error or OK.
  void AddModel(const CatalogEntry* entry, std::function<void(absl::Status)> done);
  // Queues a task (already validated). `done` runs exactly once, on the scheduler thread.
  uint64_t Submit(TaskSpec spec, TaskCallback done);
  // Runs a fill task's bubble run (spec.fill set) when nothing else is queued or running; any
  // queued task preempts it. It stops at its bubble end by itself (step gate) or at EndBubble.
  uint64_t SubmitFill(TaskSpec spec, TaskCallback done);
  // The main job's bubble on this GPU ended: the fill run is told to pause now, and its worker
  // is SIGKILLed if it has not paused within `grace` (framework-enforced limit).
  void EndBubble(absl::Duration grace);
  absl::StatusOr<TaskStatus> Query(uint64_t task_id) const;
  // The `limit` most recent tasks, newest first.
  std::vector<TaskStatus> Recent(size_t limit) const;
  absl::Status Cancel(uint64_t task_id);
  // Blocks until every worker slot is up and has loaded every model (tests, start-up).
  bool AwaitWorkersReady(absl::Duration timeout) const;

 private:
  struct Slot;
  struct Running;

  GpuScheduler(const SchedulerOptions& options, memdaemon::MemDaemon* daemon,
               ModelCatalog* catalog);
  // A log line of this GPU's scheduler (it names the GPU).
  base::Log Event(base::LogLevel level, absl::string_view event) const;
  // Runs `fn` on the loop, then AfterEvent. Dropped once the loop has ended.
  void Post(std::function<void()> fn);
  // After every event: deadlines (re-armed as timers), shutdown, and starting what can start.
  void AfterEvent();
  void ArmTimers();
  // Arms `timer` for `deadline` (`armed`: what it is armed for now); when it fires, `due` runs,
  // then AfterEvent.
  void ArmTimer(asio::steady_timer& timer, absl::Time& armed, absl::Time deadline,
                std::function<void()> due);
  void Loop();
  void SpawnSlot(int slot);
  // A worker that died (or failed to spawn) before it was ready is respawned after a growing
  // delay; one that had been serving, at once.
  void ScheduleRespawn(int slot, bool was_ready, const absl::Status& why);
  void RespawnDue();
  void OnWorkerEvent(int slot, const absl::StatusOr<std::vector<uint8_t>>& event);
  void OnWorkerDied(int slot, const absl::Status& why);
  void OnRunDone(int slot, const std::vector<uint8_t>& payload);
  void OnDrained(int slot, const proto::Drained& drained);
  // The running task's model is fully transmitted: it is now simply running.
  void OnTransmitted(uint64_t task_id);
  // A transmission ended without completing: the weights region holds a partial model (no
  // longer resident); when its old tenant never drained, that worker is killed and replaced.
  void OnTransmissionFailed(uint64_t task_id, uint32_t epoch, int drain_slot,
                            const absl::Status& why);
  // Training optimizer state: a per-task arena lease while the task runs, checkpointed to host
  // memory while it is preempted (so the preempting model gets the memory).
  absl::Status AcquireOptimizerState(Running& run, const TaskSpec& spec);
  // Saves the state to the task's host checkpoint when `keep`, then releases the lease.
  absl::Status ReleaseOptimizerState(Running& run, bool keep);
  void LoadAll(int slot);
  void SendLoad(int slot, const CatalogEntry& entry);
  // kStarting -> kIdle once the worker announced itself and answered every load it was sent.
  void MarkIdleOnceLoaded(int slot);
  void MaybeStart();
  // Tells `slot`'s worker to stop at its next sync point and then drain; returns the drain value
  // it will write, or nullopt when the worker cannot be reached.
  std::optional<uint32_t> SendStop(int slot);
  // SendStop for the running task, once.
  void StopRunning();
  bool Usable(int slot, const std::string& model) const;
  absl::Status StartTask(const TaskTicket& ticket);
  // StartTask's switch (when needed) and the Prepare/Run commands.
  absl::Status SendTask(Running& run, const TaskTicket& ticket, const TaskSpec& spec,
                        const CatalogEntry& entry);
  // A synthetic fill run: no model, any idle worker.
  absl::Status SendSynthetic(Running& run, const TaskTicket& ticket, const TaskSpec& spec);
  absl::Status SendRun(Running& run, int slot, const TaskTicket& ticket, const TaskSpec& spec,
                       uint32_t batch);
  void Finish(uint64_t task_id, const absl::StatusOr<TaskOutcome>& outcome);
  void RefreshReadiness();

  const SchedulerOptions options_;
  memdaemon::MemDaemon* const daemon_;
  ModelCatalog* const catalog_;

  // Loop-thread state.
  TaskQueue queue_;
  std::vector<std::unique_ptr<Slot>> slots_;
  RespawnBackoff respawns_;
  ModelLoads loads_;
  std::map<uint64_t, std::pair<TaskSpec, TaskCallback>> specs_;
  std::map<uint64_t, uint32_t> resume_iteration_;
  std::shared_ptr<StateCheckpoints> checkpoints_;  // shared by every GPU's scheduler
  std::set<uint64_t> cancel_requested_;
  std::unique_ptr<Running> running_;
  TaskRegistry tasks_;
  std::optional<TaskTicket> fill_pending_;             // a fill run waiting for the GPU
  absl::Time kill_deadline_ = absl::InfiniteFuture();  // the stopped task's answer is due
  uint64_t kill_task_ = 0;
  std::string kill_reason_;
  // A task told to stop (preempted, or a fill run paused at its bubble's end) whose worker has
  // not answered by `deadline` is SIGKILLed with `reason`; the earliest deadline stands.
  void ArmStopDeadline(uint64_t task, absl::Time deadline, std::string reason);
  void EnforceStop();
  Residency residency_;
  int64_t last_stop_sent_ns_ = 0;  // the latest Stop to a worker (CLOCK_MONOTONIC)
  bool stopping_ = false;

  mutable absl::Mutex mu_;
  bool loop_done_ ABSL_GUARDED_BY(mu_) = false;
  bool workers_ready_ ABSL_GUARDED_BY(mu_) = false;

  // This GPU's event loop: every event (a request, a worker's message, a transmission's end, a
  // deadline) is a handler on it, run on loop_ one at a time; no handler runs after Loop()
  // returns, which the destructor joins before any member goes.
  asio::io_context io_;
  asio::steady_timer kill_timer_{io_};     // kill_deadline_
  asio::steady_timer respawn_timer_{io_};  // respawns_.Next()
  asio::steady_timer stop_timer_{io_};     // shutdown's bound on a running task
  absl::Time armed_kill_ = absl::InfiniteFuture();
  absl::Time armed_respawn_ = absl::InfiniteFuture();
  bool stop_timer_armed_ = false;
  std::thread loop_;
  // One per transmission, posting OnTransmitted; `done` lets finished ones be joined early.
  struct Watcher {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Watcher> watchers_;  // loop thread only
  void WatchTransmission(std::shared_ptr<memdaemon::Transmission> transmission, uint64_t task_id,
                         int drain_slot);
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_GPU_SCHEDULER_H_
