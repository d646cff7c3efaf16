#include "worker/worker.h"

#include <c10/core/CPUAllocator.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/files.h"
#include "base/log.h"
#include "base/nvtx.h"
#include "base/status.h"
#include "gpu/copy_engine.h"
#include "memdaemon/arena_layout.h"
#include "models/safetensors.h"
#include "models/training.h"
#include "models/weights.h"
#include "proto/framing.h"
#include "proto/wire_status.h"
#include "proto/worker_generated.h"
#include "worker/backends.h"
#include "worker/dataset_inference.h"
#include "worker/executor.h"
#include "worker/host_tensors.h"
#include "worker/iterative_task.h"
#include "worker/layer_gate.h"
#include "worker/warm_up.h"

namespace pswitch::worker {
namespace {

// One training iteration per step. Every iteration's data and randomness depend on (seed, i)
// only, in any process on the same kind of device, so a resumed task continues exactly.
class TrainTask final : public IterativeTask {
 public:
  // `cut`: set by a Stop; a step under way is cut at its next layer boundary and not counted.
  // So is one still running at the time `cut_at_ns` holds (null: none), a fill step at its
  // bubble's end.
  // `suspend` (null: none): a resident fill run's, at the bubble's end the step waits there for
  // the next bubble instead of being cut (FillSteps::suspend).
  TrainTask(BoundModel& bound, models::Trainer& trainer, const proto::Run& run, c10::Device device,
            double* loss, const std::atomic<bool>* cut, const std::atomic<int64_t>* cut_at_ns,
            const std::function<bool()>* suspend, LayerGate::Task& gate)
      : bound_(bound),
        trainer_(trainer),
        run_(run),
        device_(device),
        loss_(loss),
        cut_(cut),
        cut_at_ns_(cut_at_ns),
        suspend_(suspend),
        gate_(gate) {}
  absl::Status Step(uint32_t i) override {
    uint64_t step_seed = run_.seed() * 1000003ull + i;
    torch::manual_seed(step_seed);
    const bool timed = bound_.TimeThisTrainingStep();
    const int64_t start = base::MonotonicNowNs();
    TrainingBatch batch = SyntheticTrainingBatch(bound_.model(), run_.batch(), step_seed, device_);
    const int64_t drawn = base::MonotonicNowNs();
    models::Trainer::StepParts parts;
    // A step that may be cut snapshots what its forward writes; while the copy is landing that
    // is read layer by layer, after each layer's weights came.
    const bool cuttable = cut_ != nullptr || cut_at_ns_ != nullptr;
    const bool weights_arriving = cuttable && !gate_.PassAllIfIn();
    absl::StatusOr<double> loss = trainer_.Step(
        batch.input, batch.target, timed ? &parts : nullptr,
        {cut_, cut_at_ns_, weights_arriving ? &bound_.training_call_buffers() : nullptr, suspend_});
    if (models::IsStepCut(loss.status())) return StepCutError();
    PSWITCH_RETURN_IF_ERROR(loss.status());
    *loss_ = *loss;
    if (timed) {
      const auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
      base::Log(base::LogLevel::kInfo, "training_step_parts")
          .Field("model", bound_.model().model_name())
          .Field("task", run_.task_id())
          .Field("step", i)
          .Field("batch_issue_ms", ms(drawn - start))
          .Field("forward_backward_issue_ms", ms(parts.forward_backward_ns))
          .Field("update_issue_ms", ms(parts.update_ns))
          .Field("loss_wait_ms", ms(parts.loss_wait_ns))
          .Field("total_ms", ms(base::MonotonicNowNs() - start))
          .Field("measured_ms", ms(bound_.measured_step_ns(/*training=*/true)));
    }
    return absl::OkStatus();
  }

 private:
  BoundModel& bound_;
  models::Trainer& trainer_;
  const proto::Run& run_;
  const c10::Device device_;
  double* const loss_;
  const std::atomic<bool>* const cut_;
  const std::atomic<int64_t>* const cut_at_ns_;
  const std::function<bool()>* const suspend_;
  LayerGate::Task& gate_;
};

// A synthetic step's "layers": how often it looks at the clock for its bubble's end.
constexpr int64_t kSyntheticLayerNs = 200'000;

// Tests and benchmarks: each step occupies the device for a set time and may allocate.
class SyntheticTask final : public IterativeTask {
 public:
  // `cut_at` (null: never) holds when a step still under way is cut: its bubble's end.
  SyntheticTask(const proto::FillRun& spec, const std::atomic<int64_t>* cut_at, c10::Device device)
      : spec_(spec), cut_at_(cut_at), device_(device) {}
  absl::Status Step(uint32_t) override {
    at::Tensor scratch;
    if (spec_.synthetic_alloc_bytes() > 0) {
      // Touches every page, as a real step would.
      scratch = torch::ones({static_cast<int64_t>(spec_.synthetic_alloc_bytes())},
                            torch::TensorOptions(torch::kUInt8).device(device_));
    }
    // Occupies the device in layer-sized slices, cut at the bubble's end as a real step is at a
    // layer boundary (issue 30 item 2).
    const int64_t end = base::MonotonicNowNs() + spec_.synthetic_step_ns();
    for (int64_t now = base::MonotonicNowNs(); now < end; now = base::MonotonicNowNs()) {
      const int64_t cut_at = cut_at_ != nullptr ? cut_at_->load(std::memory_order_relaxed) : 0;
      if (cut_at != 0 && now >= cut_at) return StepCutError();
      absl::SleepFor(absl::Nanoseconds(std::min<int64_t>(end - now, kSyntheticLayerNs)));
    }
    return absl::OkStatus();
  }

