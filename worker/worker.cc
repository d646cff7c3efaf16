#include "worker/worker.h"

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <unistd.h>

#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "gpu/copy_engine.h"
#include "models/training.h"
#include "proto/status.h"
#include "proto/wire_status.h"
#include "proto/worker_generated.h"
#include "worker/host_tensors.h"

namespace pswitch::worker {
namespace {

// Thrown by the gate hook through libtorch's forward; caught at the task boundary below.
class GateFailure : public std::runtime_error {
 public:
  explicit GateFailure(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

}  // namespace

absl::Status CheckWorkerBackend(gpu::Backend backend) {
  if (backend == gpu::Backend::kHost) return absl::OkStatus();
  return absl::UnimplementedError(
      "workers cannot execute on the CUDA backend yet (device tensor views and the CUDA "
      "activation allocator are the CUDA validation issue's work); use --backend host");
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options) {
  PSWITCH_RETURN_IF_ERROR(CheckWorkerBackend(options.backend));
  std::unique_ptr<Worker> w(new Worker());
  w->options_ = options;
  w->control_ = std::make_unique<proto::FrameChannel>(UniqueFd(options.control_fd));
  gpu::DeviceOptions device;
  device.backend = options.backend;
  PSWITCH_ASSIGN_OR_RETURN(w->device_, gpu::Device::Open(device));
  PSWITCH_ASSIGN_OR_RETURN(
      w->arena_, memdaemon::ArenaClient::Attach(options.memdaemon_socket, w->device_.get(),
                                                options.worker_id));
  PSWITCH_ASSIGN_OR_RETURN(w->stream_, w->device_->CreateStream());
  if (options.activation_bytes > 0) {
    PSWITCH_ASSIGN_OR_RETURN(
        memdaemon::Lease lease,
        w->arena_->RequestLease(absl::StrCat("worker-", options.worker_id, "-activations"),
                                options.activation_bytes));
    // Installed once, before any task; libtorch keeps using it for the process's lifetime.
    w->activations_ = LeaseAllocator::Install(w->arena_->arena().base() + lease.offset, lease.bytes,
                                              c10::GetDefaultCPUAllocator());
  }
  flatbuffers::FlatBufferBuilder b;
  auto ready = proto::CreateWorkerReady(b, ::getpid(), options.worker_id);
  b.Finish(proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::WorkerReady, ready.Union()));
  PSWITCH_RETURN_IF_ERROR(w->SendEvent(b));
  w->control_thread_ = std::thread([p = w.get()] { p->ControlLoop(); });
  return w;
}

Worker::~Worker() {
  // The control thread ends when the controller closes the socket; don't wait for that.
  if (control_thread_.joinable()) control_thread_.detach();
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
      stop_requested_.store(true);  // seen by a running task at its next sync point
    }
    absl::MutexLock lock(&mu_);
    commands_.push_back(Command{std::move(frame->payload)});
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
    PSWITCH_RETURN_IF_ERROR(Execute(command.payload));
  }
}

absl::Status Worker::Execute(const std::vector<uint8_t>& payload) {
  auto* cmd = flatbuffers::GetRoot<proto::WorkerCommand>(payload.data());
  switch (cmd->body_type()) {
    case proto::WorkerCommandBody::LoadModel:
      return HandleLoad(*cmd->body_as_LoadModel());
    case proto::WorkerCommandBody::Prepare:
      return HandlePrepare(*cmd->body_as_Prepare());
    case proto::WorkerCommandBody::Run:
      return HandleRun(*cmd->body_as_Run());
    case proto::WorkerCommandBody::Stop:
      return HandleStop(*cmd->body_as_Stop());
    default:
      return absl::InvalidArgumentError("unknown worker command");
  }
}

absl::Status Worker::HandleLoad(const proto::LoadModel& load) {
  std::string name = load.name()->str();
  absl::Status status;
  if (load.weights_offset() > arena_->arena().size_bytes() ||
      load.total_bytes() > arena_->arena().size_bytes() - load.weights_offset()) {
    status = absl::OutOfRangeError(absl::StrCat("model '", name, "' region outside the arena"));
  } else {
    auto bound =
        BoundModel::Create(load.zoo_model()->str(), arena_->arena().base() + load.weights_offset(),
                           load.layers(), load.total_bytes());
    if (bound.ok()) {
      models_[name] = std::move(*bound);
    } else {
      status = bound.status();
    }
  }
  flatbuffers::FlatBufferBuilder b;
  auto error = status.ok() ? 0 : proto::CreateWireError(b, status);
  auto loaded = proto::CreateModelLoaded(b, b.CreateString(name), error);
  b.Finish(proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::ModelLoaded, loaded.Union()));
  return SendEvent(b);
}

