#include "controller/fill_manager.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/files.h"
#include "base/log.h"
#include "base/nvtx.h"
#include "base/status.h"
#include "controller/fill_dataset.h"
#include "fill/step_gate.h"
#include "gpu/copy_engine.h"
#include "gpu/device.h"
#include "models/safetensors.h"
#include "models/zoo_names.h"
#include "proto/common_generated.h"

namespace pswitch::controller {

using registry::EntryRef;
using registry::ModelRequest;

namespace {

// Bubbles in a row opened for a resident run with neither a step nor a part of one done before
// the run is ended and started anew (FillManager::WakeResident), and such runs in a row before
// the job is stopped with the reason.
constexpr int kMaxIdleOpens = 8;
constexpr int kMaxIdleRuns = 3;

absl::Duration Percentile(std::vector<absl::Duration> v, double p) {
  if (v.empty()) return absl::ZeroDuration();
  std::sort(v.begin(), v.end());
  size_t index = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(index, v.size() - 1)];
}

// The inference job's output: its runs' "output" rows, concatenated, as a safetensors file.
absl::StatusOr<std::string> SerializeOutputs(const std::vector<proto::HostTensor>& parts) {
  if (parts.empty()) return absl::InternalError("inference fill job produced no output");
  std::vector<int64_t> shape = parts[0].shape;
  std::vector<uint8_t> data;
  shape[0] = 0;
  for (const proto::HostTensor& t : parts) {
    if (t.dtype != proto::DType::F32 || t.shape.size() != shape.size()) {
      return absl::InternalError("inference fill job outputs differ in dtype or rank");
    }
    shape[0] += t.shape[0];
    data.insert(data.end(), t.data.begin(), t.data.end());
  }
  return models::SerializeSafetensors(
      {models::SafetensorsEntry{"output", models::DType::kF32, shape, data.data(), data.size()}},
      {});
}

// Where the output goes: the client's own file (passed by fd), or a new file under the root.
absl::Status WriteOutputs(const base::ConfinedDir* root, const FillRequest& request,
                          const std::vector<proto::HostTensor>& parts) {
  PSWITCH_ASSIGN_OR_RETURN(std::string bytes, SerializeOutputs(parts));
  if (request.output_fd != nullptr) {
    return WriteOutputFile(request.output_fd->get(), bytes, "the passed output file");
  }
  if (root == nullptr) return absl::FailedPreconditionError("no --data-root to write outputs to");
  return root->Create(request.output_path, bytes, "output");
}

absl::Status NoCycleError() {
  return absl::FailedPreconditionError(
      "no bubble cycle registered yet: the main job registers its cycle before fill jobs can be "
      "placed");
}

}  // namespace

absl::Status FillManager::CheckGpu(int gpu) const {
  if (gpu < 0 || static_cast<size_t>(gpu) >= controller_->gpus()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no GPU ", gpu, " (this daemon has ", controller_->gpus(), ")"));
  }
  return absl::OkStatus();
}

absl::Status FillManager::RegisterCycle(int gpu, const fill::BubbleCycle& cycle,
                                        std::optional<absl::Time> origin) {
  PSWITCH_RETURN_IF_ERROR(CheckGpu(gpu));
  PSWITCH_RETURN_IF_ERROR(fill::ValidateBubbleCycle(cycle));
  absl::MutexLock lock(&mu_);
  gpus_[gpu].cycle = cycle;
  gpus_[gpu].cycle_origin = origin.value_or(absl::Now());
  base::Log(base::LogLevel::kInfo, "bubble_cycle_registered")
      .Field("gpu", gpu)
      .FieldMs("period_ms", cycle.period)
      .Field("bubbles", cycle.bubbles.size());
  return RebuildScheduler();
}

absl::Status FillManager::RebuildScheduler() {
  std::vector<fill::FillStage> stages;
  std::vector<int> stage_gpu;
  for (auto& [gpu, state] : gpus_) {
    if (!state.cycle) continue;
    stages.push_back(fill::FillStage{absl::StrCat("gpu ", gpu), *state.cycle, state.cycle_origin,
                                     options_.switch_overhead});
    stage_gpu.push_back(gpu);
  }
  fill::FillSchedulerOptions options;
  options.policy = options_.policy;
  PSWITCH_ASSIGN_OR_RETURN(scheduler_, fill::FillScheduler::Create(std::move(stages), options));
  stage_gpu_ = std::move(stage_gpu);
  // Jobs not yet finished are placed again on the new cycles.
  for (auto& [id, job] : jobs_) {
    if (job.machine.stopped() || job.writing_output) continue;  // the latter ends by itself
    const int was = job.gpu;
    absl::Status placed = Place(id, job);
    if (!placed.ok()) {
      Stop(id, job, placed);
    } else if (job.gpu != was) {
      StopResident(id);  // its next run starts on its new GPU
    }
  }
  return absl::OkStatus();
}

fill::FillJob FillManager::SchedulerJob(uint64_t id, const Job& job) const {
  // Placement and predictions see a step that splits as its parts: a job whose step is longer
  // than any bubble still fits one with a part.
  const int64_t parts = PartsPerStep(job);
  fill::FillJob f;
  f.id = id;
  f.steps_total = job.steps_total * parts;
  f.steps_done = job.steps_done * parts;
  f.step_duration = job.predicted_step / parts;
  f.memory_bytes = static_cast<int64_t>(job.request.memory_bytes);
  f.submitted = job.submitted;
  if (job.request.deadline) f.deadline = job.submitted + *job.request.deadline;
  return f;
}

absl::Status FillManager::Place(uint64_t id, Job& job) {
  PSWITCH_RETURN_IF_ERROR(scheduler_->Submit(SchedulerJob(id, job), absl::Now()));
  job.gpu = stage_gpu_[*scheduler_->StageOf(id)];
  return absl::OkStatus();
}

