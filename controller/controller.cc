#include "controller/controller.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "gpu/device.h"
#include "registry/phase_clock.h"

namespace pswitch::controller {

using registry::CatalogEntry;
using registry::EntryRef;
using registry::ModelCatalog;
using registry::ModelRequest;

absl::StatusOr<std::unique_ptr<Controller>> Controller::Create(
    const ControllerOptions& options, const std::vector<memdaemon::MemDaemon*>& daemons) {
  std::unique_ptr<Controller> c(new Controller(options));
  if (daemons.empty() || daemons.size() > static_cast<size_t>(kMaxGpus)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpus must be in [1, ", kMaxGpus, "], got ", daemons.size()));
  }
  if (!options.inspector) return absl::InvalidArgumentError("the controller needs an inspector");
  // Each GPU's arena holds one weights pool (the resident models' regions and training runs'
  // optimizer state: WeightsCache) and its workers' activation leases. Every pool has the size
  // of the smallest, so a model that fits one GPU fits them all.
  uint64_t region_bytes = UINT64_MAX;
  for (size_t g = 0; g < daemons.size(); ++g) {
    // Every lease takes whole units of the arena's alignment (2 MiB on a CUDA VMM arena).
    const uint64_t align = daemons[g]->leases().alignment();
    const uint64_t activations = (options.scheduler.spawn.activation_bytes + align - 1) / align *
                                 align * static_cast<uint64_t>(options.scheduler.workers);
    const uint64_t free_bytes = daemons[g]->leases().largest_free_bytes();
    // At least one unit of the region's rounding must be left for the weights.
    const uint64_t unit = std::max<uint64_t>(align, 1 << 20);
    if (free_bytes <= activations + unit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "GPU ", g, ": the arena's ", free_bytes, " free bytes cannot hold ",
          options.scheduler.workers, " activation leases of ",
          options.scheduler.spawn.activation_bytes,
          " bytes and a weights pool (raise --arena-bytes or lower --activation-bytes)"));
    }
    region_bytes = std::min(region_bytes, (free_bytes - activations) / unit * unit);
  }
  c->catalog_ = std::make_unique<ModelCatalog>(daemons.front(), region_bytes, options.inspector);
  c->checkpoints_ = std::make_shared<StateCheckpoints>();
  for (size_t g = 0; g < daemons.size(); ++g) {
    PSWITCH_ASSIGN_OR_RETURN(
        memdaemon::Lease region,
        daemons[g]->leases().Acquire(absl::StrCat("gpu-", g, "-weights-region"), region_bytes));
    SchedulerOptions scheduler = options.scheduler;
    scheduler.gpu = static_cast<int>(g);
    scheduler.region_offset = region.offset;
    scheduler.region_bytes = region.bytes;
    scheduler.region_alignment = daemons[g]->leases().alignment();
    scheduler.checkpoints = c->checkpoints_;
    // Preempted tasks' optimizer state stays in the pool within the operator's cap.
    scheduler.resident_state_bytes =
        options.optimizer_state_bytes == 0 ? UINT64_MAX : options.optimizer_state_bytes;
    scheduler.sole_gpu = daemons.size() == 1;
    scheduler.spawn.memdaemon_socket = daemons[g]->socket_path();
    // Only the workers this scheduler spawns attach the arena, each once (WorkerServer).
    scheduler.spawn.attach_secret = [daemon = daemons[g]] { return daemon->IssueAttachSecret(); };
    scheduler.spawn.device_ordinal = daemons[g]->device_ordinal();
    PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<GpuScheduler> s,
                             GpuScheduler::Start(scheduler, daemons[g], c->catalog_.get()));
    c->schedulers_.push_back(std::move(s));
  }
  c->registrar_ = std::thread([p = c.get()] { p->RegistrarLoop(); });
  return c;
}

Controller::~Controller() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (registrar_.joinable()) registrar_.join();  // not started when Create failed
  schedulers_.clear();
}

void Controller::RegistrarLoop() {
  while (true) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !registrations_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (registrations_.empty()) return;
      job = std::move(registrations_.front());
      registrations_.pop_front();
    }
    job();
  }
}