 private:
  const proto::FillRun& spec_;
  const std::atomic<int64_t>* const cut_at_;
  const c10::Device device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options) {
  PSWITCH_RETURN_IF_ERROR(CheckWorkerBackend(options.backend));
  std::unique_ptr<Worker> w(new Worker());
  w->options_ = options;
  w->control_ = std::make_unique<proto::FrameChannel>(UniqueFd(options.control_fd));
  gpu::DeviceOptions device;
  device.backend = options.backend;
  device.device_ordinal = options.device_ordinal;
  PSWITCH_ASSIGN_OR_RETURN(w->device_, gpu::Device::Open(device));
  PSWITCH_ASSIGN_OR_RETURN(
      w->arena_, memdaemon::ArenaClient::Attach(options.memdaemon_socket, w->device_.get(),
                                                options.worker_id, options.attach_secret));
  // Nothing of the arena but the flags until granted (issue 29 item 2); said once where the
  // backend cannot restrict a worker's mapping.
  const uint64_t granularity = w->arena_->arena().access_granularity();
  // Leases and regions must be whole units of access: a larger unit would reach a neighbour's
  // bytes.
  const uint64_t lease_alignment = w->arena_->lease_alignment_bytes();
  const bool restricted =
      granularity > 0 && lease_alignment >= granularity && lease_alignment % granularity == 0;
  if (!restricted && options.backend == gpu::Backend::kCuda && granularity > 0) {
    // A VMM import maps nothing until granted: it cannot run unrestricted.
    return absl::FailedPreconditionError(
        absl::StrCat("the arena grants access in units of ", granularity,
                     " bytes but the memdaemon aligns leases to ", lease_alignment));
  }
  if (restricted) {
    PSWITCH_RETURN_IF_ERROR(w->arena_->RestrictToFlags());
    if (!w->arena_->arena().read_only_access()) {
      base::Log(base::LogLevel::kWarn, "arena_read_only_unsupported")
          .Field("worker", options.worker_id)
          .Field("why",
                 "the driver refused a read-only mapping: a model this worker infers with is "
                 "mapped read-write (still nothing of any other tenant's)");
    }
  } else {
    base::Log(base::LogLevel::kWarn, "arena_access_not_restricted")
        .Field("worker", options.worker_id)
        .Field("backend", gpu::BackendName(options.backend))
        .Field("why",
               granularity == 0
                   ? std::string("this arena maps whole in every worker (a CUDA arena shared by "
                                 "IPC handle: pswitchd --cuda-vmm-arena=false)")
                   : absl::StrCat("units of access of ", granularity,
                                  " bytes span more than one lease (leases aligned to ",
                                  lease_alignment, ")"));
  }
  w->access_ = std::make_unique<ArenaAccess>(&w->arena_->arena(), restricted);
  PSWITCH_ASSIGN_OR_RETURN(w->stream_, w->device_->CreateStream());
  w->gate_ = std::make_unique<LayerGate>(&w->arena_->ready_flags(), options.group_timeout);
  ExecutorOptions executor;
  executor.backend = options.backend;
  executor.device_ordinal = options.device_ordinal;
  executor.arena_base = w->arena_->arena().base();
  if (options.activation_bytes > 0) {
    PSWITCH_ASSIGN_OR_RETURN(
        memdaemon::Lease lease,
        w->arena_->RequestLease(absl::StrCat("worker-", options.worker_id, "-activations"),
                                options.activation_bytes));
    PSWITCH_RETURN_IF_ERROR(w->access_->GrantForever(lease.offset, lease.bytes));
    executor.lease_base = w->arena_->arena().base() + lease.offset;
    executor.lease_bytes = lease.bytes;
  }
  // Installed once, before any task; libtorch keeps using its allocator for the process's life.
  PSWITCH_ASSIGN_OR_RETURN(w->executor_, CreateExecutor(executor));
  w->tensor_device_ = w->executor_->tensor_device();
  w->regions_ = std::make_unique<RegionMap>(&w->executor_->region_device());
  w->activations_ = w->executor_->host_activations();
  flatbuffers::FlatBufferBuilder b;
  auto ready = proto::CreateWorkerReady(b, ::getpid(), options.worker_id);
  proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::WorkerReady, ready.Union()));
  PSWITCH_RETURN_IF_ERROR(w->SendEvent(b));
  w->control_thread_ = std::thread([p = w.get()] { p->ControlLoop(); });
  w->heartbeat_thread_ = std::thread([p = w.get()] { p->HeartbeatLoop(); });
  return w;
}

