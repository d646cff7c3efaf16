// The scheduler of one GPU: its task queue and the policy of what runs when (MaybeStart). It
// delegates the rest: its WorkerPool keeps the worker processes (1 active + N standby) alive and
// loaded, its Switcher places a task on a worker and brings the task's model into the weights
// region (see switcher.h for the switch step by step), its TaskRegistry answers queries, and
// StopDeadline bounds how long a task told to stop may take.
//
// Everything runs on one event-loop thread (EventLoop): requests, worker messages, copy ends and
// deadlines are handlers on it; other threads post to it.
//
// A task answered by its worker before its switch's copy ended (the worker saw every group's
// flag; the copy engine has not retired the job) is answered when the Switcher reports that end
// (CopyEnded), with the copy's phases or its failure; the GPU stays held meanwhile, and the loop
// never waits for it.
//
// Training stops at its next layer (a step cut there is discarded). A preempted task's weights
// stay unsaved in its region and its optimizer state in its room of the weights pool
// (WeightsCache::KeepState), written back only when the room is needed, another training of the
// model comes, or it ends (WriteBack, SaveState);
// with the cache off, or --keep-preempted-training=false, both are copied to host memory at the
// stop. A run that ends for good has its weights (and buffers) checkpointed from the region back
// to the pinned store (never after a failed run, nor from a switch whose copy did not complete),
// so a preempted task resumes exactly. Those copies run off the loop (EndTraining, WriteBack),
// and so does the restore of a starting run's optimizer state from its checkpoint (a copy into
// the room the pool gave it): the run is placed and its switch started meanwhile, its Run
// waits for the restore's end (RestoreEnded), and the GPU stays held until that end whatever
// happens to the task, so nothing is freed or reused under the copy.
//
// A task whose inputs are still arriving (TaskSpec::inputs_arrival: a raw TCP payload) is queued
// and started like any other: when its turn comes it is placed, the old tenant told to stop and
// its model's copy started, but its Run waits for the arrival's end (InputsEnded), so the switch
// overlaps the payload's receipt. Meanwhile it owns the GPU, as a running inference does, but
// only for SchedulerOptions::inputs_hold while a task that can run at once waits: then it yields
// unrun (YieldUnrun) and goes back to the queue's head, its bytes still arriving; it is placed
// again once they are in, or earlier only when nothing else can run (and then yields at once to
// a ready task). An arrival that fails, a deadline, a cancel or shutdown abandon it unrun
// (AbandonUnrun): its switch is completed as a task that never touched the weights, so the region
// stays trusted once the copy ends, the worker is idle (a Prepare is only the worker's gate
// state), and the GPU goes to the next task. If its worker dies meanwhile it never ran there: it
// goes back to the queue's head once, like a yielded task (no second hold); a second death while
// it waits fails it, as a death fails a running task.
#ifndef PSWITCH_CONTROLLER_GPU_SCHEDULER_H_
#define PSWITCH_CONTROLLER_GPU_SCHEDULER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "base/log.h"
#include "controller/blocking_work.h"
#include "controller/bubble_admission.h"
#include "controller/bubble_bell.h"
#include "controller/event_loop.h"
#include "controller/loop_timer.h"
#include "controller/state_checkpoints.h"
#include "controller/stop_deadline.h"
#include "controller/switcher.h"
#include "controller/task_queue.h"
#include "controller/task_registry.h"
#include "controller/task_spec.h"
#include "controller/task_table.h"
#include "controller/telemetry.h"
#include "controller/training_state.h"
#include "controller/worker_pool.h"
#include "controller/worker_process.h"
#include "memdaemon/arena_layout.h"
#include "registry/model_catalog.h"

