// Fills the main job's pipeline bubbles with fill jobs (FreeRide, PipeFill). The main job reports
// each bubble on each GPU (BubbleBegin / BubbleEnd, the "bubble instruction") and registers each
// GPU's repeating bubble cycle; this class places fill jobs on GPUs with fill::FillScheduler,
// starts the chosen job's run on that GPU's scheduler at every bubble start (its model switched
// in by the same pipelined transmission), pauses it at the bubble end (SIGKILL after a grace
// period if it does not pause), and keeps each job's FreeRide state and progress between bubbles.
#ifndef PSWITCH_CONTROLLER_FILL_MANAGER_H_
#define PSWITCH_CONTROLLER_FILL_MANAGER_H_

#include <pthread.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "api/types.h"
#include "asio/post.hpp"
#include "asio/thread_pool.hpp"
#include "base/confined_dir.h"
#include "controller/bubble_bell.h"
#include "controller/controller.h"
#include "controller/fill_dataset.h"
#include "controller/fill_request.h"
#include "controller/online_fill.h"
#include "controller/telemetry.h"
#include "fill/bubble_cycle.h"
#include "fill/scheduler.h"
#include "fill/state_machine.h"

namespace pswitch::controller {

using api::FillJobStatus;
using api::FillStats;

struct FillManagerOptions {
  fill::FillPolicy policy = fill::FillPolicy::kFifo;
  absl::Duration grace = absl::Milliseconds(20);    // bubble end -> SIGKILL of an unpaused task
  absl::Duration margin = absl::Microseconds(300);  // step gate safety margin
  absl::Duration switch_overhead = absl::Milliseconds(1);  // planning: per-bubble switch-in
  bool host_compute_lock = false;  // fill steps hold gpu::ComputeLock::DefaultPath(gpu)
  // A job's run lives across bubbles (issue 30 item 1): started by a message at its first
  // bubble, woken at each later one by its bell (controller/bubble_bell.h) with its model, state
  // and outputs kept in its worker; false: one run (Prepare and Run) per bubble.
  bool resident_runs = true;
  // A resident run's training step still under way at a bubble's end waits there for the next
  // bubble rather than being cut (FillRunSpec::suspend_steps): a step longer than every bubble
  // still ends, and placement sees it as fill::kSuspendParts parts.
  bool suspend_steps = true;
  // Where clients' dataset and output names resolve; null: only jobs whose files are passed by
  // fd (FillRequest::dataset_fd, output_fd) may infer over a dataset.
  std::shared_ptr<const base::ConfinedDir> data_root;
  // A dataset is copied into a sealed memory file of pswitchd's (held while its job lives) and
  // read whole once to parse it, then copied once into the worker: bounded.
  uint64_t max_dataset_bytes = 2ull << 30;
  // The datasets' sealed copies held at once, all jobs together (each is charged from its
  // submission, or while its estimate runs, until its job ends).
  uint64_t max_total_dataset_bytes = 8ull << 30;
  // At most this many submissions and estimates admitted at once (queued for the I/O thread or
  // loading their dataset): one client spamming estimates cannot queue the I/O thread away from
  // everyone else's submissions and output writes.
  int max_loads_in_flight = 8;
  // Where bubble time, fill step time and pause latencies are counted (GET /metrics); null =
  // its own.
  std::shared_ptr<Telemetry> telemetry;
  // Online fill requests (SubmitOnline): what happens to one no bubble can serve in time, the
  // queues' bounds (its telemetry is the one above).
  OnlineFillOptions online;
};

// Thread-safe.
class FillManager {
 public:
  FillManager(Controller* controller, FillManagerOptions options)
      : controller_(controller),
        options_(options),
        telemetry_(options.telemetry ? options.telemetry : std::make_shared<Telemetry>()),
        online_(std::make_unique<OnlineFill>(
            [controller](int gpu, TaskSpec spec, TaskCallback done) {
              return controller->SubmitTo(static_cast<size_t>(gpu), std::move(spec),
                                          std::move(done));
            },
            OnlineWithTelemetry(options.online, telemetry_))) {
    // Named so that an operator (or a test) can tell the thread that does fill jobs' file work.
    Background([] { pthread_setname_np(pthread_self(), "pswitch-fill-io"); });
  }
  // Finishes the disk work already queued (an inference job's output is never lost).
  ~FillManager() { io_.wait(); }
  // Before the controller goes: submissions from now on (queued ones included) answer
  // Unavailable instead of registering with it; one registering now is waited for.
  void Shutdown();
  FillManager(const FillManager&) = delete;
  FillManager& operator=(const FillManager&) = delete;

