// The controller of one node: model registration (off the scheduling path, on its own thread)
// and task intake for its GPU scheduler. pswitchd's network front ends call only this.
#ifndef PSWITCH_CONTROLLER_CONTROLLER_H_
#define PSWITCH_CONTROLLER_CONTROLLER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "controller/gpu_scheduler.h"
#include "memdaemon/memdaemon.h"
#include "registry/model_catalog.h"

namespace pswitch::controller {

struct ControllerOptions {
  SchedulerOptions scheduler;
  // What looks at a model being registered (its build, facts and "auto" plan profile): pswitchd's
  // is a bounded child (registry::InspectInChild). Required.
  registry::ModelInspector inspector;
  uint32_t max_training_iterations = 1'000'000;
  // Bounds on what one request may ask for: samples per batch (registration, training, an
  // inference input's first dimension) and bytes of inference input.
  uint32_t max_batch = 256;
  uint64_t max_input_bytes = 48ull << 20;
  // Every task's server-side deadline: a client's own is capped by it, and a task without one
  // gets it. A task past its deadline fails (DeadlineExceeded); a running one is stopped.
  absl::Duration max_task_time = absl::Hours(24);
  // The most bytes of preempted training tasks' optimizer state (SGD momentum, Adam moments)
  // kept in each GPU's weights pool for their resume; beyond, a stop saves it to host memory.
  // 0 = no cap but the pool's (a kept state is saved when the pool needs its room). A running
  // task's state takes its room in the pool like a model.
  uint64_t optimizer_state_bytes = 0;
  // Host backend: inference tasks hold their GPU's simulated compute lock while they compute
  // (gpu/host/compute_lock.h), so they share the device with a main job as on a time-sliced
  // GPU (pswitchd --inference-device-lock).
  bool inference_holds_device_lock = false;
};

inline constexpr int kMaxGpus = 16;

// Thread-safe. `*daemon` must outlive the controller.
class Controller {
 public:
  // One memory daemon per GPU (its arena, flags, copy engine and worker socket). Reserves each
  // GPU's weights region and starts its workers. Registered weights are pinned once, in GPU 0's
  // store (portable pinned memory, so every GPU's copy engine reads them).
  static absl::StatusOr<std::unique_ptr<Controller>> Create(
      const ControllerOptions& options, const std::vector<memdaemon::MemDaemon*>& daemons);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // A registration's outcome: the model, and what each phase took, loading it into every
  // worker last ("load").
  struct Registered {
    registry::EntryRef entry;
    std::vector<registry::RegistrationPhase> phases;
    // The slowest warm step its workers measured (registry::WarmFor's fill purposes; zero: not
    // measured): what a fill job's first bubble is admitted by.
    absl::Duration infer_step;
    absl::Duration train_step;
  };
  using RegisterCallback = std::function<void(const absl::StatusOr<Registered>&)>;
  // Registers in the background; `done` runs once the model is in every worker. A model that
  // some worker fails to load (or warm up) is unloaded again before `done` gets the error.
  // `progress` (optional) is told each phase as it ends, the last ("load") before `done`.
  void Register(registry::ModelRequest request, RegisterCallback done,
                registry::PhaseObserver progress = nullptr);
  // The same, with the request made on the registration thread (it may read files: a model
  // repository's config), never on the caller's.
  using RequestMaker = std::function<absl::StatusOr<registry::ModelRequest>()>;
  void Register(RequestMaker make_request, RegisterCallback done,
                registry::PhaseObserver progress = nullptr);
  // A registration under way, as the repository index shows it (state LOADING).
  struct InProgress {
    std::string name;
    std::string owner;   // registry::ModelRequest::owner (empty: every principal sees it)
    // What it has done so far: "registering (read 0.00 s, inspect 1.30 s)", and how far the
    // running phase has come: "registering (read 0.00 s; inspect: profiling: run 2 of 4)".
    std::string reason;
  };
  std::vector<InProgress> RegistrationsInProgress() const;
  // Registers `name`, a copy of registered model `original` owned by `owner`
  // (registry::ModelCatalog::RegisterCopy: its weights as they are when the registration thread
  // gets to it), then loads it into every worker; `done` as Register's.
  void RegisterCopy(std::string original, std::string name, std::string owner,
                    RegisterCallback done);
  // Unloads model `name` from every GPU (GpuScheduler::DropModel says what happens to its
  // tasks), then frees its pinned weights and releases the name. Ordered with registrations (on
  // the registration thread), so a model's load into the workers always precedes its unload.
  // `done` gets NotFound / FailedPrecondition (registry::ModelCatalog::BeginUnload), or OK once it
  // is freed, from some scheduler's thread.
  void Unload(std::string name, std::function<void(absl::Status)> done);
  // Validates and queues a task. InvalidArgument / NotFound for a bad request.
  absl::StatusOr<uint64_t> Submit(TaskSpec spec, TaskCallback done) {
    return SubmitTo(0, std::move(spec), std::move(done));
  }
  // The same on GPU `gpu` (< gpus()): online fill requests run on the GPU whose bubble they use.
  absl::StatusOr<uint64_t> SubmitTo(size_t gpu, TaskSpec spec, TaskCallback done);
  // Submit's checks of `spec` alone (its model, inputs and bounds), queueing nothing.
  absl::Status Check(const TaskSpec& spec) const;
  absl::StatusOr<TaskStatus> Query(uint64_t task_id) const { return scheduler().Query(task_id); }
  std::vector<TaskStatus> RecentTasks(size_t limit) const { return scheduler().Recent(limit); }
  absl::Status Cancel(uint64_t task_id) { return scheduler().Cancel(task_id); }
  std::vector<registry::EntryRef> List() const { return catalog_->List(); }
  // Tasks run on GPU 0; every GPU runs fill tasks in its bubbles.
  GpuScheduler& scheduler() const { return *schedulers_[0]; }
  size_t gpus() const { return schedulers_.size(); }
  GpuScheduler& gpu(size_t index) const { return *schedulers_[index]; }
  registry::ModelCatalog& catalog() const { return *catalog_; }
  StateCheckpoints& checkpoints() const { return *checkpoints_; }