void Worker::HeartbeatLoop() {
  // Its own thread, so a long step never silences it; only a stopped or wedged process does.
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_heartbeats_ || control_closed_;
  };
  while (!mu_.AwaitWithTimeout(absl::Condition(&done), kWorkerHeartbeatInterval)) {
    mu_.Unlock();
    flatbuffers::FlatBufferBuilder b;
    const uint64_t task = live_task_.load();
    auto beat = proto::CreateHeartbeat(b, task, task != 0 ? live_steps_.load() : 0);
    proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::Heartbeat, beat.Union()));
    const bool sent = SendEvent(b).ok();
    mu_.Lock();
    if (!sent) return;  // the controller is gone
  }
}

Worker::~Worker() {
  {
    absl::MutexLock lock(&mu_);
    stopping_heartbeats_ = true;
  }
  // Shutting the socket down ends the control thread's blocking read and any blocked heartbeat
  // send at once (whether or not the controller has closed its end), so both are joined, never
  // left running on freed members.
  if (control_ != nullptr) ::shutdown(control_->fd(), SHUT_RDWR);
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (control_thread_.joinable()) control_thread_.join();
}

absl::Status Worker::SendEvent(flatbuffers::FlatBufferBuilder& builder) {
  absl::MutexLock lock(&send_mu_);
  return control_->Send(builder);
}

void Worker::ControlLoop() {
  while (true) {
    absl::StatusOr<proto::ReceivedFrame> frame = control_->Receive();
    if (!frame.ok()) break;
    auto command = proto::VerifyPayload<proto::WorkerCommand>(frame->payload, "worker command");
    if (!command.ok()) break;  // the controller is ours: a bad frame means it is broken
    if ((*command)->body_type() == proto::WorkerCommandBody::Stop) {
      stops_.Received();  // seen by a running task at its next sync point
    }
    absl::MutexLock lock(&mu_);
    commands_.push_back(Command{std::move(frame->payload), std::move(frame->fd)});
  }
  absl::MutexLock lock(&mu_);
  control_closed_ = true;
}

absl::Status Worker::Serve() {
  while (true) {
    Command command;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !commands_.empty() || control_closed_;
      };
      mu_.Await(absl::Condition(&ready));
      if (commands_.empty()) return absl::OkStatus();  // controller gone: nothing left to do
      command = std::move(commands_.front());
      commands_.pop_front();
    }
    auto* cmd = flatbuffers::GetRoot<proto::WorkerCommand>(command.payload.data());
    if (cmd->body_type() == proto::WorkerCommandBody::Shutdown) return absl::OkStatus();
    PSWITCH_RETURN_IF_ERROR(Execute(command));
  }
}

absl::Status Worker::Execute(Command& command) {
  auto* cmd = flatbuffers::GetRoot<proto::WorkerCommand>(command.payload.data());
  switch (cmd->body_type()) {
    case proto::WorkerCommandBody::LoadModel:
      return HandleLoad(*cmd->body_as_LoadModel(), std::move(command.fd));
    case proto::WorkerCommandBody::Prepare:
      return HandlePrepare(*cmd->body_as_Prepare());
    case proto::WorkerCommandBody::Run:
      return HandleRun(*cmd->body_as_Run());
    case proto::WorkerCommandBody::Stop:
      return HandleStop(*cmd->body_as_Stop());
    case proto::WorkerCommandBody::DropModel:
      return HandleDrop(*cmd->body_as_DropModel());
    case proto::WorkerCommandBody::MapRegion:
      return HandleMapRegion(*cmd->body_as_MapRegion(), std::move(command.fd));
    case proto::WorkerCommandBody::UnmapRegion:
      return HandleUnmapRegion(*cmd->body_as_UnmapRegion());
    default:
      return absl::InvalidArgumentError("unknown worker command");
  }
}

absl::StatusOr<models::ModelSource> Worker::SourceOf(const proto::LoadModel& load,
                                                     const UniqueFd& archive) {
  models::ModelSource source;
  source.zoo_model = load.zoo_model()->str();
  if (load.archive_bytes() == 0) return source;
  const std::string what = absl::StrCat("model '", load.name()->str(), "': archive");
  if (!archive.valid()) return absl::InvalidArgumentError(absl::StrCat(what, " was not passed"));
  PSWITCH_ASSIGN_OR_RETURN(std::string bytes,
                           base::ReadSealedMemoryFile(archive, what, load.archive_bytes()));
  if (bytes.size() != load.archive_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", bytes.size(), " bytes, not ",
                                                   load.archive_bytes()));
  }
  source.archive = std::make_shared<const std::string>(std::move(bytes));
  source.archive_name = absl::StrCat("model ", load.name()->str());
  return source;
}

