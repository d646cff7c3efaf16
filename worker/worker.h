// A worker process: one per GPU slot (1 active + N standby). It maps the arena once, builds
// every registered model's structure over it once (LoadModel), and runs tasks with each layer
// gated on its group's ready flag, so a task starts computing while its model still streams in.
//
// Two threads, as in PipeSwitch: the control thread reads commands and raises the stop flag at
// once; the main thread computes, in command order. Stop is honoured at synchronisation points
// only (after an inference batch, between training iterations); the worker then reports the
// drain on its drain flag, which is what lets the next model overwrite the weights.
//
// A Run's tensors may lie in transfer regions pswitchd had the worker map (MapRegion,
// worker/region_map.h): each input is copied once into a tensor of the task's own before the
// first gate, and outputs go straight into Run.outputs_to (docs/dataplane.md).
#ifndef PSWITCH_WORKER_WORKER_H_
#define PSWITCH_WORKER_WORKER_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gpu/device.h"
#include "memdaemon/arena_client.h"
#include "models/training.h"
#include "proto/frame_channel.h"
#include "proto/host_tensor.h"
#include "proto/worker_generated.h"
#include "worker/arena_access.h"
#include "worker/executor.h"
#include "worker/fill_steps.h"
#include "worker/iterative_task.h"
#include "worker/layer_gate.h"
#include "worker/lease_allocator.h"
#include "worker/model_binding.h"
#include "worker/region_map.h"
#include "worker/stop_requests.h"

namespace pswitch::worker {

struct WorkerOptions {
  uint32_t worker_id = 0;
  gpu::Backend backend = gpu::Backend::kHost;
  std::string memdaemon_socket;
  std::string attach_secret;  // the one-time secret pswitchd issued for this worker's attach
  int control_fd = -1;  // connected socket to the controller, owned by the worker
  int device_ordinal = 0;  // CUDA: the device holding the arena (checked against the grant)
  absl::Duration group_timeout = absl::Seconds(30);
  // Bound on synchronising the stream before a drain; a worker that misses it exits (pswitchd
  // replaces it) rather than being reused with work stuck on its stream.
  absl::Duration drain_timeout = absl::Seconds(10);
  // Arena lease for intermediate tensors while a task runs; 0 = libtorch's own allocator.
  uint64_t activation_bytes = 0;
  // A Stop cuts a training step under way at its next layer (false: the step runs to its end,
  // the baseline bench-switch measures the stop against).
  bool cut_training_steps = true;
};

// How often a ready worker tells pswitchd it is alive (proto Heartbeat).
inline constexpr absl::Duration kWorkerHeartbeatInterval = absl::Milliseconds(500);

class Worker {
 public:
  // Opens the device, attaches the arena and announces itself (WorkerReady).
  static absl::StatusOr<std::unique_ptr<Worker>> Start(const WorkerOptions& options);
  ~Worker();
  // Serves commands until Shutdown or the controller goes away. Call from the main thread.
  absl::Status Serve();

 private:
  struct Command {
    std::vector<uint8_t> payload;  // a verified WorkerCommand
    UniqueFd fd;                   // passed with it (LoadModel: a script model's archive)
  };