namespace pswitch::controller {

struct SchedulerOptions {
  int gpu = 0;  // this scheduler's GPU, named on each of its log lines
  Policy policy = Policy::kFcfs;
  bool inference_preempts_training = true;
  int workers = 3;  // 1 active + 2 standby
  WorkerSpawnOptions spawn;
  // Workers warm every model when they load it (worker/warm_up.h): pswitchd's --warm-up, on by
  // default where a first run pays one-off costs (CUDA).
  bool warm_ups = false;
  // The weights pool (a memdaemon lease) and how it caches models: region_offset and
  // region_bytes are filled in by the controller; the rest is the operator's
  // (--weights-cache, --weights-cache-bytes, --weights-cache-policy).
  uint64_t region_offset = 0;
  uint64_t region_bytes = 0;
  // The memdaemon's lease alignment, the unit workers are granted arena access in.
  uint64_t region_alignment = memdaemon::kLeaseAlignmentBytes;
  bool weights_cache = true;
  uint64_t weights_cache_bytes = 0;  // 0: the whole pool
  EvictionPolicy eviction_policy = EvictionPolicy::kCostAware;
  // Placement at arrival (--place-at-arrival): a task that waits while the running one stops
  // is placed at once on a standby worker, apart from the stopping tenant's region, its copy
  // started and its Run sent, so nothing of it waits for the old tenant's answer. False: placed
  // only once the GPU is free (the baseline).
  bool place_at_arrival = true;
  // With the cache on, while the GPU is idle (nothing running, placed or queued, no copy under
  // way), resident models move on the device into free holes where that merges the free space
  // (--weights-cache-compaction; WeightsCache::PlanMove), one at a time.
  bool compact_weights = true;
  // Optimizer-state checkpoints, shared by every GPU's scheduler; null = its own.
  std::shared_ptr<StateCheckpoints> checkpoints;
  // With the cache on, a preempted training task's trained weights stay in its region unsaved
  // and its optimizer state in the arena, for its next run (--keep-preempted-training); false:
  // both go to host memory at every stop (the baseline).
  bool keep_preempted_training = true;
  // Whether this is the daemon's only GPU. With several, a preempted task's weights are saved
  // at its stop as before (another GPU's training of the same model must start from them);
  // only its optimizer state stays resident.
  bool sole_gpu = true;
  // Preempted tasks' optimizer state kept in the weights pool takes at most this many bytes
  // (--optimizer-state-bytes); a stop that would exceed it saves the state to host memory.
  // Within it, a kept state goes to host memory only when the pool needs its room.
  uint64_t resident_state_bytes = UINT64_MAX;
  // An old tenant that has not drained this long after a switch asked it to is killed (its
  // stream may wait on a flag no one will write) and replaced.
  absl::Duration drain_timeout = absl::Seconds(30);
  // A tenant told to stop that is silent this long (six missed heartbeats: stopped or wedged;
  // a heartbeat comes from its own thread, so a busy tenant is heard) while a task is placed
  // ahead of it is killed then, not at worker_silence_timeout (the lesser of the two applies):
  // the task placed ahead runs meanwhile, but the tasks after it wait for the GPU.
  absl::Duration stopping_silence_timeout = absl::Seconds(3);
  // A ready worker silent this long (no heartbeat) is killed and replaced; its task fails
  // (unless its Run was never sent: see the header comment).
  absl::Duration worker_silence_timeout = absl::Seconds(10);
  // A task placed while its raw payload still arrives keeps the GPU at most this long after its
  // placement while a task that can run at once waits; then it yields unrun to the queue's head.
  absl::Duration inputs_hold = absl::Milliseconds(100);
  // Unfinished tasks (queued or running) this GPU accepts; beyond, Submit is refused.
  size_t max_queued_tasks = 4096;
  // Where tasks, switches, preemptions and worker deaths are counted (GET /metrics), shared by
  // every GPU's scheduler; null = its own.
  std::shared_ptr<Telemetry> telemetry;
  // Starts slot `worker_id`'s worker (tests: a fake one); unset: spawns a worker process with
  // `spawn`.
  std::function<absl::StatusOr<std::unique_ptr<WorkerLink>>(uint32_t worker_id,
                                                            WorkerProcess::EventHandler)>
      launch;
  // Tests: runs off the loop, on the state-copy thread, before a training run's optimizer state
  // is restored (e.g. to make the restore slow).
  std::function<void(uint64_t task)> before_state_restore;
  // Tests: runs off the loop, on the same thread, before a stopped training run's checkpoint
  // reads its region (e.g. to make the checkpoint slow).
  std::function<void(uint64_t task)> before_checkpoint;
};

// One GPU as GET /v1/gpus shows it.
struct GpuSnapshot {
  struct Worker {
    int slot = 0;
    int pid = 0;  // 0: no live process
    std::string state;  // WorkerPool::StateName
    bool active = false;  // placed last
  };
  int gpu = 0;
  std::string resident_model;  // the active worker's model while resident; empty: none
  // Every model whose weights the GPU's pool holds (WeightsCache), in address order.
  std::vector<ResidentModel> resident;
  WeightsCacheStats cache;
  uint64_t cache_capacity_bytes = 0;
  bool cache_enabled = true;
  std::vector<Worker> workers;
  size_t queue_depth = 0;  // unfinished tasks (queued or running), fill runs aside
  uint64_t arena_bytes = 0;
  uint64_t arena_used_bytes = 0;  // leased: weights region, workers' activations, fill leases
};

// Thread-safe: every public method may be called from any thread.
class GpuScheduler : private WorkerPool::Listener {
 public:
  static absl::StatusOr<std::unique_ptr<GpuScheduler>> Start(const SchedulerOptions& options,
                                                             memdaemon::MemDaemon* daemon,
                                                             registry::ModelCatalog* catalog);
  // Graceful: queued tasks are cancelled, a running task is stopped at its next sync point and
  // answered, workers are shut down and reaped.
  ~GpuScheduler() override;