absl::StatusOr<ModelLayout> Worker::LayoutFromWire(const proto::LoadModel& load) {
  const std::string what = absl::StrCat("model '", load.name()->str(), "': layout");
  if (load.layout() == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " missing"));
  ModelLayout layout;
  layout.total_bytes = load.total_bytes();
  layout.layers.reserve(load.layout()->size());
  for (const proto::LayoutLayer* layer : *load.layout()) {
    const size_t tensors = layer->tensors() == nullptr ? 0 : layer->tensors()->size();
    const size_t sizes = layer->tensor_bytes() == nullptr ? 0 : layer->tensor_bytes()->size();
    if (tensors != sizes) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": layer '", layer->name()->str(),
                                                     "' names ", tensors, " tensors and sizes ",
                                                     sizes));
    }
    memdaemon::LayerSpec spec{layer->name()->str(), {}};
    spec.tensors.reserve(tensors);
    for (size_t t = 0; t < tensors; ++t) {
      spec.tensors.push_back({layer->tensors()->Get(t)->str(), layer->tensor_bytes()->Get(t)});
    }
    layout.layers.push_back(std::move(spec));
  }
  if (load.train_order() != nullptr) {
    layout.train_order.assign(load.train_order()->begin(), load.train_order()->end());
  }
  if (load.dtype() != nullptr) {
    PSWITCH_ASSIGN_OR_RETURN(layout.dtype, models::ParseModelDType(load.dtype()->str()));
  }
  return layout;
}

absl::Status Worker::HandleLoad(const proto::LoadModel& load, UniqueFd archive) {
  std::string name = load.name()->str();
  absl::Status status;
  const int64_t load_start = base::MonotonicNowNs();
  absl::StatusOr<models::ModelSource> source = SourceOf(load, archive);
  archive.Reset();
  absl::StatusOr<ModelLayout> layout = LayoutFromWire(load);
  if (!source.ok()) {
    status = source.status();
  } else if (!layout.ok()) {
    status = layout.status();
  } else if (load.weights_offset() > arena_->arena().size_bytes() ||
             load.total_bytes() > arena_->arena().size_bytes() - load.weights_offset()) {
    status = absl::OutOfRangeError(absl::StrCat("model '", name, "' region outside the arena"));
  } else {
    auto bound = BoundModel::Create(*source, name, arena_->arena().base() + load.weights_offset(),
                                    *layout, tensor_device_);
    if (bound.ok()) {
      models_[name] = std::move(*bound);
    } else {
      status = bound.status();
    }
  }
  const int64_t load_ns = base::MonotonicNowNs() - load_start;
  int64_t warm_ns = 0;
  WarmResult warmed;
  if (status.ok()) {
    const int64_t start = base::MonotonicNowNs();
    absl::StatusOr<WarmSpec> spec = WarmSpec::From(load.warm(), kMaxWarmBatch);
    // A warm-up reads its weights (whatever the region holds now) and writes none of them.
    absl::Status readable =
        spec.ok() && spec->batch > 0
            ? access_->GrantModel(models_[name]->region(), models_[name]->region_bytes(),
                                  gpu::Arena::Access::kRead)
            : absl::OkStatus();
    absl::StatusOr<WarmResult> result =
        !readable.ok() ? readable
        : spec.ok()    ? WarmUp(*models_[name], name, *spec,
                                WarmContext{*executor_, *stream_, activations_, tensor_device_,
                                         options_.group_timeout})
                       : spec.status();
    // The region it warmed on is where the model was bound at load, not where its tasks will
    // find it (Prepare grants that): nothing of it stays readable.
    if (absl::Status ended = access_->EndModel(); !ended.ok()) return ended;
    warm_ns = base::MonotonicNowNs() - start;
    if (result.ok()) {
      warmed = *std::move(result);
      models_[name]->set_measured_steps(warmed.infer_step_ns, warmed.train_step_ns);
    } else {
      status = result.status();
      models_.erase(name);  // a model that cannot run here is not left loaded
    }
  }
  flatbuffers::FlatBufferBuilder b;
  auto error = status.ok() ? 0 : proto::CreateWireError(b, status);
  auto train_error =
      warmed.train_status.ok() ? 0 : b.CreateString(std::string(warmed.train_status.message()));
  auto loaded = proto::CreateModelLoaded(b, b.CreateString(name), error, warm_ns, load_ns,
                                         warmed.infer_step_ns, warmed.train_step_ns, train_error);
  proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::ModelLoaded, loaded.Union()));
  return SendEvent(b);
}

absl::Status Worker::SendError(const absl::Status& status) {
  flatbuffers::FlatBufferBuilder b;
  auto error = proto::CreateWireError(b, status);
  proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::Error, error.Union()));
  return SendEvent(b);
}

absl::Status Worker::HandleMapRegion(const proto::MapRegion& map, UniqueFd fd) {
  RegionSpec spec;
  spec.region = map.region();
  spec.bytes = map.bytes();
  spec.file_offset = map.file_offset();
  if (const auto* handle = map.cuda_ipc_handle(); handle != nullptr && handle->size() > 0) {
    spec.cuda_ipc_handle.assign(reinterpret_cast<const char*>(handle->data()), handle->size());
  }
  spec.device = map.device();
  absl::Status mapped = regions_->Map(spec, std::move(fd));
  base::Log(mapped.ok() ? base::LogLevel::kDebug : base::LogLevel::kWarn, "worker_region_mapped")
      .Field("worker", options_.worker_id)
      .Field("region", spec.region)
      .Field("bytes", spec.bytes)
      .Field("regions", regions_->size())
      .Field("error", std::string(mapped.message()));
  if (mapped.ok()) return absl::OkStatus();
  // Not the worker's failure: pswitchd hears which region and why, and maps it again before the
  // next Run that names it; the Runs already queued naming it fail alone, with the reason.
  flatbuffers::FlatBufferBuilder b;
  auto error = proto::CreateWireError(b, mapped);
  auto failed = proto::CreateRegionMapFailed(b, spec.region, error);
  proto::Finish(
      b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::RegionMapFailed, failed.Union()));
  return SendEvent(b);
}