 private:
  explicit Controller(const ControllerOptions& options) : options_(options) {}
  void RegistrarLoop();
  // Queues `job` for the registration thread; false (nothing queued) once shutting down. The
  // caller answers then, outside mu_: callbacks may call back in.
  bool Enqueue(std::function<void()> job);
  using Done = ModelLoads::Done;
  // Starts something on every GPU's scheduler (`start` hands it its callback); `all` gets the
  // first error, or OK, and the slowest measured steps, once every GPU has called back.
  void OnEveryGpu(const std::function<void(GpuScheduler&, Done)>& start, Done all);
  // Has every GPU's workers load a newly registered `entry`; `done` gets it, or the first error.
  // Loads `entry` into every GPU's workers, then calls `done` with `phases` and the load's.
  void LoadEverywhere(registry::EntryRef entry, std::vector<registry::RegistrationPhase> phases,
                      RegisterCallback done, registry::PhaseObserver progress = nullptr);
  // RegistrationsInProgress's bookkeeping: Track returns the token Note and Untrack take (a
  // second registration of a name being registered must not touch the first one's entry).
  uint64_t Track(const std::string& name, const std::string& owner);
  void Note(const std::string& name, uint64_t token, const registry::RegistrationPhase* ended,
            bool loading);
  void Untrack(const std::string& name, uint64_t token);

  const ControllerOptions options_;
  std::unique_ptr<registry::ModelCatalog> catalog_;
  std::shared_ptr<StateCheckpoints> checkpoints_;
  std::vector<std::unique_ptr<GpuScheduler>> schedulers_;  // one per GPU

  absl::Mutex mu_;
  std::deque<std::function<void()>> registrations_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread registrar_;

  struct Tracked {
    uint64_t token = 0;
    std::string owner;
    std::vector<registry::RegistrationPhase> phases;  // ended so far
    registry::RegistrationPhase running;              // how far the running one has come
    bool loading = false;                             // the workers are loading it
  };
  mutable absl::Mutex progress_mu_;
  std::map<std::string, Tracked> in_progress_ ABSL_GUARDED_BY(progress_mu_);
  uint64_t next_token_ ABSL_GUARDED_BY(progress_mu_) = 0;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_CONTROLLER_H_