  // Runs `work` on the fill manager's I/O thread: reading a job's dataset, writing its output.
  // Off the client event loop, the schedulers' loops and the fill lock, so no bubble signal and
  // no other client ever waits on a disk.
  void Background(std::function<void()> work) { asio::post(io_, std::move(work)); }

  // A place among the submissions and estimates admitted at once (ReserveLoad), held by its
  // copies until the last goes. Default-constructed: no place. Must not outlive its FillManager.
  class LoadSlot {
   public:
    LoadSlot() = default;
    bool held() const { return place_ != nullptr; }

   private:
    friend class FillManager;
    std::shared_ptr<void> place_;
  };
  // A place for one submission or estimate; ResourceExhausted naming the bound when
  // options.max_loads_in_flight are taken. Take it before queueing the work (Background).
  absl::StatusOr<LoadSlot> ReserveLoad();

  // InvalidArgument for a bad cycle or GPU. `origin` is the start of one of the main job's
  // iterations (time 0 of the cycle, for predictions); nullopt: now. Jobs not yet finished are
  // placed again; one that no longer fits anywhere is stopped with the reason.
  absl::Status RegisterCycle(int gpu, const fill::BubbleCycle& cycle,
                             std::optional<absl::Time> origin = std::nullopt);
  // Validates, then creates the job in the background (registering its private model); the job
  // is PAUSED, waiting for bubbles, once its model is registered. Without a held `slot` it
  // reserves one (ReserveLoad) for its load.
  absl::StatusOr<uint64_t> Submit(FillRequest request, LoadSlot slot = {});
  // What Submit would predict for `request` (its GPU, completion, deadline), submitting nothing.
  // A place as Submit's.
  absl::StatusOr<FillJobStatus> Estimate(FillRequest request, LoadSlot slot = {});
  // Stops the job (STOPPED, error Cancelled); a run in the current bubble ends with the bubble,
  // and an inference job's output not yet written is never written. NotFound for an unknown job,
  // FailedPrecondition for one already stopped or whose output is being written.
  absl::Status Cancel(uint64_t job_id);
  // Whether a client may unload `model`: a fill job's own model only once the job has stopped
  // (a finished training job's model is its result, kept until unloaded); FailedPrecondition
  // while the job still runs.
  absl::Status CheckUnload(const std::string& model) const;
  absl::StatusOr<FillJobStatus> Query(uint64_t job_id) const;
  // InvalidArgument for a GPU this daemon does not have.
  // `began_ns`: CLOCK_MONOTONIC time the bubble began at the main job (0: now); the bubble ends
  // `expected` after it, so a late message leaves the fill run less time, never more.
  absl::Status BubbleBegin(int gpu, absl::Duration expected, uint64_t free_bytes,
                           int64_t began_ns = 0);
  absl::Status BubbleEnd(int gpu);
  // An inference request with a latency objective (spec.online_slo) served in the first bubble
  // with room of any GPU running a main job (one with a bubble cycle): controller/online_fill.h.
  // With no main job on any GPU, it runs at once on GPU 0. Controller::Check's refusals, and
  // InvalidArgument for a training task; `done` runs exactly once if this returns OK.
  absl::StatusOr<uint64_t> SubmitOnline(TaskSpec spec, TaskCallback done);
  OnlineFillStats OnlineStats() const { return online_->Stats(); }
  FillStats Stats() const;
  // Every fill state's name (FillStateName) with its number of jobs, zeros included.
  std::map<std::string, int> JobsByState() const;
  // The bubble cycle registered for `gpu`; nullopt when none is (or no such GPU).
  std::optional<fill::BubbleCycle> Cycle(int gpu) const;