void FillManager::Transition(uint64_t id, Job& job, fill::FillEvent event) {
  absl::Status applied = job.machine.Apply(event);
  if (!applied.ok()) {
    base::Log(base::LogLevel::kError, "fill_state_error").Field("job", id).Field("error", applied);
  }
}

absl::StatusOr<EntryRef> FillManager::OwnModel(const std::string& name) const {
  if (absl::StartsWith(name, kFillModelPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is another fill job's model"));
  }
  PSWITCH_ASSIGN_OR_RETURN(EntryRef entry, controller_->catalog().Find(name));
  if (entry->archive == nullptr) {
    return absl::NotFoundError(absl::StrCat("'", name, "' is not a model of your own"));
  }
  return entry;
}

absl::StatusOr<std::shared_ptr<void>> FillManager::ChargeDataset(uint64_t bytes,
                                                                 absl::string_view name) const {
  const uint64_t bound = options_.max_total_dataset_bytes;
  uint64_t held = dataset_bytes_.load();
  do {
    if (bytes > bound || held > bound - bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "dataset ", name, ": its ", bytes, " bytes and the ", held,
          " bytes of the fill jobs' datasets held now exceed --max-total-dataset-bytes (", bound,
          "): try again once a job ends"));
    }
  } while (!dataset_bytes_.compare_exchange_weak(held, held + bytes));
  return std::shared_ptr<void>(const_cast<FillManager*>(this),
                               [bytes](FillManager* self) { self->dataset_bytes_ -= bytes; });
}

absl::StatusOr<FillManager::Validated> FillManager::Validate(FillRequest& request,
                                                             bool estimate) const {
  if (request.batch < 1) return absl::InvalidArgumentError("batch must be >= 1");
  if (request.memory_bytes == 0) {
    return absl::InvalidArgumentError("memory_bytes (the job's memory cap) must be > 0");
  }
  Validated validated;
  int64_t steps = request.steps;
  switch (request.kind) {
    case FillKind::kInference: {
      // Passed files (Unix socket) are the client's own; names resolve under --data-root.
      const bool named_output = !estimate && request.output_fd == nullptr;
      if ((request.dataset_fd == nullptr || named_output) && options_.data_root == nullptr) {
        return absl::FailedPreconditionError(
            "this pswitchd has no --data_root: fill jobs that name their dataset or output are "
            "off (pass the files over the Unix socket instead)");
      }
      if (request.dataset_fd == nullptr) {
        PSWITCH_RETURN_IF_ERROR(base::ConfinedDir::CheckName(request.dataset_path, "dataset"));
      }
      // Checked now so a job does not run for hours to find its output taken; created new at
      // the end all the same (never over anything). An estimate writes nothing.
      if (named_output) {
        PSWITCH_RETURN_IF_ERROR(options_.data_root->CheckCreatable(request.output_path, "output"));
      }
      UniqueFd opened;
      if (request.dataset_fd == nullptr) {
        PSWITCH_ASSIGN_OR_RETURN(opened,
                                 options_.data_root->OpenForRead(request.dataset_path, "dataset",
                                                                 options_.max_dataset_bytes));
      }
      const int source = request.dataset_fd != nullptr ? request.dataset_fd->get() : opened.get();
      // Charged before a byte is copied; a file grown since is refused, never held uncharged.
      PSWITCH_ASSIGN_OR_RETURN(
          const uint64_t bytes,
          base::CheckReadableRegularFile(source, absl::StrCat("dataset ", request.dataset_path),
                                         options_.max_dataset_bytes));
      PSWITCH_ASSIGN_OR_RETURN(validated.dataset_charge,
                               ChargeDataset(bytes, request.dataset_path));
      PSWITCH_ASSIGN_OR_RETURN(validated.dataset,
                               LoadFillDataset(source, request.dataset_path, bytes));
      steps = (validated.dataset->num_rows + request.batch - 1) / request.batch;
      break;
    }
    case FillKind::kTraining:
      break;
    case FillKind::kSynthetic:
      if (request.synthetic_step <= absl::ZeroDuration()) {
        return absl::InvalidArgumentError("synthetic fill job needs a positive step time");
      }
      if (request.step == absl::ZeroDuration()) request.step = request.synthetic_step;
      break;
  }
  if (steps < 1 || steps > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("steps must be in [1, 2^31], got ", steps));
  }
  if (request.step <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "the job's profiled step duration must be > 0 (profile-model measures it)");
  }
  if (request.kind != FillKind::kSynthetic) {
    if (!models::IsZooModel(request.model)) {
      absl::StatusOr<EntryRef> own = OwnModel(request.model);
      if (!own.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown model '", request.model,
            "': name a zoo model or a registered model of your own (pswitch.export)"));
      }
      if (request.kind == FillKind::kTraining) PSWITCH_RETURN_IF_ERROR((*own)->trainable);
      if (request.kind == FillKind::kInference && (*own)->output.dtype != proto::DType::F32) {
        // The job's outputs file holds float32 rows (SerializeOutputs): said now, not after
        // every step has run.
        return absl::InvalidArgumentError(absl::StrCat(
            "model '", request.model, "' answers ", proto::EnumNameDType((*own)->output.dtype),
            "; an inference fill job writes float32 outputs (register a float32 export)"));
      }
      // A zoo model's input is known once the job's copy is registered (OnCreated).
      if (validated.dataset != nullptr) {
        PSWITCH_RETURN_IF_ERROR(CheckDatasetFitsModel(*validated.dataset, **own));
      }
    }
  }
  validated.steps = steps;
  return validated;
}