absl::Status Worker::HandleUnmapRegion(const proto::UnmapRegion& unmap) {
  // Commands run in order, so no Run that names the region is still in flight: every Run before
  // this one has finished with its stream synchronised (HandleRun), its DMA included.
  absl::Status unmapped = regions_->Unmap(unmap.region());
  if (!unmapped.ok()) {
    base::Log(base::LogLevel::kWarn, "worker_region_unmap_failed")
        .Field("worker", options_.worker_id)
        .Field("error", std::string(unmapped.message()));
  }
  return absl::OkStatus();
}

absl::Status Worker::HandleDrop(const proto::DropModel& drop) {
  const std::string name = drop.name()->str();
  Clean();  // the last task's leftovers may be this model's
  const bool had = models_.erase(name) > 0;
  gate_->Forget(name);
  // Its region is another model's next: whatever model region this worker held goes with it
  // (the next Prepare grants again).
  if (had) PSWITCH_RETURN_IF_ERROR(access_->EndModel());
  base::Log(base::LogLevel::kInfo, "worker_model_unloaded")
      .Field("worker", options_.worker_id)
      .Field("model", name)
      .Field("was_loaded", had)
      .Field("models_left", models_.size());
  return absl::OkStatus();
}

absl::Status Worker::HandlePrepare(const proto::Prepare& prepare) {
  // Whatever happens below, no Run may use the gate of an earlier Prepare of this model.
  gate_->Forget(prepare.model()->str());
  auto it = models_.find(prepare.model()->str());
  if (it == models_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("prepare for model '", prepare.model()->str(), "' that was never loaded"));
  }
  // Where the weights cache put the model: checked against the arena, then one pointer moves.
  const uint64_t arena_bytes = arena_->arena().size_bytes();
  if (prepare.weights_offset() > arena_bytes ||
      it->second->region_bytes() > arena_bytes - prepare.weights_offset()) {
    return absl::OutOfRangeError(absl::StrCat("model '", prepare.model()->str(), "' region at ",
                                              prepare.weights_offset(), " outside the arena"));
  }
  it->second->Rebind(arena_->arena().base() + prepare.weights_offset());
  // Readable from now, while its copy runs: the Run that follows usually finds it granted
  // (a training Run makes it writable).
  PSWITCH_RETURN_IF_ERROR(access_->GrantModel(it->second->region(), it->second->region_bytes(),
                                              gpu::Arena::Access::kRead));
  std::vector<uint32_t> last;
  if (prepare.group_last_layer() != nullptr) {
    last.assign(prepare.group_last_layer()->begin(), prepare.group_last_layer()->end());
  }
  gate_->Set(LayerGate::FromLastLayers(prepare.model()->str(), prepare.epoch(), prepare.flag_base(),
                                       last, it->second->num_layers()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<proto::HostTensor>> Worker::Infer(BoundModel& bound,
                                                             const proto::Run& run) {
  bound.model().eval();
  torch::NoGradGuard no_grad;
  PSWITCH_ASSIGN_OR_RETURN(std::vector<proto::HostTensor> inputs,
                           proto::FromWireTensors(run.inputs()));
  // Each input copied once into a tensor of the task's own, before the first layer's gate (on
  // CUDA: queued on the compute stream ahead of group 0's wait, overlapping the transmission).
  PSWITCH_ASSIGN_OR_RETURN(models::ModelInput input,
                           TaskInputOn(inputs, *regions_, tensor_device_));
  models::ModelOutput out = bound.model().Forward(input);
  if (const proto::Slice* to = run.outputs_to(); to != nullptr) {
    return WriteOutputsToRegion({NamedTensor{"output", out.output}},
                                proto::ByteSlice{to->region(), to->offset(), to->length()},
                                *regions_);
  }
  PSWITCH_ASSIGN_OR_RETURN(proto::HostTensor output, ToHostTensor("output", out.output));
  return std::vector<proto::HostTensor>{std::move(output)};
}

absl::Status Worker::Train(BoundModel& bound, const proto::Run& run, LayerGate::Task& gate,
                           TrainProgress* progress, FillSteps* fill) {
  models::TrainerOptions options{run.optimizer() == proto::Optimizer::Adam
                                     ? models::OptimizerKind::kAdam
                                     : models::OptimizerKind::kSgd,
                                 run.learning_rate(), run.momentum()};
  // The optimizer state lives in the controller's arena lease, so a preempted task resumes with
  // it in whichever worker runs it next.
  const uint64_t arena_bytes = arena_->arena().size_bytes();
  if (run.optimizer_state_offset() > arena_bytes ||
      run.optimizer_state_bytes() > arena_bytes - run.optimizer_state_offset()) {
    return absl::OutOfRangeError("optimizer state outside the arena");
  }
  models::ExternalOptimizerState state{
      std::span<std::byte>(arena_->arena().base() + run.optimizer_state_offset(),
                           run.optimizer_state_bytes()),
      run.first_iteration()};
  PSWITCH_RETURN_IF_ERROR(access_->GrantForTask(state.storage.data(), state.storage.size(),
                                                gpu::Arena::Access::kReadWrite));
  dirty_model_ = &bound;
  PSWITCH_ASSIGN_OR_RETURN(trainer_, models::Trainer::Create(bound.model(), options, &state));
  TrainTask task(bound, *trainer_, run, tensor_device_, &progress->loss,
                 options_.cut_training_steps ? &stops_.pending() : nullptr, FillCutAt(fill),
                 FillSuspend(fill), gate);
  return RunTask(task, run, fill, progress);
}

absl::Status Worker::InferDataset(BoundModel& bound, const proto::Run& run, FillSteps& fill,
                                  TrainProgress* progress,
                                  std::vector<proto::HostTensor>* outputs) {
  // The rows lie in pswitchd's sealed copy of the dataset, mapped like any transfer region: no
  // path is opened here, and the slice is checked against this worker's own mapping.
  if (run.fill()->dataset() == nullptr) {
    return absl::InvalidArgumentError("a dataset-inference fill run names no dataset");
  }
  PSWITCH_ASSIGN_OR_RETURN(proto::HostTensor rows, proto::FromWireTensor(*run.fill()->dataset()));
  if (rows.place != proto::Place::Region || rows.shape.empty()) {
    return absl::InvalidArgumentError("a fill run's dataset must be rows in a region");
  }
  if (dataset_region_ != rows.slice.region || !dataset_.defined()) {
    dataset_ = at::Tensor();
    dataset_region_ = 0;
    // Kept across bubbles, so not in the task's lease (it would count against every later
    // task's memory).
    if (activations_ != nullptr) activations_->set_active(false);
    absl::StatusOr<at::Tensor> copied = TensorFromRegion(rows, *regions_, c10::Device(c10::kCPU));
    if (activations_ != nullptr) activations_->set_active(true);
    PSWITCH_RETURN_IF_ERROR(copied.status());
    dataset_ = *std::move(copied);
    dataset_region_ = rows.slice.region;
  }
  // A resident run splits a step to fit what is left of its bubble; a run of one bubble ends
  // there, and would lose the parts.
  if (fill.resident()) fill.SetSplittable(std::max<uint32_t>(run.batch(), 1));
  bound.model().eval();
  DatasetInferenceTask task(
      [&bound](const at::Tensor& rows) {
        models::ModelInput input;
        input.input = rows;
        return bound.model().Forward(input).output;
      },
      dataset_, run.batch(), tensor_device_, outputs,
      fill.resident() ? DatasetInferenceTask::RowBudget{[&fill] { return fill.RowsThatFit(); },
                                                        [&fill] { fill.PartDone(); }}
                      : DatasetInferenceTask::RowBudget{});
  return RunTask(task, run, &fill, progress);
}

absl::Status Worker::RunSynthetic(const proto::Run& run, FillSteps& fill, TrainProgress* progress) {
  SyntheticTask task(*run.fill(), fill.cut_at(), tensor_device_);
  return RunTask(task, run, &fill, progress);
}

absl::Status Worker::RunTask(IterativeTask& task, const proto::Run& run, FillSteps* fill,
                             TrainProgress* progress) {
  StepProgress steps;
  steps.live_steps = &live_steps_;
  live_steps_.store(run.first_iteration());
  live_task_.store(run.task_id());
  absl::Status status =
      RunSteps(task, run.first_iteration(), run.iterations(), stops_.pending(), fill, &steps);
  live_task_.store(0);
  progress->iterations_done = steps.steps_done;
  progress->stopped_early = steps.stopped_early;
  progress->step_cut = steps.step_cut;
  return status;
}

void Worker::Clean() {
  if (dirty_model_ != nullptr) {
    // Gradients would otherwise hold lease memory until the model trains again.
    for (at::Tensor& p : dirty_model_->model().parameters()) p.mutable_grad() = at::Tensor();
    dirty_model_->model().eval();
    dirty_model_ = nullptr;
  }
  trainer_.reset();
}

int64_t Worker::FillWeightsBy(const proto::FillRun& run, const FillSteps& fill) const {
  // A resident run has later bubbles: its weights may take longer than its first one.
  if (fill.resident()) {
    return base::MonotonicNowNs() + absl::ToInt64Nanoseconds(options_.group_timeout);
  }
  return run.bubble_end_ns();
}

const std::atomic<int64_t>* Worker::FillCutAt(const FillSteps* fill) const {
  if (fill == nullptr || !options_.cut_training_steps) return nullptr;
  return fill->cut_at();
}

const std::function<bool()>* Worker::FillSuspend(const FillSteps* fill) const {
  // Suspended at a point where it would have been cut: no cut point, no suspension either.
  if (FillCutAt(fill) == nullptr) return nullptr;
  return fill->suspend();
}

absl::StatusOr<fill::BellLayout*> Worker::FillBell(const proto::FillRun& fill) const {
  const proto::Slice* at = fill.bell();
  if (at == nullptr) return nullptr;
  PSWITCH_ASSIGN_OR_RETURN(RegionBytes page, regions_->Slice(proto::ByteSlice{
                                                 at->region(), at->offset(), at->length()}));
  // pswitchd's own page: sealed (it cannot lose a page under the run), host memory, writable,
  // whole and aligned for its atomics.
  if (page.on_device || page.may_shrink || !page.writable || page.bytes != fill::kBellBytes ||
      reinterpret_cast<uintptr_t>(page.data) % alignof(fill::BellLayout) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a fill run's bell must be a whole page of pswitchd's, not ", page.what));
  }
  return reinterpret_cast<fill::BellLayout*>(page.data);
}

absl::StatusOr<const gpu::ComputeLock*> Worker::DeviceLock(const proto::Run& run) {
  if (run.device_lock_path() == nullptr || run.device_lock_path()->size() == 0) return nullptr;
  const std::string path = run.device_lock_path()->str();
  auto it = device_locks_.find(path);
  if (it == device_locks_.end()) {
    PSWITCH_ASSIGN_OR_RETURN(gpu::ComputeLock lock, gpu::ComputeLock::Open(path));
    it = device_locks_.emplace(path, std::move(lock)).first;
  }
  return &it->second;
}

absl::Status Worker::HandleRun(const proto::Run& run) {
  Clean();  // no switch came since the last task: its leftovers go now
  const std::string model_name = run.model()->str();
  auto it = models_.find(model_name);
  std::vector<proto::HostTensor> outputs;
  TrainProgress progress{run.first_iteration(), false, 0, 0, 0};
  absl::Status status;
  std::optional<LayerGate::Task> gated;  // a model ran behind its ready flags
  // Tenants never see each other's data: lease bytes an earlier task of another model or
  // principal touched are zeroed before this task gets them. With no principal on the Run, any
  // task may be another principal's, so every such task is a new owner.
  const std::string tenant = run.tenant() != nullptr ? run.tenant()->str() : std::string();
  const std::string owner =
      tenant.empty() ? std::string() : absl::StrCat(model_name, std::string(1, '\0'), tenant);
  if (owner.empty() || owner != lease_owner_) executor_->NewActivationOwner();
  lease_owner_ = owner;
  std::unique_ptr<FillSteps> fill;
  if (run.fill() != nullptr) {
    // Never predicted shorter than this worker measured the step at load.
    const absl::Duration measured =
        it != models_.end() ? absl::Nanoseconds(it->second->measured_step_ns(run.training()))
                            : absl::ZeroDuration();
    absl::StatusOr<fill::BellLayout*> bell = FillBell(*run.fill());
    absl::StatusOr<std::unique_ptr<FillSteps>> steps =
        bell.ok() ? FillSteps::Create(*run.fill(), &stops_.pending(), measured, *bell)
                  : bell.status();
    if (steps.ok()) {
      fill = std::move(*steps);
    } else {
      status = steps.status();
    }
  }
  // A fill task's memory cap bounds its allocations for this run only.
  executor_->SetActivationLimit(fill ? run.fill()->memory_cap() : 0);
  // Every kernel of the task goes to the compute stream, behind the gate's ready-flag waits.
  std::unique_ptr<ComputeSection> compute;
  if (status.ok()) {
    absl::StatusOr<std::unique_ptr<ComputeSection>> entered = executor_->Enter(*stream_);
    if (entered.ok()) {
      compute = std::move(*entered);
    } else {
      status = entered.status();
    }
  }
  // A resident training run's step waits out the main job's compute where it would have been cut
  // (issue 30), once what it queued has run: its activations stay in its lease meanwhile.
  // Only where the step has cut points to suspend at (FillCutAt). pswitchd asks for it on the host
  // backend only (tools/pswitchd.cc says why); there nothing is queued: `compute` is null.
  if (status.ok() && fill && run.training() && run.fill()->suspend_steps() &&
      FillCutAt(fill.get()) != nullptr) {
    fill->SetSuspendable([this, &compute] {
      if (compute != nullptr) {
        (void)compute->Synchronize("a suspended fill step", options_.group_timeout);
      }
    });
  }
  if (!status.ok()) {
    // reported below
  } else if (fill && run.fill()->kind() == proto::FillRunKind::Synthetic) {
    ScopedLeaseAllocation from_lease(activations_);
    absl::Status task_status;
    status = models::CatchTorch("synthetic fill task",
                                [&] { task_status = RunSynthetic(run, *fill, &progress); });
    if (status.ok()) status = task_status;
  } else if (it == models_.end() || !gate_->Prepared(model_name)) {
    status = absl::FailedPreconditionError(
        absl::StrCat("run of model '", model_name, "' without load and prepare"));
  } else if (absl::Status in =
                 fill ? gate_->AwaitAll(FillWeightsBy(*run.fill(), *fill)) : absl::OkStatus();
             !in.ok()) {
    // The fill model is not in before its bubble ends: pause without a step (its transmission
    // goes on; the next bubble finds the weights in place).
    if (absl::IsDeadlineExceeded(in)) {
      progress.stopped_early = true;
    } else {
      status = in;
    }
  } else {
    BoundModel& bound = *it->second;
    const bool training = run.training();
    // The model's region, read-only unless the task trains (its optimizer state: Train);
    // usually granted at Prepare already. A failed grant leaves this worker's access unknown:
    // it runs no task any more (its exit fails this one, with the reason in its log).
    PSWITCH_RETURN_IF_ERROR(
        access_->GrantModel(bound.region(), bound.region_bytes(),
                            training ? gpu::Arena::Access::kReadWrite : gpu::Arena::Access::kRead));
    // A training step under way is cut at its next layer by a Stop (a preemption waits for
    // one layer, not a whole step); an inference runs to its end.
    gated.emplace(*gate_, bound, training, *stream_, model_name, run.task_id(),
                  training && options_.cut_training_steps ? &stops_.pending() : nullptr,
                  FillCutAt(fill.get()), training ? FillSuspend(fill.get()) : nullptr);
    ScopedLeaseAllocation from_lease(activations_);
    // Host backend: an inference computes on the simulated device, time-sliced with the main
    // job's stages (fill steps hold it per step, in FillSteps).
    std::optional<gpu::ComputeLock::Hold> device;
    if (!training && !fill) {
      absl::StatusOr<const gpu::ComputeLock*> lock = DeviceLock(run);
      if (!lock.ok()) {
        status = lock.status();
      } else if (*lock != nullptr) {
        device.emplace((*lock)->Acquire());
      }
    }
    if (status.ok())
      status = gated->Run([&]() -> absl::Status {
        if (training) return Train(bound, run, *gated, &progress, fill.get());
        if (fill) return InferDataset(bound, run, *fill, &progress, &outputs);
        PSWITCH_ASSIGN_OR_RETURN(outputs, Infer(bound, run));
        return absl::OkStatus();
      });
  }
  // The task's synchronisation point: its final weights (and optimizer state) are in the arena
  // before RunDone lets pswitchd checkpoint them, and late kernel errors are this task's.
  if (compute != nullptr) {
    absl::Status synced =
        compute->Synchronize(absl::StrCat("model '", model_name, "'"), options_.group_timeout);
    // Work still on the stream (a wait on a flag no one writes) may later touch the weights
    // region: this worker must never be reused. Exiting without an answer tears its context
    // down; pswitchd fails the task with the reason and replaces the worker.
    if (absl::IsDeadlineExceeded(synced)) return synced;
    if (status.ok()) status = synced;
  }
  if (gated) {
    LayerGate::Task::Marks marks = gated->TakeMarks();
    progress.first_layer_start_ns = marks.first_layer_start_ns;
    progress.first_layer_done_ns = marks.first_layer_done_ns;
    progress.group_gates_ns = std::move(marks.group_gates_ns);
    if (status.ok()) {
      status = gated->CheckEpoch();
      if (!status.ok()) outputs.clear();
    }
    gated.reset();  // the model's gate hook goes
  }
  flatbuffers::FlatBufferBuilder b;
  auto wire_outputs = proto::CreateWireTensors(b, outputs);
  auto error = status.ok() ? 0 : proto::CreateWireError(b, status);
  auto done = proto::CreateRunDone(
      b, run.task_id(), wire_outputs, progress.iterations_done, progress.stopped_early,
      progress.loss, error, fill ? fill->step_ns() : 0, fill ? fill->steps() : 0,
      fill ? fill->predicted_ns() : 0, progress.first_layer_start_ns, progress.first_layer_done_ns,
      b.CreateVector(progress.group_gates_ns), progress.step_cut, fill && fill->overran());
  proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::RunDone, done.Union()));
  PSWITCH_RETURN_IF_ERROR(SendEvent(b));
  // Nothing of the task is in flight: its grants go (the next task may be another tenant's),
  // after its answer so off its latency, and before this worker reads any other command.
  if (absl::Status ended = access_->EndTask(); !ended.ok()) {
    // Access this worker should no longer have: it must not run another task.
    return absl::Status(ended.code(),
                        absl::StrCat("worker ", options_.worker_id,
                                     " cannot take a task's arena access back: ", ended.message()));
  }
  return absl::OkStatus();
}