absl::Status Worker::HandlePrepare(const proto::Prepare& prepare) {
  auto it = models_.find(prepare.model()->str());
  if (it == models_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("prepare for model '", prepare.model()->str(), "' that was never loaded"));
  }
  Gate gate{prepare.model()->str(), prepare.epoch(), prepare.flag_base(), {}};
  gate.group_of_layer.resize(it->second->num_layers());
  const auto* last = prepare.group_last_layer();
  uint32_t g = 0;
  for (size_t l = 0; l < gate.group_of_layer.size(); ++l) {
    while (last != nullptr && g + 1 < last->size() && last->Get(g) < l) ++g;
    gate.group_of_layer[l] = g;
  }
  gate_ = std::move(gate);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<proto::HostTensor>> Worker::Infer(BoundModel& bound,
                                                             const proto::Run& run) {
  bound.model().eval();
  torch::NoGradGuard no_grad;
  PSWITCH_ASSIGN_OR_RETURN(std::vector<proto::HostTensor> inputs,
                           proto::FromWireTensors(run.inputs()));
  PSWITCH_ASSIGN_OR_RETURN(models::ModelInput input, ToModelInput(inputs));
  models::ModelOutput out = bound.model().Forward(input);
  PSWITCH_ASSIGN_OR_RETURN(proto::HostTensor output, ToHostTensor("output", out.output));
  return std::vector<proto::HostTensor>{std::move(output)};
}

absl::Status Worker::Train(BoundModel& bound, const proto::Run& run, TrainProgress* progress) {
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
  dirty_model_ = &bound;
  PSWITCH_ASSIGN_OR_RETURN(trainer_, models::Trainer::Create(bound.model(), options, &state));
  models::Trainer* trainer = trainer_.get();
  absl::Status status;
  for (uint32_t i = run.first_iteration(); i < run.iterations(); ++i) {
    if (stop_requested_.load()) {
      progress->stopped_early = true;
      break;
    }
    // Every iteration's data and randomness depend on (seed, i) only, in any process.
    uint64_t step_seed = run.seed() * 1000003ull + i;
    torch::manual_seed(step_seed);
    models::ModelInput input = bound.model().ExampleInput(run.batch(), step_seed);
    at::Tensor target = bound.model().ExampleTarget(run.batch(), step_seed);
    absl::StatusOr<double> loss = trainer->Step(input, target);
    if (!loss.ok()) {
      status = loss.status();
      break;
    }
    progress->loss = *loss;
    progress->iterations_done = i + 1;
  }
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

absl::Status Worker::HandleRun(const proto::Run& run) {
  Clean();  // no switch came since the last task: its leftovers go now
  const std::string model_name = run.model()->str();
  auto it = models_.find(model_name);
  std::vector<proto::HostTensor> outputs;
  TrainProgress progress{run.first_iteration(), false, 0};
  absl::Status status;
  if (it == models_.end() || gate_.model != model_name) {
    status = absl::FailedPreconditionError(
        absl::StrCat("run of model '", model_name, "' without load and prepare"));
  } else {
    BoundModel& bound = *it->second;
    const bool training = run.training();
    int waited_group = -1;
    absl::Status gate_status;
    // Gate every layer on its group; groups arrive in order, so waiting once per group is enough.
    bound.model().SetGateHook([&, training](int index) {
      int group = static_cast<int>(gate_.group_of_layer[bound.LayoutIndex(training, index)]);
      if (group <= waited_group) return;
      absl::Status s = stream_->WaitFlag(arena_->ready_flags(), gate_.flag_base + group,
                                         gate_.epoch, options_.group_timeout);
      if (!s.ok()) throw GateFailure(s);
      waited_group = group;
    });
    ScopedLeaseAllocation from_lease(activations_);
    absl::Status torch_status = models::CatchTorch(absl::StrCat("model '", model_name, "'"), [&] {
      try {
        if (training) {
          status = Train(bound, run, &progress);
          return;
        }
        absl::StatusOr<std::vector<proto::HostTensor>> out = Infer(bound, run);
        if (out.ok()) {
          outputs = std::move(*out);
        } else {
          status = out.status();
        }
      } catch (const GateFailure& failure) {
        gate_status = failure.status();
      }
    });
    // Precedence: a gate failure explains everything after it; then libtorch's own errors; then
    // the task-level status.
    if (!gate_status.ok()) {
      status = gate_status;
    } else if (!torch_status.ok()) {
      status = torch_status;
    }
    bound.model().SetGateHook(nullptr);
  }
  flatbuffers::FlatBufferBuilder b;
  auto wire_outputs = proto::CreateWireTensors(b, outputs);
  auto error = status.ok() ? 0 : proto::CreateWireError(b, status);
  auto done = proto::CreateRunDone(b, run.task_id(), wire_outputs, progress.iterations_done,
                                   progress.stopped_early, progress.loss, error);
  b.Finish(proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::RunDone, done.Union()));
  return SendEvent(b);
}

absl::Status Worker::HandleStop(const proto::Stop& stop) {
  stop_requested_.store(false);
  // Nothing of this tenant may be in flight once the drain value is visible.
  PSWITCH_RETURN_IF_ERROR(stream_->Synchronize());
  PSWITCH_RETURN_IF_ERROR(
      stream_->WriteFlag(arena_->drain_flags(), stop.drain_index(), stop.drain_value()));
  PSWITCH_RETURN_IF_ERROR(stream_->Synchronize());
  const int64_t drained_ns = gpu::MonotonicNowNs();
  // The next model's copy may already overwrite the weights: cleaning touches metadata only.
  const int64_t clean_start_ns = gpu::MonotonicNowNs();
  Clean();
  flatbuffers::FlatBufferBuilder b;
  auto drained = proto::CreateDrained(b, stop.drain_value(), drained_ns, clean_start_ns,
                                      gpu::MonotonicNowNs());
  b.Finish(proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::Drained, drained.Union()));
  return SendEvent(b);
}

}  // namespace pswitch::worker