 private:
  struct Job {
    FillRequest request;
    std::string model_name;  // its private registered copy ("" for synthetic)
    fill::FillTaskStateMachine machine;
    int gpu = -1;
    int64_t steps_total = 0;
    int64_t steps_done = 0;
    uint32_t bubbles = 0;
    bool model_registered = false;  // its own model is in the catalog (unloaded at its end)
    bool writing_output = false;    // every row computed; its output is being written now
    bool run_out = false;           // a run of it is on a GPU, until its RunDone
    // Its resident runs ended in a row for bubbles opened that saw neither a step nor a part.
    int idle_runs = 0;
    absl::Duration predicted_step;  // the declared profile, then the smoothed measurement
    int64_t measured_runs = 0;
    absl::Time submitted;
    absl::Status error;
    std::vector<proto::HostTensor> outputs;  // inference, in step order
    // Dataset inference: pswitchd's sealed copy of the dataset, lent to its runs' workers as a
    // transfer region; dropped when the job stops.
    std::shared_ptr<const FillDataset> dataset;
    std::shared_ptr<void> dataset_charge;  // its bytes, against max_total_dataset_bytes
  };
  struct Validated {
    int64_t steps = 0;
    std::shared_ptr<const FillDataset> dataset;  // dataset inference
    std::shared_ptr<void> dataset_charge;
  };
  struct GpuState {
    std::optional<fill::BubbleCycle> cycle;
    absl::Time cycle_origin;
    bool in_bubble = false;
    absl::Time bubble_begin, bubble_end;
    uint64_t bubble_nvtx = 0;  // the open bubble's NVTX range (0: none, or no NVTX)
    std::optional<uint64_t> running_job;  // its run in the current (or last) bubble
    bool run_done = false;                // that run reported back (paused, done or failed)
    absl::Time run_done_at;
    bool ended = false;  // that run's bubble ended
    // The resident run on this GPU (options.resident_runs), from its start to its RunDone.
    struct Resident {
      uint64_t job = 0;
      std::shared_ptr<BubbleBell> bell;
      uint64_t task = 0;  // its run's task on the GPU's scheduler
      // What of the bell's report is already counted (it only grows within a run).
      uint64_t steps_seen = 0;
      int64_t step_ns_seen = 0;
      uint64_t overruns_seen = 0;
      // The bubble time opened for it (each bubble from its open to its end, and a grace after
      // each close): the most time its steps may have taken.
      int64_t open_ns = 0;
      int64_t closed_ns = 0;  // its last bubble's close, until its pause is recorded (0: none)
      // The step it was in at its last bubble's close (0: none): no bubble is opened for it while
      // that step still runs (it is being cut; the bell's new cut time would let it run on).
      int64_t close_step_start_ns = 0;
      int64_t closed_at_ns = 0;  // that close
      uint64_t parts_seen = 0;  // parts of split steps
      // What had been counted when its last bubble opened, and the bubbles in a row opened for
      // it in which it neither stepped nor overran (its own prediction shut it out).
      uint64_t steps_at_open = 0;
      uint64_t overruns_at_open = 0;
      uint64_t parts_at_open = 0;
      bool opened = false;  // a bubble was opened for it since the last look
      int idle_opens = 0;
    };
    std::optional<Resident> resident;
  };
  // What a run did, from its RunDone or (resident) its bell.
  struct RunCounts {
    uint64_t steps = 0;
    absl::Duration step_time;
    uint64_t iterations_done = 0;  // the job's steps done, the run's included
    bool overran = false;          // a step was cut at its bubble's end
    absl::Duration overrun_time;   // that step's time so far
  };