  // Loads a newly registered model into every worker; `done` gets the first load error or OK.
  void AddModel(registry::EntryRef entry, ModelLoads::Done done);
  // Unloads `model` from this GPU (the catalog no longer lists it): its queued tasks fail
  // (Unavailable), a running training task of it is cancelled (stopped at its next iteration,
  // its weights saved as on any stop), a running inference batch finishes. Once none of its
  // tasks runs and no copy of it is in flight, the region stops counting as holding it and
  // every worker drops it (one still loading it, busy with another task, drops it after the
  // load); `done` runs then, on the loop (Cancelled when pswitchd shuts down first).
  void DropModel(std::string model, std::function<void(absl::Status)> done);
  // Queues a task (already validated); ResourceExhausted when max_queued_tasks are unfinished.
  // A task still queued or running at spec.expires fails with DeadlineExceeded (a running one
  // is told to stop, and killed if it does not). `done` runs exactly once, on the scheduler
  // thread. With spec.inputs_arrival set, its Run waits for the arrival's end, and an arrival
  // that fails fails it with that status.
  absl::StatusOr<uint64_t> Submit(TaskSpec spec, TaskCallback done);
  // Runs a fill task's bubble run (spec.fill set) when nothing else is queued or running; any
  // queued task preempts it (a resident run's bell is stopped too, so a run waiting between
  // bubbles ends at once). A run of one bubble stops at its bubble end by itself (step gate) or
  // at EndBubble; a resident run (spec.fill->bell) lives across bubbles until its steps are done
  // or it is stopped.
  uint64_t SubmitFill(TaskSpec spec, TaskCallback done);
  // The main job's bubble on this GPU ended: a fill run of one bubble is told to pause now; a
  // resident one was told by its bell, closed before this call; `resident` is what its bell said
  // then. Either's worker is SIGKILLed if it has not paused within `grace` (framework-enforced
  // limit): a resident run when, a grace after the close, the step it was in then is still
  // running (no bubble is opened for it meanwhile), or with no bubble opened since it is in a step
  // or began one well after the close, or it began a step with none open (its page says).
  struct ResidentClose {
    uint64_t opens = 0;         // BubbleBell::opens()
    uint64_t late_starts = 0;   // the page's count of steps begun with no bubble open
    int64_t step_start_ns = 0;  // the step it was in (0: none)
    int64_t closed_ns = 0;      // CLOCK_MONOTONIC
  };
  void EndBubble(absl::Duration grace, std::optional<ResidentClose> resident = std::nullopt);
  // Fill run `task_id` is to end without an error (its job moved, was cancelled, or another job
  // takes its bubbles): stopped like a preempted run (its bell rung, its worker killed past the
  // drain timeout), or answered as paused if it never started. Nothing for any other task.
  void StopFill(uint64_t task_id);
  absl::StatusOr<TaskStatus> Query(uint64_t task_id) const;
  // The `limit` most recent tasks, newest first.
  std::vector<TaskStatus> Recent(size_t limit) const;
  absl::Status Cancel(uint64_t task_id);
  // Blocks until every worker slot is up and has loaded every model (tests, start-up).
  bool AwaitWorkersReady(absl::Duration timeout) const;
  // The GPU's state, read on the loop; Unavailable when the loop does not answer within
  // `timeout` (busy, or stopped).
  absl::StatusOr<GpuSnapshot> Snapshot(absl::Duration timeout) const;
  // The models whose weights this GPU's cache holds, as of the loop's latest event. Any thread;
  // never waits for the loop.
  std::set<std::string> ResidentModels() const;
  // The arena's size and leased bytes (any thread, without the loop).
  std::pair<uint64_t, uint64_t> ArenaUse() const;
  // Unfinished tasks, queued or running, fill runs aside (any thread, without the loop).
  size_t queue_depth() const { return unfinished_.load(); }