void Controller::Register(ModelRequest request, RegisterCallback done,
                          registry::PhaseObserver progress) {
  Register([request = std::move(request)]() -> absl::StatusOr<ModelRequest> { return request; },
           std::move(done), std::move(progress));
}

uint64_t Controller::Track(const std::string& name, const std::string& owner) {
  absl::MutexLock lock(&progress_mu_);
  const uint64_t token = ++next_token_;
  // A name already tracked is being registered: this registration will be refused, and the
  // first one's entry stays.
  in_progress_.try_emplace(name, Tracked{token, owner, {}, {}, false});
  return token;
}

void Controller::Note(const std::string& name, uint64_t token,
                      const registry::RegistrationPhase* ended, bool loading) {
  absl::MutexLock lock(&progress_mu_);
  auto it = in_progress_.find(name);
  if (it == in_progress_.end() || it->second.token != token) return;
  if (ended != nullptr && ended->running()) {
    it->second.running = *ended;
  } else if (ended != nullptr) {
    it->second.phases.push_back(*ended);
    it->second.running = {};
  }
  it->second.loading |= loading;
}

void Controller::Untrack(const std::string& name, uint64_t token) {
  absl::MutexLock lock(&progress_mu_);
  auto it = in_progress_.find(name);
  if (it != in_progress_.end() && it->second.token == token) in_progress_.erase(it);
}

std::vector<Controller::InProgress> Controller::RegistrationsInProgress() const {
  absl::MutexLock lock(&progress_mu_);
  std::vector<InProgress> out;
  for (const auto& [name, t] : in_progress_) {
    std::string reason = t.loading ? "loading on the workers" : "registering";
    std::string done = registry::FormatPhases(t.phases);
    if (t.running.running()) {
      absl::StrAppend(&done, done.empty() ? "" : "; ", t.running.name, ": ", t.running.detail);
    }
    if (!done.empty()) absl::StrAppend(&reason, " (", done, ")");
    out.push_back(InProgress{name, t.owner, std::move(reason)});
  }
  return out;
}

void Controller::Register(RequestMaker make_request, RegisterCallback done,
                          registry::PhaseObserver progress) {
  const bool queued = Enqueue([this, make_request = std::move(make_request), done,
                               progress = std::move(progress)]() mutable {
    absl::StatusOr<ModelRequest> request = make_request();
    if (request.ok() && (request->batch_size == 0 || request->batch_size > options_.max_batch)) {
      request = absl::InvalidArgumentError(absl::StrCat("batch size ", request->batch_size,
                                                        " out of range [1, ", options_.max_batch,
                                                        "] (--max-batch)"));
    }
    if (!request.ok()) {
      done(request.status());
      return;
    }
    const std::string name = request->name;
    const uint64_t token = Track(name, request->owner);
    registry::PhaseObserver observe = [this, name, token,
                                       progress](const registry::RegistrationPhase& ended) {
      Note(name, token, &ended, /*loading=*/false);
      if (progress) progress(ended);
    };
    std::vector<registry::RegistrationPhase> phases;
    absl::StatusOr<EntryRef> entry = catalog_->Register(*request, &phases, observe);
    if (!entry.ok()) {
      Untrack(name, token);
      done(entry.status());
      return;
    }
    Note(name, token, nullptr, /*loading=*/true);
    LoadEverywhere(
        *std::move(entry), std::move(phases),
        [this, name, token, done = std::move(done)](const absl::StatusOr<Registered>& outcome) {
          Untrack(name, token);
          done(outcome);
        },
        std::move(observe));
  });
  if (!queued) done(absl::CancelledError("pswitchd is shutting down"));
}

bool Controller::Enqueue(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  registrations_.push_back(std::move(job));
  return true;
}