  Worker() = default;
  void ControlLoop();
  absl::Status Execute(Command& command);
  absl::Status HandleDrop(const proto::DropModel& drop);
  // LoadModel's layer table and training order, checked for shape (BoundModel checks the rest).
  static absl::StatusOr<ModelLayout> LayoutFromWire(const proto::LoadModel& load);
  absl::Status HandleLoad(const proto::LoadModel& load, UniqueFd archive);
  // What `load` builds: a zoo architecture, or the archive in the memory file passed with it.
  static absl::StatusOr<models::ModelSource> SourceOf(const proto::LoadModel& load,
                                                      const UniqueFd& archive);
  absl::Status HandlePrepare(const proto::Prepare& prepare);
  // MapRegion/UnmapRegion. A region that cannot be mapped is reported with an Error event and
  // the worker goes on: the Runs naming it fail on their own ("not mapped").
  absl::Status HandleMapRegion(const proto::MapRegion& map, UniqueFd fd);
  absl::Status HandleUnmapRegion(const proto::UnmapRegion& unmap);
  absl::Status SendError(const absl::Status& status);
  absl::Status HandleRun(const proto::Run& run);
  struct TrainProgress {
    uint32_t iterations_done = 0;
    bool stopped_early = false;
    double loss = 0;
    bool step_cut = false;             // a Stop cut a step under way (RunDone.step_cut)
    int64_t first_layer_start_ns = 0;  // CLOCK_MONOTONIC, 0 = no gated model ran
    int64_t first_layer_done_ns = 0;
    std::vector<int64_t> group_gates_ns;  // groups 1, 2, ...: when each gate released
  };
  // The task bodies; they run inside HandleRun's gate and libtorch exception handling.
  absl::StatusOr<std::vector<proto::HostTensor>> Infer(BoundModel& bound, const proto::Run& run);
  // `fill` (may be null) gates each step of a fill task's run inside its bubble; `gate`: the
  // task's pass through the layer gate.
  absl::Status Train(BoundModel& bound, const proto::Run& run, LayerGate::Task& gate,
                     TrainProgress* progress, FillSteps* fill = nullptr);
  // A fill task's batch inference over its dataset's "input" rows, `batch` rows per step.
  absl::Status InferDataset(BoundModel& bound, const proto::Run& run, FillSteps& fill,
                            TrainProgress* progress, std::vector<proto::HostTensor>* outputs);
  // Runs `task` over run's steps [first_iteration, iterations) (see RunSteps).
  absl::Status RunTask(IterativeTask& task, const proto::Run& run, FillSteps* fill,
                       TrainProgress* progress);
  // A synthetic fill task (tests, benchmarks): steps that occupy the device for a set time.
  absl::Status RunSynthetic(const proto::Run& run, FillSteps& fill, TrainProgress* progress);
  absl::Status HandleStop(const proto::Stop& stop);
  // Drops the finished task's metadata (gradients, the optimizer and its state views). Runs
  // after the drain flag is written, while the next model is already being transmitted, or
  // before the next task when no switch came.
  void Clean();
  // When a fill run's step still under way is cut at a layer boundary (issue 30 item 2; a
  // training step leaves no trace, an inference step's rows run in a later bubble):
  // When a fill run's weights must be in (CLOCK_MONOTONIC ns): by its bubble's end, or for a
  // resident run within the group timeout.
  int64_t FillWeightsBy(const proto::FillRun& run, const FillSteps& fill) const;
  // `fill`'s cut word; null for any other run (and with cut_training_steps off).
  const std::atomic<int64_t>* FillCutAt(const FillSteps* fill) const;
  // The suspension of a resident training run's steps (FillSteps::suspend), null without one.
  const std::function<bool()>* FillSuspend(const FillSteps* fill) const;
  // A resident fill run's bell (FillRun.bell): its page in a mapped region, checked to be
  // pswitchd's whole page, in host memory the worker may write. Null for a run of one bubble.
  absl::StatusOr<fill::BellLayout*> FillBell(const proto::FillRun& fill) const;
  // The compute lock a Run names (device_lock_path), opened at its first use; null: none named.
  absl::StatusOr<const gpu::ComputeLock*> DeviceLock(const proto::Run& run);
  absl::Status SendEvent(flatbuffers::FlatBufferBuilder& builder);

  WorkerOptions options_;
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<memdaemon::ArenaClient> arena_;
  std::unique_ptr<ArenaAccess> access_;  // what of the arena this worker may touch now
  std::unique_ptr<gpu::Stream> stream_;
  LeaseAllocator* activations_ = nullptr;  // process lifetime: tensors it served may outlive us
  std::unique_ptr<Executor> executor_;  // the backend's way of computing
  // The transfer regions Runs' inputs and outputs_to name; uses executor_'s RegionDevice.
  std::unique_ptr<RegionMap> regions_;
  // Where tasks' tensors live: the CPU on the host backend, the GPU holding the arena on CUDA.
  c10::Device tensor_device_ = c10::Device(c10::kCPU);
  std::unique_ptr<proto::FrameChannel> control_;
  std::map<std::string, std::unique_ptr<BoundModel>, std::less<>> models_;
  std::unique_ptr<LayerGate> gate_;  // what the last Prepare said (set once the arena is attached)
  // The last task's (model, tenant), "" when its tenant was unknown: the activation lease is
  // cleared before a task of another owner (worker.cc, HandleRun).
  std::string lease_owner_;
  // What the last task left behind for Clean().
  BoundModel* dirty_model_ = nullptr;
  std::unique_ptr<models::Trainer> trainer_;
  // The dataset of the last dataset-inference fill task (kept across its bubbles), copied out of
  // region dataset_region_ (ids are never reused; 0: none).
  uint64_t dataset_region_ = 0;
  at::Tensor dataset_;
  StopRequests stops_;
  // Host backend: the simulated devices' compute locks inference Runs named, opened once each.
  std::map<std::string, gpu::ComputeLock, std::less<>> device_locks_;
  // The iterative run in progress (0: none) and its steps done, for the heartbeat's progress.
  // Written by the main thread (steps before the task, the task cleared after the run).
  std::atomic<uint64_t> live_task_{0};
  std::atomic<uint32_t> live_steps_{0};

  absl::Mutex send_mu_;
  absl::Mutex mu_;
  std::deque<Command> commands_ ABSL_GUARDED_BY(mu_);
  bool control_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_heartbeats_ ABSL_GUARDED_BY(mu_) = false;
  std::thread control_thread_;
  std::thread heartbeat_thread_;
  void HeartbeatLoop();
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_WORKER_H_