 private:
  struct Running;

  GpuScheduler(const SchedulerOptions& options, memdaemon::MemDaemon* daemon,
               registry::ModelCatalog* catalog);
  base::Log Event(base::LogLevel level, absl::string_view event) const;
  // Runs `fn` on the loop, then AfterEvent. Dropped once the loop has ended.
  void Post(std::function<void()> fn) { loop_->Post(std::move(fn)); }
  // After every event: the stop deadline, shutdown, starting what can start, and the timers.
  void AfterEvent();  // loop entry point: asserts the role
  void Loop();

  // WorkerPool::Listener.
  void OnRunDone(int slot, const proto::RunDone& done) override;
  void OnDrained(int slot, uint64_t task, const proto::Drained& drained) override;
  void OnProgress(int slot, uint64_t task, uint32_t iterations) override;
  void OnWorkerDied(int slot, const absl::Status& why, bool killed, bool was_busy) override;

  void MaybeStart() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Whether the running task yields to what waits (preemption, or a fill run to any task).
  void MaybePreempt() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // While the running task stops, places the next waiting inference ahead (next_), where the
  // stopping tenant cannot write, and sends its Run at once: its copy and its compute overlap
  // the stop, and a slow or silent old tenant delays it not at all. Nothing when it cannot be.
  void PlaceAhead() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The GPU is idle: one resident model moved to merge the weights pool's free space, if that
  // helps (SchedulerOptions::compact_weights); the next move once its copy ended.
  void MaybeCompact() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The old tenant answered: the task placed ahead (running, or answered and waiting for its
  // copy's end) becomes the running one.
  void PromoteAhead() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The Stop a placed-ahead task's timeline records was answered (last_stopped_ns_ at or after
  // it): its "old tenant stopped" phase.
  void NoteOldStopped(SwitchTimeline& timeline) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  absl::Status StartTask(const TaskTicket& ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Copies the cache's resident models for ResidentModels (after each event).
  void PublishResident() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Task `task_id`'s inputs arrival ended (posted by its watcher): a task placed and waiting for
  // them gets its Run now; one whose bytes will never come fails, queued or placed.
  void InputsEnded(uint64_t task_id);  // loop entry point: asserts the role
  // The running task, placed but never sent its Run (its inputs had not arrived), fails with
  // `why` and gives the GPU back: at once, or when its switch's copy ends.
  void AbandonUnrun(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The running task's Run, held until its inputs arrived and its optimizer state was restored,
  // goes out once neither is awaited (and it was not told to stop); a failed send abandons it.
  void SendHeldRun() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Task `task_id`'s optimizer state (`optimizer_bytes` > 0, checkpointed under `key`) is
  // restored off the loop; RestoreEnded gets the result.
  // It lives in `room` of the weights pool, as its last run left it when `resident`.
  void RestoreState(uint64_t task_id, CheckpointKey key, uint64_t optimizer_bytes,
                    memdaemon::StateArea::Room room, bool resident)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The room of `run`'s optimizer state goes back to the pool (nothing reads or writes it any
  // more); no effect when it holds none.
  void FreeRunState(Running& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Whose optimizer state a task's run trains (the task's, or its fill job's), and its size
  // (0: none).
  static CheckpointKey StateKey(uint64_t task_id, const TaskSpec& spec);
  static uint64_t OptimizerBytes(const TaskSpec& spec, const registry::CatalogEntry& entry);
  // Saves the optimizer state kept for a preempted task under `key` to host memory, off the
  // loop (the pool needs its room): true when that is under way (StateWrittenBack ends it).
  bool SaveState(CheckpointKey key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The save ended: the room is free; a state that could not be saved fails its task.
  void StateWrittenBack(CheckpointKey key, uint64_t task, const absl::Status& saved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The restore of task `task_id`'s optimizer state ended (loop): the run gets its state and its
  // Run, or fails with why the state could not be restored; a run stopped meanwhile ends as a
  // run stopped before its first iteration (its state saved again when it resumes later), and
  // one abandoned meanwhile is answered now.
  void RestoreEnded(uint64_t task_id, absl::StatusOr<std::unique_ptr<TrainingState>> state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The running task, placed but waiting for its inputs past its hold while `to_task` could run
  // at once, gives the GPU back unrun: to the queue's head, its payload still arriving.
  void YieldUnrun(uint64_t to_task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Whether task `id`'s inputs are still arriving (a raw payload not yet all in).
  // Both are queue predicates (called from lambdas): they assert the loop's role themselves.
  bool InputsArriving(uint64_t id) const;
  // Whether task `id` yielded the GPU and its inputs are still arriving: it is placed again
  // only when no other task waits.
  bool Parked(uint64_t id) const {
    loop_role_.AssertHeld();
    const TaskRecord* record = tasks_table_.Find(id);
    return record != nullptr && record->inputs_yielded && InputsArriving(id);
  }
  // When the running task, waiting for its inputs, must yield to a ready queued task;
  // InfiniteFuture when it need not.
  absl::Time InputsHoldEnds() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Sends the Run; the task is then running (or switching) on `slot`.
  absl::Status SendRun(Running& run, int slot, const TaskSpec& spec, uint32_t batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // What a RunDone said, copied out of its frame (ReadRunDone) so it can wait for the switch's
  // copy to end: no flatbuffer pointer outlives the message.
  struct RunResult;
  // `placed`: the run's timeline so far.
  static RunResult ReadRunDone(int slot, const SwitchTimeline& placed,
                               const proto::RunDone& done);
  // What a run placed but never sent its Run ends with: `why` (OK for one stopped or yielded).
  static RunResult Unrun(const Running& run, absl::Status why);
  // Completes `run` with `result`, or, while its copy or its state's restore is in flight, keeps
  // it as a placeholder (no slot) in `*holder` (null: running_, holding the GPU) that CopyEnded
  // or RestoreEnded completes.
  void HoldOrComplete(std::unique_ptr<Running> run, RunResult result,
                      std::unique_ptr<Running>* holder = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Answers (or, for training, checkpoints) the run `run` whose worker reported `result`; its
  // switch's copy has ended, if it had one, so the answer carries the copy's phases (or fails
  // with the copy's error). The one completion of a run, whenever its RunDone came.
  void CompleteRun(std::unique_ptr<Running> run, RunResult result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The Switcher saw task `task`'s copy under `epoch` end (`copied`: OK, or why it failed): a
  // run answered before it, held since, is completed now; the end of an earlier placement's copy
  // is ignored. Loop entry point: asserts the role.
  void CopyEnded(uint64_t task, uint32_t epoch, const absl::Status& copied);
  // A training run ended (true: it is answered or requeued here, later). Its checkpoint runs
  // off the loop (checkpointing_): its weights go back to the pinned store unless the run failed
  // or its switch's copy did not complete, and an unfinished run's optimizer state is saved. The
  // GPU is free meanwhile (the next task runs); the model's region is held (being_checkpointed_,
  // Switcher::CheckpointReading), so nothing overwrites it, runs on it or unloads the model
  // before the checkpoint read it. TrainingSaved then requeues the run or answers it.
  bool EndTraining(Running& run, const TaskSpec& spec, const TaskOutcome& outcome,
                   absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // A training run's checkpoint ended (loop): `status` is the run's, or why its state was not
  // saved; `resumable` when its optimizer state was kept for a resume.
  void TrainingSaved(uint64_t task_id, absl::Status status, bool resumable, uint32_t iterations,
                     TaskOutcome outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Tells the running task to stop at its next sync point, once; it is killed if it has not
  // answered within the drain timeout.
  void StopRunning() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void EnforceStop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // When the stopping tenant counts as silent while a task waits behind it, placed ahead or
  // queued (InfiniteFuture: none waits), and killing it once it does.
  absl::Time SilentStopperDue() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void KillSilentStopper() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // A resident fill run that did not pause within its grace after its bubble closed is killed.
  void EnforceResidentPause() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // A fill run that never got the GPU is answered as paused at `at`.
  void AnswerUnstartedFill(uint64_t id, absl::Time at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The running task's resident bell (null: not a resident fill run).
  BubbleBell* RunningBell() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Fails queued tasks past their deadline and stops a running one.
  void EnforceDeadlines() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void Finish(uint64_t task_id, const absl::StatusOr<TaskOutcome>& outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Completes the unloads that nothing holds up any more (DropModel).
  void FinishUnloads() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // A placement took pinned model `moved`'s region (fragmentation; posted by the Switcher): it is
  // copied in again elsewhere, apart from `keep` and the placed tasks' models, behind the
  // placement's copy.
  void MovePinned(const std::string& moved, std::set<std::string> keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Writes `model`'s unsaved training weights (a preempted task's, kept in its region) back to
  // the pinned store, off the loop, the region held meanwhile (nothing runs on it, nothing
  // evicts it); the region is then clean and evictable. Once at a time per model. A write-back
  // that fails loses them: the task they belong to fails (DataLoss) rather than resume from
  // older weights.
  // Queued tasks whose unsaved weights were lost (untrusted since: a worker died mid-run on the
  // model, a run on it failed) fail now with DataLoss, not when their turn comes.
  void FailLostUnsaved() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  static absl::Status LostUnsaved(uint64_t task_id, const std::string& model);
  // Returns whether a write-back of `model` is in flight (WrittenBack comes). For an
  // optimizer state's name (WeightsCache::StateName): SaveState.
  bool WriteBack(const std::string& model) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Task `task_id`, just taken off the queue, ends with `why` (cancelled, past its deadline): at
  // once, or, a preempted training whose weights stayed unsaved, once they are written back.
  void EndQueued(uint64_t task_id, absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // When task `task_id`'s unsaved weights are in its region: their write-back starts (or is
  // under way) and the task ends with `why` once they are saved (WrittenBack). False otherwise.
  bool EndOnceSaved(uint64_t task_id, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void WrittenBack(const std::string& model, uint64_t task, uint64_t generation,
                   const absl::Status& saved) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);

  const SchedulerOptions options_;
  memdaemon::MemDaemon* const daemon_;
  registry::ModelCatalog* const catalog_;

  // Loop-thread state: guarded by the loop's role (EventLoop's LoopRole), which every handler
  // asserts and every loop-only method requires, so clang's -Wthread-safety checks it.
  TaskQueue queue_ ABSL_GUARDED_BY(loop_role_);
  TaskTable tasks_table_ ABSL_GUARDED_BY(loop_role_);  // every unfinished task, and deadlines
  std::shared_ptr<StateCheckpoints> checkpoints_;  // shared by every GPU's scheduler
  std::shared_ptr<Telemetry> telemetry_;           // likewise
  std::unique_ptr<Running> running_ ABSL_GUARDED_BY(loop_role_);
  // A task placed ahead while running_ stops (PlaceAhead): an inference whose inputs are all
  // in, its copy started and its Run sent, computing (or answered, its copy's end awaited: slot
  // -1) while running_ stops; it becomes running_ once running_ is done (PromoteAhead), and is
  // answered whenever it finishes (OnRunDone, CopyEnded).
  std::unique_ptr<Running> next_ ABSL_GUARDED_BY(loop_role_);
  // Training runs whose checkpoint reads their region off the loop (EndTraining to
  // TrainingSaved), each with the model it holds; the GPU is not held for them.
  std::map<uint64_t, std::string> being_checkpointed_ ABSL_GUARDED_BY(loop_role_);
  // Preempted training tasks whose weights stayed unsaved in their model's region (their
  // records' weights_unsaved), watched for a loss (FailLostUnsaved).
  std::set<uint64_t> unsaved_owners_ ABSL_GUARDED_BY(loop_role_);
  // Models whose unsaved weights a write-back reads now (WriteBack to WrittenBack).
  std::set<std::string> writing_back_ ABSL_GUARDED_BY(loop_role_);
  // Unloads waiting for their model's last task, copy or load to end (DropModel).
  std::vector<std::pair<std::string, std::function<void(absl::Status)>>> unloads_
      ABSL_GUARDED_BY(loop_role_);
  TaskRegistry tasks_;
  BubbleAdmission bubble_runs_ ABSL_GUARDED_BY(loop_role_);
  // The running resident fill run's pause at its last bubble's close, checked at `due`.
  struct ResidentPause {
    uint64_t task = 0;
    ResidentClose close;
    absl::Time due = absl::InfiniteFuture();
    absl::Duration grace;
  };
  std::optional<ResidentPause> resident_pause_ ABSL_GUARDED_BY(loop_role_);
  StopDeadline stop_deadline_ ABSL_GUARDED_BY(loop_role_);
  bool stopping_ ABSL_GUARDED_BY(loop_role_) = false;
  // When the last run told to stop answered (CLOCK_MONOTONIC ns; 0: none yet): the switch
  // breakdown's "old tenant stopped".
  int64_t last_stopped_ns_ ABSL_GUARDED_BY(loop_role_) = 0;

  // This GPU's event loop: every event is a handler on it, run on loop_thread_ one at a time;
  // no handler runs after Loop() returns, which the destructor joins before any member goes.
  // Shared with the callbacks of worker readers and copy engines, which may outlive this.
  const std::shared_ptr<EventLoop> loop_;
  const LoopRole& loop_role_;
  std::unique_ptr<WorkerPool> pool_ ABSL_PT_GUARDED_BY(loop_role_);
  std::unique_ptr<Switcher> switcher_ ABSL_PT_GUARDED_BY(loop_role_);
  std::atomic<size_t> unfinished_{0};  // submitted tasks not yet answered (not fill runs)
  // What the cache holds, published by the loop after each event for ResidentModels.
  mutable absl::Mutex resident_mu_;
  std::set<std::string> resident_ ABSL_GUARDED_BY(resident_mu_);
  // Preempted tasks' optimizer areas kept in the arena; used on checkpointing_'s thread only
  // (declared before it, so it outlives the copies still queued there).
  // Re-armed after every event to what is due next (AfterEvent).
  LoopTimer kill_timer_;         // stop_deadline_
  LoopTimer deadline_timer_;     // tasks' deadlines
  LoopTimer respawn_timer_;      // the pool's next restart
  LoopTimer silence_timer_;      // the pool's next worker silent too long
  LoopTimer shutdown_timer_;     // shutdown's bound on a running task
  LoopTimer inputs_hold_timer_;  // InputsHoldEnds
  std::thread loop_thread_;
  // Training state copies, off the loop: checkpoints (EndTraining) and restores (RestoreState),
  // one at a time in order, so a restore finds the checkpoint saved before it. Last: destroyed
  // first, once the loop has ended, it finishes the copies still queued before anything they
  // use goes.
  BlockingWork checkpointing_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_GPU_SCHEDULER_H_