absl::Status Worker::HandleStop(const proto::Stop& stop) {
  stops_.Handled();  // a Stop received since (for the Run queued after it) stays in force
  // Nothing of this tenant may be in flight once the drain value is visible. Bounded: a stream
  // still waiting on a flag no one writes makes this worker unusable; it exits (the error ends
  // Serve) and pswitchd replaces it, and its death releases the drain.
  absl::Status idle = stream_->Synchronize(options_.drain_timeout);
  if (!idle.ok()) {
    return absl::Status(idle.code(), absl::StrCat("worker ", options_.worker_id,
                                                  " cannot drain: ", idle.message()));
  }
  // A CPU store to the host-resident flag: one stream sync, no second round trip.
  PSWITCH_RETURN_IF_ERROR(arena_->drain_flags().Store(stop.drain_index(), stop.drain_value()));
  const int64_t drained_ns = base::MonotonicNowNs();
  // The next model's copy may already overwrite the weights: cleaning touches metadata only.
  const int64_t clean_start_ns = base::MonotonicNowNs();
  Clean();
  flatbuffers::FlatBufferBuilder b;
  auto drained = proto::CreateDrained(b, stop.drain_value(), drained_ns, clean_start_ns,
                                      base::MonotonicNowNs());
  proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::Drained, drained.Union()));
  return SendEvent(b);
}

}  // namespace pswitch::worker