void Controller::RegisterCopy(std::string original, std::string name, std::string owner,
                              RegisterCallback done) {
  // On the registration thread, where unloads finish too: the original's pinned weights stay
  // while they are copied.
  const bool queued = Enqueue([this, original = std::move(original), name = std::move(name),
                               owner = std::move(owner), done] {
    absl::StatusOr<EntryRef> from = catalog_->Find(original);
    if (!from.ok()) {
      done(from.status());
      return;
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<EntryRef> entry = catalog_->RegisterCopy(**from, name, owner);
    if (!entry.ok()) {
      done(entry.status());
      return;
    }
    LoadEverywhere(*std::move(entry), {{"pin", absl::Now() - start}}, std::move(done));
  });
  if (!queued) done(absl::CancelledError("pswitchd is shutting down"));
}

void Controller::LoadEverywhere(EntryRef entry, std::vector<registry::RegistrationPhase> phases,
                                RegisterCallback done, registry::PhaseObserver progress) {
  // Done once every GPU's workers loaded it; the first error wins.
  const absl::Time start = absl::Now();
  OnEveryGpu(
      [&entry](GpuScheduler& gpu, Done loaded) { gpu.AddModel(entry, loaded); },
      [this, entry, start, phases = std::move(phases), done = std::move(done),
       progress = std::move(progress)](const LoadOutcome& loaded) mutable {
        if (!loaded.status.ok()) {
          // A model some worker could not load (or warm up) is not left registered:
          // it goes as a client's unload would, then the registration fails.
          Unload(entry->request.name, [done = std::move(done), error = loaded.status,
                                       name = entry->request.name](absl::Status gone) {
            if (!gone.ok()) {
              base::Log(base::LogLevel::kWarn, "registration_rollback_failed")
                  .Field("model", name)
                  .Field("error", gone);
            }
            done(error);
          });
          return;
        }
        phases.push_back({"load", absl::Now() - start});
        base::Log(base::LogLevel::kInfo, "registration_phase")
            .Field("model", entry->request.name)
            .Field("phase", "load")
            .FieldMs("ms", phases.back().took);
        if (progress) progress(phases.back());
        absl::Duration total;
        for (const registry::RegistrationPhase& p : phases) total += p.took;
        base::Log(base::LogLevel::kInfo, "model_registered")
            .Field("model", entry->request.name)
            .Field("layers", entry->layers)
            .Field("groups", entry->plan.size())
            .Field("weight_bytes", entry->weight_bytes)
            .FieldMs("total_ms", total)
            .Field("phases", registry::FormatPhases(phases));
        done(Registered{std::move(entry), std::move(phases), loaded.infer_step, loaded.train_step});
      });
}

void Controller::OnEveryGpu(const std::function<void(GpuScheduler&, Done)>& start, Done all) {
  struct Pending {
    absl::Mutex mu;
    size_t remaining;
    LoadOutcome sum;
  };
  auto pending = std::make_shared<Pending>();
  pending->remaining = schedulers_.size();
  for (auto& scheduler : schedulers_) {
    start(*scheduler, [all, pending](const LoadOutcome& one) {
      LoadOutcome sum;
      {
        absl::MutexLock lock(&pending->mu);
        pending->sum.Merge(one);
        if (--pending->remaining > 0) return;
        sum = pending->sum;
      }
      all(sum);
    });
  }
}

void Controller::Unload(std::string name, std::function<void(absl::Status)> done) {
  const bool queued = Enqueue([this, name = std::move(name), done] {
    absl::StatusOr<EntryRef> entry = catalog_->BeginUnload(name);
    if (!entry.ok()) {
      done(entry.status());
      return;
    }
    OnEveryGpu(
        [&name](GpuScheduler& gpu, Done dropped) {
          gpu.DropModel(name, [dropped](absl::Status status) { dropped({std::move(status)}); });
        },
        [this, entry = *entry, done](const LoadOutcome& outcome) {
          const absl::Status& status = outcome.status;
          if (!status.ok()) {  // shutting down: the weights go with the process
            done(status);
            return;
          }
          // Unpinning gigabytes takes long (and may synchronise the device): not on a
          // scheduler's loop, but on the registration thread.
          if (!Enqueue([this, entry, done] { done(catalog_->FinishUnload(*entry)); })) {
            done(absl::CancelledError("pswitchd is shutting down"));
          }
        });
  });
  // Never under mu_: a callback may register or unload again (a fill job's rollback does).
  if (!queued) done(absl::CancelledError("pswitchd is shutting down"));
}

namespace {

// The model's input in kind (floating point or integer) and rank: the client's mistake is told
// as such, not as the model's failure in a worker.
absl::Status CheckInput(const CatalogEntry& entry, const proto::HostTensor& t) {
  // A half-precision model takes its own dtype exactly (the worker never converts a client's).
  const bool floating = entry.input.dtype == proto::DType::F32 ||
                        entry.input.dtype == proto::DType::F16 ||
                        entry.input.dtype == proto::DType::BF16;
  const bool kind_fits = floating ? t.dtype == entry.input.dtype
                                  : t.dtype != proto::DType::F32 && t.dtype != proto::DType::F16 &&
                                        t.dtype != proto::DType::BF16;
  if (!kind_fits || t.shape.size() != entry.input.shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", entry.request.name, "' takes a ", entry.input.shape.size(), "-d ",
                     proto::EnumNameDType(entry.input.dtype), " input; got a ", t.shape.size(),
                     "-d ", proto::EnumNameDType(t.dtype), " tensor"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Controller::Check(const TaskSpec& spec) const {
  PSWITCH_ASSIGN_OR_RETURN(EntryRef entry, catalog_->Find(spec.model));
  if (spec.kind == TaskKind::kInference) {
    if (spec.batch != 0) {
      return absl::InvalidArgumentError(
          "an inference task's batch is its input's first dimension; batch_size is for training");
    }
    if (spec.inputs.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("inference on '", spec.model, "' needs an 'input' tensor"));
    }
    uint64_t input_bytes = 0;
    for (const proto::HostTensor& t : spec.inputs) {
      PSWITCH_RETURN_IF_ERROR(ValidateHostTensor(t));
      if (t.name == entry->input.name) PSWITCH_RETURN_IF_ERROR(CheckInput(*entry, t));
      input_bytes += t.data.size();
      if (!t.shape.empty() && t.shape[0] > static_cast<int64_t>(options_.max_batch)) {
        return absl::InvalidArgumentError(absl::StrCat("an input's first dimension (its batch) is ",
                                                       t.shape[0], "; the most is ",
                                                       options_.max_batch, " (--max-batch)"));
      }
    }
    if (input_bytes > options_.max_input_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("inputs of ", input_bytes, " bytes; the most is ", options_.max_input_bytes,
                       " (--max-input-bytes)"));
    }
  } else {
    PSWITCH_RETURN_IF_ERROR(entry->trainable);
    if (spec.iterations == 0 || spec.iterations > options_.max_training_iterations) {
      return absl::InvalidArgumentError(absl::StrCat("training iterations must be in [1, ",
                                                     options_.max_training_iterations, "], got ",
                                                     spec.iterations));
    }
    if (spec.batch > options_.max_batch) {
      return absl::InvalidArgumentError(
          absl::StrCat("training batch size must be in [1, ", options_.max_batch,
                       "] (0 = the model's; --max-batch), got ", spec.batch));
    }
    const api::TrainerOptions& t = spec.trainer;
    if (!(t.learning_rate > 0 && t.learning_rate <= 10)) {
      return absl::InvalidArgumentError(
          absl::StrCat("learning rate must be in (0, 10], got ", t.learning_rate));
    }
    if (!(t.momentum >= 0 && t.momentum < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("momentum must be in [0, 1), got ", t.momentum));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Controller::SubmitTo(size_t gpu, TaskSpec spec, TaskCallback done) {
  if (gpu >= schedulers_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no GPU ", gpu, " (this daemon has ", schedulers_.size(), ")"));
  }
  PSWITCH_RETURN_IF_ERROR(Check(spec));
  if (spec.kind == TaskKind::kInference && options_.inference_holds_device_lock) {
    spec.device_lock_path = gpu::HostComputeLockPath(static_cast<int>(gpu));
  }
  spec.expires = std::min(spec.deadline, absl::Now() + options_.max_task_time);
  return schedulers_[gpu]->Submit(std::move(spec), std::move(done));
}

}  // namespace pswitch::controller