void FillManager::Shutdown() {
  {
    absl::WriterMutexLock lock(&lifecycle_mu_);
    shut_down_ = true;
  }
  online_->Stop();  // its queued requests answered; nothing of it reaches the controller now
}

absl::StatusOr<uint64_t> FillManager::SubmitOnline(TaskSpec spec, TaskCallback done) {
  if (spec.kind != TaskKind::kInference) {
    return absl::InvalidArgumentError(
        "only inference requests may carry a latency objective (online fill)");
  }
  absl::ReaderMutexLock life(&lifecycle_mu_);
  if (shut_down_) return absl::UnavailableError("pswitchd is stopping");
  PSWITCH_RETURN_IF_ERROR(controller_->Check(spec));
  std::vector<int> gpus;  // those running a main job: the first bubble among them serves it
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [index, state] : gpus_) {
      if (state.cycle) gpus.push_back(index);
    }
  }
  if (gpus.empty()) return online_->RunAtOnce(0, std::move(spec), std::move(done));
  return online_->Submit(gpus, std::move(spec), std::move(done));
}

absl::StatusOr<FillManager::LoadSlot> FillManager::ReserveLoad() {
  if (loads_in_flight_.fetch_add(1) >= options_.max_loads_in_flight) {
    loads_in_flight_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        "at most ", options_.max_loads_in_flight,
        " fill submissions and estimates are handled at once (--max-fill-loads): try again later"));
  }
  LoadSlot slot;
  slot.place_ = std::shared_ptr<void>(this, [](FillManager* self) { self->loads_in_flight_--; });
  return slot;
}

absl::StatusOr<uint64_t> FillManager::Submit(FillRequest request, LoadSlot slot) {
  if (!slot.held()) {
    PSWITCH_ASSIGN_OR_RETURN(slot, ReserveLoad());
  }
  PSWITCH_ASSIGN_OR_RETURN(Validated validated, Validate(request, /*estimate=*/false));
  const int64_t steps = validated.steps;
  absl::ReaderMutexLock alive(&lifecycle_mu_);
  if (shut_down_) return absl::UnavailableError("pswitchd is shutting down");
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (scheduler_ == nullptr) return NoCycleError();
    id = next_id_++;
    Job job;
    job.request = request;
    job.dataset = std::move(validated.dataset);
    job.dataset_charge = std::move(validated.dataset_charge);
    job.steps_total = steps;
    job.predicted_step = request.step;
    job.submitted = absl::Now();
    if (request.kind != FillKind::kSynthetic) job.model_name = absl::StrCat(kFillModelPrefix, id);
    PSWITCH_RETURN_IF_ERROR(Place(id, job));
    Transition(id, job, fill::FillEvent::kCreate);
    jobs_.emplace(id, std::move(job));
  }
  if (request.kind == FillKind::kSynthetic) {
    OnCreated(id, absl::OkStatus(), absl::ZeroDuration());
  } else {
    // Its own copy of the model: its weights evolve independently of other tasks'. A model of
    // the user's own is registered again from the same archive (and weights) as the original.
    ModelRequest own{absl::StrCat(kFillModelPrefix, id), request.model, "", request.batch, "auto"};
    if (absl::StatusOr<EntryRef> entry = OwnModel(request.model); entry.ok()) {
      std::string name = own.name;
      own = (*entry)->request;
      own.name = std::move(name);
      own.batch_size = request.batch;
      own.archive_fd = (*entry)->archive;  // the archive registered, even if its file changed
    }
    // Every worker that may run it warms it now, outside any bubble, and times its step.
    own.warm_for = request.kind == FillKind::kTraining ? registry::WarmFor::kFillTraining
                                                       : registry::WarmFor::kFillInference;
    controller_->Register(
        std::move(own), [this, id](const absl::StatusOr<Controller::Registered>& registered) {
          if (!registered.ok()) {
            OnCreated(id, registered.status(), absl::ZeroDuration());
            return;
          }
          OnCreated(id, absl::OkStatus(),
                    registered->entry->request.warm_for == registry::WarmFor::kFillTraining
                        ? registered->train_step
                        : registered->infer_step);
        });
  }
  return id;
}

absl::StatusOr<FillJobStatus> FillManager::Estimate(FillRequest request, LoadSlot slot) {
  if (!slot.held()) {
    PSWITCH_ASSIGN_OR_RETURN(slot, ReserveLoad());
  }
  PSWITCH_ASSIGN_OR_RETURN(Validated validated, Validate(request, /*estimate=*/true));
  const int64_t steps = validated.steps;
  absl::MutexLock lock(&mu_);
  if (scheduler_ == nullptr) return NoCycleError();
  Job job;
  job.request = request;
  job.steps_total = steps;
  job.predicted_step = request.step;
  job.submitted = absl::Now();
  // Under the id a submission would get now: no job has it yet, and messages name it.
  PSWITCH_ASSIGN_OR_RETURN(fill::FillEstimate estimate,
                           scheduler_->EstimateNew(SchedulerJob(next_id_, job), job.submitted));
  FillJobStatus status;
  status.gpu = static_cast<uint32_t>(stage_gpu_[estimate.stage]);
  status.steps_total = static_cast<uint64_t>(steps);
  status.predicted_remaining = std::max(absl::ZeroDuration(), estimate.completion - job.submitted);
  status.meets_deadline = estimate.meets_deadline;
  return status;
}

absl::Status FillManager::Cancel(uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no fill job ", job_id));
  if (it->second.machine.stopped()) {
    return absl::FailedPreconditionError(absl::StrCat("fill job ", job_id, " has already stopped"));
  }
  if (it->second.writing_output) {
    return absl::FailedPreconditionError(
        absl::StrCat("fill job ", job_id, " has computed every row and is writing its output"));
  }
  Stop(job_id, it->second, absl::CancelledError("cancelled by a client"));
  return absl::OkStatus();
}