  // Unloads the job's own model, once (it ended).
  void UnloadModel(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RebuildScheduler() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckGpu(int gpu) const;
  // Checks `request` (filling in defaults) and returns the job's total steps and, for dataset
  // inference, its dataset, loaded (copied and parsed: call it on the I/O thread). An estimate
  // (`estimate`) writes nothing, so its output is not checked.
  absl::StatusOr<Validated> Validate(FillRequest& request, bool estimate) const;
  // The registered model of the user's own (pswitch.export) named `name`: a fill job may run a
  // copy of it, as of a zoo model. NotFound otherwise.
  absl::StatusOr<registry::EntryRef> OwnModel(const std::string& name) const;
  // Charges `bytes` of dataset `name`'s copy against options_.max_total_dataset_bytes until the
  // returned holder's last copy goes; ResourceExhausted naming the bound beyond it.
  absl::StatusOr<std::shared_ptr<void>> ChargeDataset(uint64_t bytes, absl::string_view name) const;
  // `job` as the fill scheduler sees it: in steps, or in parts for one whose steps split
  // (PartsPerStep).
  fill::FillJob SchedulerJob(uint64_t id, const Job& job) const;
  // Parts per step of a job whose steps go on across bubbles in a resident run: rows for dataset
  // inference (issue 30 item 2), fill::kSuspendParts for training with suspended steps; 1 for
  // any other job.
  int64_t PartsPerStep(const Job& job) const;
  absl::Status Place(uint64_t id, Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies a FreeRide transition; an illegal one is a bug in this class, logged loudly.
  static void Transition(uint64_t id, Job& job, fill::FillEvent event);
  // FailedPrecondition when `job`'s predicted step (and the margin) fits none of `gpu`'s bubbles.
  absl::Status StepFitsBubbles(uint64_t id, const Job& job, int gpu) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `measured_step`: its workers' slowest warm step at load (zero: not measured).
  void OnCreated(uint64_t id, absl::Status created, absl::Duration measured_step);
  void OnRunDone(int gpu, uint64_t id, const absl::StatusOr<TaskOutcome>& outcome);
  // `drop_checkpoint`: also drop the job's optimizer-state checkpoint (reaches into the
  // controller; false on the I/O thread, which may run after the controller is gone).
  void Stop(uint64_t id, Job& job, absl::Status error, bool drop_checkpoint = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordPause(int gpu, GpuState& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordPauseLatency(int gpu, absl::Duration latency) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts what a run did (steps, step time, the job's progress and predicted step).
  void Account(int gpu, uint64_t id, Job& job, const RunCounts& counts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts what `gpu`'s resident run reported on its bell since the last harvest, and its pause
  // after its last bubble's close once it paused.
  RunCounts Harvest(int gpu, GpuState& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens this bubble for `gpu`'s resident run (true), or stops the run when it should give the
  // GPU to another job or its memory (false: nothing opened).
  bool WakeResident(int gpu, GpuState& g, int64_t bubble_end_ns, absl::Duration left,
                    uint64_t free_bytes, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job the fill scheduler runs next in `gpu`'s bubbles; nullopt: none (or no cycle there).
  std::optional<uint64_t> NextJob(int gpu, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends job `id`'s resident run, wherever it is (its RunDone follows).
  void StopResident(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The least of a step `job` may start with: a whole step, or one row of a step that splits.
  absl::Duration MinStep(const Job& job) const;
  // The longest bubble of `gpu`'s cycle (zero: none registered).
  absl::Duration LongestBubble(int gpu) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TaskSpec RunSpec(uint64_t id, const Job& job, int gpu, int64_t bubble_end_ns,
                   uint64_t free_bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static OnlineFillOptions OnlineWithTelemetry(OnlineFillOptions online,
                                               std::shared_ptr<Telemetry> telemetry) {
    online.telemetry = std::move(telemetry);
    return online;
  }

  Controller* const controller_;
  const FillManagerOptions options_;
  const std::shared_ptr<Telemetry> telemetry_;
  const std::unique_ptr<OnlineFill> online_;  // stopped at Shutdown

  std::atomic<int> loads_in_flight_{0};  // places held (ReserveLoad)
  mutable std::atomic<uint64_t> dataset_bytes_{0};  // charged (ChargeDataset)

  // Held (shared) while a submission may call into the controller; Shutdown takes it exclusively.
  absl::Mutex lifecycle_mu_;
  bool shut_down_ ABSL_GUARDED_BY(lifecycle_mu_) = false;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<int, GpuState> gpus_ ABSL_GUARDED_BY(mu_);
  std::vector<int> stage_gpu_ ABSL_GUARDED_BY(mu_);  // fill scheduler stage -> GPU
  std::unique_ptr<fill::FillScheduler> scheduler_ ABSL_GUARDED_BY(mu_);
  FillStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> pause_latencies_ ABSL_GUARDED_BY(mu_);
  asio::thread_pool io_{1};  // last: its work uses every member above
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_FILL_MANAGER_H_