void FillManager::OnCreated(uint64_t id, absl::Status created, absl::Duration measured_step) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  // A failed registration leaves nothing registered (Controller::Register unloads a model a
  // worker failed to load); a model that is in the catalog must go when the job ends.
  it->second.model_registered = !it->second.model_name.empty() &&
                                controller_->catalog().Find(it->second.model_name).ok();
  // Cancelled while its model was being registered: that model goes again.
  if (it->second.machine.stopped()) {
    UnloadModel(it->second);
    return;
  }
  if (!created.ok()) {
    Stop(id, it->second, created);
    return;
  }
  // Its dataset against the model's input, now that the copy's input is recorded: a mismatch
  // fails here, before any bubble runs it.
  if (it->second.dataset != nullptr) {
    absl::StatusOr<EntryRef> entry = controller_->catalog().Find(it->second.model_name);
    absl::Status fits =
        entry.ok() ? CheckDatasetFitsModel(*it->second.dataset, **entry) : entry.status();
    if (!fits.ok()) {
      Stop(id, it->second, fits);
      return;
    }
  }
  if (measured_step > absl::ZeroDuration()) {
    // Measured warm on the slowest of its workers: a truer first prediction than the declared
    // profile, in either direction (the worker never starts a step shorter than its own).
    Job& job = it->second;
    base::Log(base::LogLevel::kInfo, "fill_job_step_measured")
        .Field("job", id)
        .FieldMs("declared_ms", job.request.step)
        .FieldMs("measured_ms", measured_step);
    job.predicted_step = measured_step;
    if (absl::Status fits = StepFitsBubbles(id, job, job.gpu); !fits.ok()) {
      Stop(id, job, fits);
      return;
    }
  }
  Transition(id, it->second, fill::FillEvent::kInit);  // CREATED -> PAUSED
}

void FillManager::Stop(uint64_t id, Job& job, absl::Status error, bool drop_checkpoint) {
  if (job.machine.stopped()) return;
  Transition(id, job, fill::FillEvent::kStop);
  job.error = std::move(error);
  StopResident(id);
  if (scheduler_ != nullptr) (void)scheduler_->Remove(id);
  if (drop_checkpoint) controller_->checkpoints().Drop(CheckpointKey::FillJob(id));
  // A training job that finished keeps its model, "fill-<id>": the trained weights are its
  // result (served like any model, unloaded by a client). Everything else goes now.
  if (!(job.error.ok() && job.request.kind == FillKind::kTraining)) UnloadModel(job);
  // Its dataset's copy goes (a run still out holds the region until it ends), and the client's
  // files are closed.
  job.dataset.reset();
  job.dataset_charge.reset();
  job.request.dataset_fd.reset();
  job.request.output_fd.reset();
  base::Log(job.error.ok() ? base::LogLevel::kInfo : base::LogLevel::kWarn, "fill_job_stopped")
      .Field("job", id)
      .Field("steps", absl::StrCat(job.steps_done, "/", job.steps_total))
      .Field("error", job.error.ok() ? std::string() : job.error.ToString());
}

absl::Status FillManager::CheckUnload(const std::string& model) const {
  if (!absl::StartsWith(model, kFillModelPrefix)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  for (const auto& [id, job] : jobs_) {
    if (job.model_name == model && !job.machine.stopped()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model '", model, "' is fill job ", id, "'s own model: cancel the job first"));
    }
  }
  return absl::OkStatus();
}

void FillManager::UnloadModel(Job& job) {
  if (!job.model_registered) return;
  job.model_registered = false;
  // Its private copy of the model (pinned weights) goes with it; a run still out finishes
  // first (the unload waits for it).
  controller_->Unload(job.model_name, [name = job.model_name](absl::Status status) {
    if (!status.ok() && !absl::IsCancelled(status)) {  // cancelled: pswitchd is stopping
      base::Log(base::LogLevel::kWarn, "fill_model_unload_failed")
          .Field("model", name)
          .Field("error", status);
    }
  });
}

TaskSpec FillManager::RunSpec(uint64_t id, const Job& job, int gpu, int64_t bubble_end_ns,
                              uint64_t free_bytes) const {
  TaskSpec spec;
  const FillRequest& r = job.request;
  spec.model = job.model_name.empty() ? "synthetic" : job.model_name;
  spec.kind = r.kind == FillKind::kTraining ? TaskKind::kTraining : TaskKind::kInference;
  spec.iterations = static_cast<uint32_t>(job.steps_total);
  spec.seed = r.seed;
  spec.trainer.momentum = 0.9;
  FillRunSpec f;
  f.bubble_end_ns = bubble_end_ns;
  f.margin = options_.margin;
  f.step = job.predicted_step;
  f.memory_cap = std::min<uint64_t>(r.memory_bytes, free_bytes);
  f.synthetic = r.kind == FillKind::kSynthetic;
  if (job.dataset != nullptr) {
    f.dataset = job.dataset->rows;
    spec.regions.push_back(job.dataset->region);
  }
  f.synthetic_step = r.synthetic_step;
  f.synthetic_alloc_bytes = r.synthetic_alloc_bytes;
  f.ignore_pause = r.ignore_pause;
  if (options_.host_compute_lock) f.device_lock_path = gpu::HostComputeLockPath(gpu);
  f.first_iteration = static_cast<uint32_t>(job.steps_done);
  f.state_key = CheckpointKey::FillJob(id);
  f.suspend_steps = options_.suspend_steps && r.kind == FillKind::kTraining;
  spec.fill = std::move(f);
  return spec;
}

absl::Status FillManager::BubbleBegin(int gpu, absl::Duration expected, uint64_t free_bytes,
                                      int64_t began_ns) {
  PSWITCH_RETURN_IF_ERROR(CheckGpu(gpu));
  const int64_t arrival_ns = base::MonotonicNowNs();
  // A little slack for the two processes reading the clock; more is another host's clock.
  if (began_ns > arrival_ns + 1'000'000) {
    return absl::InvalidArgumentError(
        "bubble began_ns lies in the future: it must be this node's CLOCK_MONOTONIC");
  }
  const int64_t bubble_end_ns =
      (began_ns > 0 ? began_ns : arrival_ns) + absl::ToInt64Nanoseconds(expected);
  // Online requests first: they have objectives; offline jobs get what they leave.
  const absl::Duration online = online_->Pull(gpu, bubble_end_ns);
  absl::MutexLock lock(&mu_);
  GpuState& g = gpus_[gpu];
  const absl::Time now = absl::Now();
  g.in_bubble = true;
  g.bubble_begin = now;
  base::NvtxEnd(g.bubble_nvtx);  // a begin without an end (the main job restarted)
  g.bubble_nvtx = base::NvtxStart(absl::StrCat("bubble gpu ", gpu));
  ++stats_.bubbles;
  // What is left of the bubble when the message is handled, not what it was when it began.
  const absl::Duration left = absl::Nanoseconds(bubble_end_ns - arrival_ns) - online;
  if (g.resident && !g.resident->bell->stopped()) {
    WakeResident(gpu, g, bubble_end_ns, left, free_bytes, now);
    return absl::OkStatus();
  }
  // No cycle registered for this GPU (nothing placed here), or its last run has not paused yet.
  if (g.running_job) return absl::OkStatus();
  const std::optional<uint64_t> next = NextJob(gpu, now);
  if (!next) return absl::OkStatus();
  const uint64_t id = *next;
  Job& job = jobs_.at(id);
  // Not ready yet (its model is still being registered), this bubble lacks its memory, or not
  // even one step would fit: switching it in would only cost copies.
  // A run still out (a resident run on the GPU it just left) must end first: its state is the
  // job's.
  if (job.machine.state() != fill::FillState::kPaused || job.run_out ||
      job.request.memory_bytes > free_bytes || left <= MinStep(job) + options_.margin) {
    return absl::OkStatus();
  }
  TaskSpec spec = RunSpec(id, job, gpu, bubble_end_ns, free_bytes);
  if (options_.resident_runs) {
    absl::StatusOr<std::shared_ptr<BubbleBell>> bell = BubbleBell::Create();
    if (!bell.ok()) {
      // No page for its bell (pswitchd is out of files or memory): the bubble goes unused, said.
      base::Log(base::LogLevel::kWarn, "fill_bell_failed")
          .Field("job", id)
          .Field("error", bell.status());
      return absl::OkStatus();
    }
    (*bell)->Open(bubble_end_ns, bubble_end_ns - absl::ToInt64Nanoseconds(options_.margin) / 2);
    spec.regions.push_back((*bell)->region());
    spec.fill->bell = *bell;
    g.resident = GpuState::Resident{};
    g.resident->job = id;
    g.resident->bell = *std::move(bell);
    g.resident->open_ns = bubble_end_ns - arrival_ns;
    g.resident->opened = true;
  }
  Transition(id, job, fill::FillEvent::kStart);
  ++job.bubbles;
  ++stats_.runs;
  job.run_out = true;
  g.running_job = id;
  g.run_done = false;
  g.ended = false;
  // Its RunDone takes this lock: it cannot come before the task is recorded here.
  const uint64_t task = controller_->gpu(gpu).SubmitFill(
      std::move(spec),
      [this, gpu, id](const absl::StatusOr<TaskOutcome>& outcome) { OnRunDone(gpu, id, outcome); });
  if (g.resident) g.resident->task = task;
  return absl::OkStatus();
}

bool FillManager::WakeResident(int gpu, GpuState& g, int64_t bubble_end_ns, absl::Duration left,
                               uint64_t free_bytes, absl::Time now) {
  Harvest(gpu, g);
  const uint64_t id = g.resident->job;
  Job& job = jobs_.at(id);
  const std::optional<uint64_t> next = NextJob(gpu, now);
  // Another job's turn here (the policy chose it, or this one moved), or this bubble lacks the
  // memory the run holds: the run ends, and the next bubble starts what comes next.
  if (next != id || job.request.memory_bytes > free_bytes) {
    StopResident(id);
    return false;
  }
  // Its measured steps no longer fit any bubble here: it would wait forever.
  if (absl::Status fits = StepFitsBubbles(id, job, gpu); !fits.ok()) {
    Stop(id, job, fits);
    return false;
  }
  GpuState::Resident& r = *g.resident;
  // Its last bubble, if one was opened for it: did it finish a step, or a part of one? (A cut
  // is no progress.)
  if (r.opened) {
    const bool idle = r.steps_seen == r.steps_at_open && r.parts_seen == r.parts_at_open;
    if (!idle) job.idle_runs = 0;
    r.idle_opens = idle ? r.idle_opens + 1 : 0;
    r.opened = false;
  }
  if (r.idle_opens >= kMaxIdleOpens) {
    // Bubbles opened for it pass unused: its own prediction (the worst of its recent steps) says
    // no step fits where pswitchd's smoothed one says it does. A new run starts from the latter.
    base::Log(base::LogLevel::kWarn, "fill_run_idle")
        .Field("job", id)
        .Field("bubbles", r.idle_opens)
        .FieldMs("predicted_ms", job.predicted_step);
    if (++job.idle_runs >= kMaxIdleRuns) {
      // Runs started anew from pswitchd's prediction do no better: its steps (or rows) do not
      // fit these bubbles as they run.
      Stop(id, job,
           absl::FailedPreconditionError(
               absl::StrCat("fill job ", id, ": no step or part of one finished in ",
                            kMaxIdleRuns * kMaxIdleOpens, " bubbles opened for it on GPU ", gpu,
                            " (predicted step ", absl::FormatDuration(job.predicted_step),
                            "): its work does not fit them")));
    } else {
      StopResident(id);
    }
    return false;
  }
  // Still in the step it was in at the last close, being cut: an open now would move its cut
  // time past the bubble it belongs to. It sleeps through this bubble; a grace after the close
  // the scheduler kills a step not cut by then, and a page that still says so ends the run.
  if (r.close_step_start_ns != 0) {
    const BubbleBell::Report now = r.bell->Read();
    if (now.stepping && now.last_step_start_ns == r.close_step_start_ns) {
      if (base::MonotonicNowNs() > r.closed_at_ns + absl::ToInt64Nanoseconds(options_.grace)) {
        StopResident(id);
      }
      return false;
    }
    r.close_step_start_ns = 0;
  }
  // Not even one step fits what is left: the run stays asleep.
  if (job.machine.state() != fill::FillState::kPaused || left <= MinStep(job) + options_.margin) {
    return false;
  }
  Transition(id, job, fill::FillEvent::kStart);
  ++job.bubbles;
  ++stats_.bell_wakes;
  r.steps_at_open = r.steps_seen;
  r.overruns_at_open = r.overruns_seen;
  r.parts_at_open = r.parts_seen;
  r.open_ns += bubble_end_ns - base::MonotonicNowNs();
  r.opened = true;
  g.resident->bell->Open(bubble_end_ns,
                         bubble_end_ns - absl::ToInt64Nanoseconds(options_.margin) / 2);
  return true;
}

std::optional<uint64_t> FillManager::NextJob(int gpu, absl::Time now) {
  if (scheduler_ == nullptr) return std::nullopt;
  auto stage = std::find(stage_gpu_.begin(), stage_gpu_.end(), gpu);
  if (stage == stage_gpu_.end()) return std::nullopt;  // no cycle registered here
  absl::StatusOr<std::optional<uint64_t>> next =
      scheduler_->Next(static_cast<int>(stage - stage_gpu_.begin()), now);
  return next.ok() ? *next : std::nullopt;
}

void FillManager::StopResident(uint64_t id) {
  for (auto& [gpu, g] : gpus_) {
    if (!g.resident || g.resident->job != id || g.resident->bell->stopped()) continue;
    // The bell wakes it wherever it waits; the scheduler bounds its end (its drain deadline).
    g.resident->bell->Stop();
    controller_->gpu(gpu).StopFill(g.resident->task);
  }
}

int64_t FillManager::PartsPerStep(const Job& job) const {
  if (!options_.resident_runs) return 1;
  // A resident dataset-inference run splits a step into the rows that fit (one at least); a
  // resident training run's step goes on in the next bubble, started with room for a part.
  if (job.request.kind == FillKind::kInference) return std::max<int64_t>(job.request.batch, 1);
  if (job.request.kind == FillKind::kTraining && options_.suspend_steps) {
    return fill::kSuspendParts;
  }
  return 1;
}

absl::Duration FillManager::MinStep(const Job& job) const {
  return job.predicted_step / PartsPerStep(job);
}

absl::Duration FillManager::LongestBubble(int gpu) const {
  absl::Duration longest;
  auto g = gpus_.find(gpu);
  if (g == gpus_.end() || !g->second.cycle) return longest;
  for (const fill::Bubble& b : g->second.cycle->bubbles) longest = std::max(longest, b.duration);
  return longest;
}

FillManager::RunCounts FillManager::Harvest(int gpu, GpuState& g) {
  GpuState::Resident& r = *g.resident;
  const BubbleBell::Report report = r.bell->Read();
  Job& job = jobs_.at(r.job);
  const uint64_t total = static_cast<uint64_t>(job.steps_total);
  // The worker's word: counters only go forward, and never past what the job has; step time no
  // more than the bubble time opened for the run, an overrun no longer than a bubble, a pause
  // between the close and now.
  const int64_t now_ns = base::MonotonicNowNs();
  RunCounts counts;
  const uint64_t steps = std::clamp(report.steps, r.steps_seen, r.steps_seen + total);
  counts.steps = steps - r.steps_seen;
  const int64_t step_ns =
      std::clamp(report.step_ns, r.step_ns_seen, std::max(r.step_ns_seen, r.open_ns));
  counts.step_time = absl::Nanoseconds(step_ns - r.step_ns_seen);
  counts.iterations_done = std::min(report.iterations_done, total);
  counts.overran = report.overruns > r.overruns_seen;
  counts.overrun_time =
      std::clamp(absl::Nanoseconds(report.overrun_ns), absl::ZeroDuration(), LongestBubble(gpu));
  r.steps_seen = steps;
  r.step_ns_seen = step_ns;
  r.overruns_seen = std::max(report.overruns, r.overruns_seen);
  r.parts_seen = std::max(report.parts, r.parts_seen);
  if (r.closed_ns != 0 && !report.stepping) {
    // Paused: its last step ended (or was cut) this long after the close; before it counts as 0.
    const int64_t paused_ns = std::clamp(report.idle_since_ns, r.closed_ns, now_ns);
    RecordPauseLatency(gpu, absl::Nanoseconds(paused_ns - r.closed_ns));
    r.closed_ns = 0;
  }
  if (!job.machine.stopped()) Account(gpu, r.job, job, counts);
  return counts;
}

absl::Status FillManager::BubbleEnd(int gpu) {
  PSWITCH_RETURN_IF_ERROR(CheckGpu(gpu));
  online_->BubbleEnded(gpu);
  bool pause = false;
  std::optional<GpuScheduler::ResidentClose> resident_close;
  {
    absl::MutexLock lock(&mu_);
    GpuState& g = gpus_[gpu];
    if (!g.in_bubble) return absl::OkStatus();
    g.in_bubble = false;
    base::NvtxEnd(g.bubble_nvtx);
    g.bubble_nvtx = 0;
    const absl::Time now = absl::Now();
    stats_.bubble_time += now - g.bubble_begin;
    if (!g.resident) telemetry_->BubbleTime(gpu, now - g.bubble_begin);
    if (g.resident) {
      // Its bell tells the run (a step under way is cut now); the scheduler checks it paused.
      const int64_t now_ns = base::MonotonicNowNs();
      g.resident->bell->Close(now_ns);
      // What it completed since the bubble's start (harvested there) is this bubble's use.
      const RunCounts counts = Harvest(gpu, g);
      telemetry_->BubbleTime(gpu, now - g.bubble_begin,
                             Telemetry::BubbleUse{counts.step_time, counts.steps});
      Job& job = jobs_.at(g.resident->job);
      if (job.machine.state() == fill::FillState::kRunning) {  // it had this bubble
        Transition(g.resident->job, job, fill::FillEvent::kPause);
        g.resident->closed_ns = now_ns;
        // Read here, with the close: a bubble opened before the scheduler gets to the check
        // must show as opened since.
        const BubbleBell::Report at_close = g.resident->bell->Read();
        g.resident->close_step_start_ns = at_close.stepping ? at_close.last_step_start_ns : 0;
        g.resident->closed_at_ns = now_ns;
        g.resident->open_ns += absl::ToInt64Nanoseconds(options_.grace);
        resident_close =
            GpuScheduler::ResidentClose{g.resident->bell->opens(), at_close.late_starts,
                                        g.resident->close_step_start_ns, now_ns};
        pause = true;
      }
    } else {
      // A run still going from an earlier bubble keeps that bubble's end (its pause latency and
      // kill deadline count from there).
      if (!g.running_job || g.ended) return absl::OkStatus();
      g.bubble_end = now;
      g.ended = true;
      if (g.run_done) {
        RecordPause(gpu, g);
      } else {
        pause = true;
      }
    }
  }
  if (pause) controller_->gpu(gpu).EndBubble(options_.grace, resident_close);
  return absl::OkStatus();
}

void FillManager::RecordPause(int gpu, GpuState& g) {
  // Paused before the bubble ended (the step gate) counts as zero.
  RecordPauseLatency(gpu, std::max(absl::ZeroDuration(), g.run_done_at - g.bubble_end));
  g.running_job.reset();
}

void FillManager::RecordPauseLatency(int gpu, absl::Duration latency) {
  pause_latencies_.push_back(latency);
  telemetry_->FillPaused(gpu, latency);
  // Recent samples only; dropping the older half at once keeps BubbleEnd O(1) amortized.
  if (pause_latencies_.size() > 100000) {
    pause_latencies_.erase(pause_latencies_.begin(), pause_latencies_.begin() + 50000);
  }
}

void FillManager::OnRunDone(int gpu, uint64_t id, const absl::StatusOr<TaskOutcome>& outcome) {
  absl::MutexLock lock(&mu_);
  GpuState& g = gpus_[gpu];
  // A resident run's counts so far came on its bell: what its RunDone adds is the rest.
  RunCounts counted;
  // The most step time the run can have had (the worker's word is capped by it): the bubble time
  // opened for it, or one bubble and its grace.
  absl::Duration most = LongestBubble(gpu) + options_.grace;
  const bool resident = g.resident && g.resident->job == id;
  if (resident) {
    Harvest(gpu, g);
    counted.steps = g.resident->steps_seen;
    counted.step_time = absl::Nanoseconds(g.resident->step_ns_seen);
    counted.overran = g.resident->overruns_seen > 0;
    most = absl::Nanoseconds(g.resident->open_ns);
    g.resident.reset();
    g.running_job.reset();
  } else if (g.running_job == id) {
    g.run_done = true;
    g.run_done_at = outcome.ok() ? outcome->paused_at : absl::Now();
    if (g.ended) RecordPause(gpu, g);
  }
  Job& job = jobs_.at(id);
  job.run_out = false;
  if (job.machine.stopped()) {  // stopped while this run was out: drop what it saved
    controller_->checkpoints().Drop(CheckpointKey::FillJob(id));
    return;
  }
  if (!outcome.ok()) {
    if (WasKilled(outcome.status())) ++stats_.killed;
    Stop(id, job, outcome.status());
    return;
  }
  RunCounts counts;
  counts.steps = outcome->fill_steps > counted.steps ? outcome->fill_steps - counted.steps : 0;
  counts.step_time =
      std::clamp(outcome->fill_step_time, counted.step_time, std::max(counted.step_time, most)) -
      counted.step_time;
  counts.iterations_done = outcome->iterations_done;
  counts.overran = outcome->fill_step_overran && !counted.overran;
  counts.overrun_time =
      std::clamp(outcome->fill_predicted_step, absl::ZeroDuration(), LongestBubble(gpu));
  Account(gpu, id, job, counts);
  for (const proto::HostTensor& t : outcome->outputs) job.outputs.push_back(t);
  if (job.steps_done >= job.steps_total) {
    if (job.request.kind != FillKind::kInference) {
      Stop(id, job, absl::OkStatus());
      return;
    }
    // Every row is computed; the job stops once its output is on disk, written on the I/O
    // thread while this lock (which every bubble signal takes) stays free.
    controller_->checkpoints().Drop(CheckpointKey::FillJob(id));
    Background([this, id, request = job.request, outputs = std::move(job.outputs)] {
      {
        absl::MutexLock lock(&mu_);
        Job& waiting = jobs_.at(id);
        // Stopped (cancelled) while this waited for the I/O thread: the client no longer wants
        // the output, and its file (or the name under the root) is left as it was.
        if (waiting.machine.stopped()) return;
        waiting.writing_output = true;  // from here Cancel is refused: the file is being written
      }
      absl::Status written = WriteOutputs(options_.data_root.get(), request, outputs);
      absl::MutexLock lock(&mu_);
      Job& job = jobs_.at(id);
      job.writing_output = false;
      Stop(id, job, written, /*drop_checkpoint=*/false);
    });
    job.outputs.clear();
    return;
  }
  // RUNNING -> PAUSED until its next bubble (a resident run may have ended between bubbles).
  if (job.machine.state() == fill::FillState::kRunning) {
    Transition(id, job, fill::FillEvent::kPause);
  }
  if (absl::Status fits = StepFitsBubbles(id, job, gpu); !fits.ok()) Stop(id, job, fits);
}

void FillManager::Account(int gpu, uint64_t id, Job& job, const RunCounts& counts) {
  // Steps the job ran while RUNNING; a resident run's last ones may be read after its pause.
  if (job.machine.state() == fill::FillState::kRunning) {
    for (uint64_t i = 0; i < counts.steps; ++i) Transition(id, job, fill::FillEvent::kRunNextStep);
  }
  stats_.steps += counts.steps;
  stats_.fill_step_time += counts.step_time;
  telemetry_->FillStepTime(gpu, counts.step_time);
  if (counts.steps > 0) {
    // Across bubbles the job's step time is a smoothed measurement: one descheduled step must
    // not lock the job out of every bubble (within a bubble, the worker's gate is stricter).
    const absl::Duration mean = counts.step_time / counts.steps;
    job.predicted_step = job.measured_runs == 0 ? mean : job.predicted_step * 0.8 + mean * 0.2;
    ++job.measured_runs;
  }
  if (counts.overran) {
    // A step ran past its bubble's end and was cut there (it left no trace): it takes at least
    // the time it ran. That counts as one smoothed sample, as a measured step does: a
    // descheduled step must not lock the job out of its bubbles, and steps that keep overrunning
    // push the prediction up until none is started where it cannot end.
    job.predicted_step =
        std::max(job.predicted_step, job.predicted_step * 0.8 + counts.overrun_time * 0.2);
    base::Log(base::LogLevel::kWarn, "fill_step_overran")
        .Field("job", id)
        .FieldMs("ran_at_least_ms", counts.overrun_time)
        .FieldMs("now_predicted_ms", job.predicted_step);
  }
  // The job's progress only goes forward (a late report never takes it back).
  job.steps_done =
      std::max(job.steps_done,
               std::min<int64_t>(static_cast<int64_t>(counts.iterations_done), job.steps_total));
  if (scheduler_ != nullptr) {
    (void)scheduler_->ReportProgress(id, job.steps_done * PartsPerStep(job));
  }
}

absl::Status FillManager::StepFitsBubbles(uint64_t id, const Job& job, int gpu) const {
  // A job whose measured steps no longer fit any bubble of its GPU would wait forever.
  const absl::Duration longest = LongestBubble(gpu);
  if (longest == absl::ZeroDuration() || MinStep(job) + options_.margin < longest) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("fill job ", id, ": its steps now take ",
                   absl::FormatDuration(job.predicted_step), " (measured), too long for GPU ", gpu,
                   "'s bubbles (at most ", absl::FormatDuration(longest), ")"));
}

absl::StatusOr<FillJobStatus> FillManager::Query(uint64_t job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no fill job ", job_id));
  const Job& job = it->second;
  FillJobStatus status;
  status.job_id = job_id;
  status.state = job.machine.state();
  status.gpu = static_cast<uint32_t>(std::max(job.gpu, 0));  // placed at submission
  status.steps_done = static_cast<uint64_t>(job.steps_done);
  status.steps_total = static_cast<uint64_t>(job.steps_total);
  status.bubbles = job.bubbles;
  status.error = job.error;
  if (!job.machine.stopped() && scheduler_ != nullptr) {
    const absl::Time now = absl::Now();
    auto estimate = scheduler_->Estimate(job_id, now);
    if (estimate.ok()) {
      status.predicted_remaining = std::max(absl::ZeroDuration(), estimate->completion - now);
      status.meets_deadline = estimate->meets_deadline;
    }
  }
  return status;
}

std::map<std::string, int> FillManager::JobsByState() const {
  std::map<std::string, int> counts;
  using api::FillState;
  for (FillState state : {FillState::kSubmitted, FillState::kCreated, FillState::kPaused,
                          FillState::kRunning, FillState::kStopped}) {
    counts[std::string(api::FillStateName(state))] = 0;
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [id, job] : jobs_) {
    ++counts[std::string(api::FillStateName(job.machine.state()))];
  }
  return counts;
}

std::optional<fill::BubbleCycle> FillManager::Cycle(int gpu) const {
  if (!CheckGpu(gpu).ok()) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = gpus_.find(gpu);
  return it == gpus_.end() ? std::nullopt : it->second.cycle;
}

FillStats FillManager::Stats() const {
  absl::MutexLock lock(&mu_);
  FillStats stats = stats_;
  stats.pause_p50 = Percentile(pause_latencies_, 0.5);
  stats.pause_p99 = Percentile(pause_latencies_, 0.99);
  return stats;
}

}  // namespace pswitch::controller
