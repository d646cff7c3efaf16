#include "controller/worker_pool.h"

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "proto/framing.h"
#include "proto/wire_status.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {

using Builder = flatbuffers::FlatBufferBuilder;

WorkerPool::WorkerPool(WorkerPoolOptions options, std::shared_ptr<EventLoop> loop,
                       Listener* listener)
    : options_(std::move(options)),
      loop_(std::move(loop)),
      listener_(listener),
      slots_(static_cast<size_t>(std::max(options_.workers, 0))),
      respawns_(slots_.size()),
      loads_(slots_.size()) {}

WorkerPool::~WorkerPool() { Close(); }

void WorkerPool::Start() {
  for (int i = 0; i < size(); ++i) Spawn(i);
}

void WorkerPool::Close() {
  stopping_ = true;
  for (size_t i = 0; i < slots_.size(); ++i) {
    // Shuts the worker down and joins its reader: no event of it is posted after this.
    slots_[i].process.reset();
    slots_[i].state = State::kDead;
    // Nothing of that worker is in flight any more: no transmission may wait for its drain.
    options_.release_drain(static_cast<uint32_t>(i), slots_[i].drain_value);
  }
  RefreshReadiness();
}

base::Log WorkerPool::Event(base::LogLevel level, absl::string_view event) const {
  base::Log line(level, event);
  line.Field("gpu", options_.gpu);
  return line;
}

void WorkerPool::Spawn(int slot) {
  Slot& s = slots_[slot];
  // The drain flag keeps its value across workers: counting on from it keeps every later drain
  // wait meaningful.
  const uint32_t drain_value = s.drain_value;
  s = Slot{};
  s.drain_value = drain_value;
  loads_.Reset(static_cast<size_t>(slot));
  auto process = options_.launch(
      static_cast<uint32_t>(slot),
      [this, slot, loop = loop_](uint32_t, absl::StatusOr<std::vector<uint8_t>> event) {
        loop->Post([this, slot, event = std::move(event)] { OnEvent(slot, event); });
      });
  if (!process.ok()) {
    Event(base::LogLevel::kError, "worker_spawn_failed")
        .Field("slot", slot)
        .Field("error", process.status());
    s.state = State::kDead;
    ScheduleRespawn(slot, /*was_ready=*/false, process.status());
    return;
  }
  s.process = std::move(*process);
  s.state = State::kStarting;
  RefreshReadiness();
}

void WorkerPool::OnEvent(int slot, const absl::StatusOr<std::vector<uint8_t>>& event) {
  if (!event.ok()) {
    OnDied(slot, event.status());
    return;
  }
  if (slots_[slot].state == State::kDead) return;  // a message that raced its process's death
  slots_[slot].last_heard = absl::Now();
  auto* e = flatbuffers::GetRoot<proto::WorkerEvent>(event->data());
  switch (e->body_type()) {
    case proto::WorkerEventBody::WorkerReady:
      loads_.Announce(static_cast<size_t>(slot));
      for (const WorkerModel& model : options_.models()) SendLoad(slot, model);
      break;
    case proto::WorkerEventBody::ModelLoaded: {
      auto* loaded = e->body_as_ModelLoaded();
      std::string name = loaded->name() ? loaded->name()->str() : "";
      absl::Status status =
          loaded->error() != nullptr ? proto::FromWireError(loaded->error()) : absl::OkStatus();
      LoadOutcome outcome{status, absl::Nanoseconds(std::max<int64_t>(loaded->infer_step_ns(), 0)),
                          absl::Nanoseconds(std::max<int64_t>(loaded->train_step_ns(), 0))};
      if (!status.ok()) {
        Event(base::LogLevel::kError, "model_load_failed")
            .Field("slot", slot)
            .Field("model", name)
            .Field("error", status);
      } else {
        // Each worker's part of a registration's "load" phase; the warm-up is what it took off
        // the first task (CUDA context, cuBLAS/cuDNN plans at the batch, autograd, modules).
        base::Log line = Event(base::LogLevel::kInfo, "model_loaded");
        line.Field("slot", slot)
            .Field("model", name)
            .Field("load_ms", loaded->load_ns() / 1e6, 1)
            .Field("warm_ms", loaded->warm_ns() / 1e6, 1);
        if (outcome.infer_step > absl::ZeroDuration()) {
          line.FieldMs("infer_step_ms", outcome.infer_step);
        }
        if (outcome.train_step > absl::ZeroDuration()) {
          line.FieldMs("train_step_ms", outcome.train_step);
        }
        if (loaded->train_warm_error() != nullptr) {
          // It serves; training it at this batch here fails the same way.
          Event(base::LogLevel::kWarn, "model_train_warm_up_failed")
              .Field("slot", slot)
              .Field("model", name)
              .Field("error", loaded->train_warm_error()->str());
        }
      }
      loads_.Answered(static_cast<size_t>(slot), name, outcome);
      SendDeferredLoads();
      break;
    }
    case proto::WorkerEventBody::RunDone:
      if (slots_[slot].state == State::kBusy) slots_[slot].state = State::kIdle;
      listener_->OnRunDone(slot, *e->body_as_RunDone());
      break;
    case proto::WorkerEventBody::Heartbeat: {
      // The pool's periodic tick: regions whose last holder ended since the last Run go now.
      SweepRegions(slot);
      auto* beat = e->body_as_Heartbeat();
      if (beat->task_id() != 0 && slots_[slot].state == State::kBusy) {
        listener_->OnProgress(slot, beat->task_id(), beat->iterations_done());
      }
      break;
    }
    case proto::WorkerEventBody::Drained:
      // The copy engine waits on the drain flag itself; this reports the cleaning.
      if (slots_[slot].last_task != 0) {
        listener_->OnDrained(slot, slots_[slot].last_task, *e->body_as_Drained());
      }
      break;
    case proto::WorkerEventBody::RegionMapFailed: {
      // The mapping was recorded when the MapRegion was sent: forgotten, so the next Run that
      // names the region maps it again (a failure may pass, e.g. a page-locking the device
      // refused once). The Runs already sent naming it fail NotFound with the reason.
      auto* failed = e->body_as_RegionMapFailed();
      const uint64_t region = failed != nullptr ? failed->region() : 0;
      const bool forgotten = slots_[slot].regions.Forget(region);
      Event(base::LogLevel::kWarn, "worker_region_map_failed")
          .Field("slot", slot)
          .Field("region", region)
          .Field("forgotten", forgotten)
          .Field("error", failed != nullptr && failed->error() != nullptr
                              ? proto::FromWireError(failed->error())
                              : absl::UnknownError("no detail"));
      break;
    }
    case proto::WorkerEventBody::Error: {
      // A command the worker could not honour and that has no answer of its own. Said, not
      // hidden.
      auto* error = e->body_as_Error();
      Event(base::LogLevel::kWarn, "worker_command_failed")
          .Field("slot", slot)
          .Field("error", error != nullptr ? proto::FromWireError(error)
                                           : absl::UnknownError("no detail"));
      break;
    }
    default:
      break;
  }
  MarkIdleOnceLoaded(slot);
  RefreshReadiness();
}

void WorkerPool::MarkIdleOnceLoaded(int slot) {
  Slot& s = slots_[slot];
  if (s.state != State::kStarting || !loads_.announced(static_cast<size_t>(slot)) ||
      loads_.pending(static_cast<size_t>(slot)) > 0) {
    return;
  }
  s.state = State::kIdle;
  // Operators (and the end-to-end tests) see when a fresh worker can take tasks.
  Event(base::LogLevel::kInfo, "worker_ready")
      .Field("slot", slot)
      .Field("pid", s.process->pid())
      .Field("models", loads_.loaded_count(static_cast<size_t>(slot)));
}

void WorkerPool::SendLoad(int slot, const WorkerModel& model) {
  Slot& s = slots_[slot];
  Builder b;
  flatbuffers::Offset<proto::WarmUp> warm = 0;
  if (model.warm.batch > 0) {
    warm = proto::CreateWarmUp(b, model.warm.batch, model.warm.train, model.warm.train_required,
                               model.warm.measure);
  }
  std::vector<flatbuffers::Offset<proto::LayoutLayer>> layers;
  layers.reserve(model.layout.size());
  for (const memdaemon::LayerSpec& layer : model.layout) {
    std::vector<flatbuffers::Offset<flatbuffers::String>> names;
    std::vector<uint64_t> sizes;
    for (const memdaemon::TensorSpec& t : layer.tensors) {
      names.push_back(b.CreateString(t.name));
      sizes.push_back(t.bytes);
    }
    layers.push_back(proto::CreateLayoutLayer(b, b.CreateString(layer.name), b.CreateVector(names),
                                              b.CreateVector(sizes)));
  }
  auto load = proto::CreateLoadModel(
      b, b.CreateString(model.name), b.CreateString(model.zoo_model), options_.region_offset,
      b.CreateVector(layers), b.CreateVector(model.train_order), model.bytes, model.archive_bytes,
      warm, model.dtype.empty() ? 0 : b.CreateString(model.dtype));
  proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::LoadModel, load.Union()));
  const int fd = model.archive != nullptr ? model.archive->get() : -1;
  if (s.process != nullptr && SendTo(slot, b, fd).ok()) {
    loads_.Sent(static_cast<size_t>(slot), model.name);
  }
}

void WorkerPool::AddModel(const WorkerModel& model, ModelLoads::Done done) {
  std::vector<size_t> targets;
  size_t free_targets = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    // A worker that has not announced itself yet loads the whole catalog (this model included)
    // when it does; every other live one, even one still loading, is sent this model.
    if (slots_[i].state == State::kDead || !loads_.announced(i)) continue;
    if (loads_.Loaded(i, model.name)) continue;
    targets.push_back(i);
    if (Free(static_cast<int>(i))) ++free_targets;
  }
  // With two free workers or more, the last free one stays free for tasks meanwhile.
  int held = -1;
  if (free_targets >= 2) {
    for (auto it = targets.rbegin(); it != targets.rend(); ++it) {
      if (Free(static_cast<int>(*it))) {
        held = static_cast<int>(*it);
        break;
      }
    }
  }
  std::set<size_t> answers;
  for (size_t i : targets) {
    if (static_cast<int>(i) == held) {
      slots_[i].deferred.push_back(model);
      continue;
    }
    if (!loads_.Loading(i, model.name) || loads_.Dropped(i, model.name)) {
      SendLoad(static_cast<int>(i), model);
    }
    // Sent now, or its start-up load is in flight: either way its answer counts, unless the
    // worker is running a task. It loads the model after that run, which may be a training
    // task of hours: the registration must not wait for it (the slot takes tasks of the model
    // only once its load is answered).
    if (loads_.Loading(i, model.name) && slots_[i].state != State::kBusy) answers.insert(i);
  }
  loads_.Await(model.name, std::move(answers), std::move(done));
  SendDeferredLoads();
  RefreshReadiness();
}

void WorkerPool::SendDeferredLoads() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.deferred.empty()) continue;
    // A busy worker's loads wait for its run (maybe hours): they do not hold this one back.
    bool others_loading = false;
    for (size_t j = 0; j < slots_.size(); ++j) {
      others_loading |= j != i && loads_.pending(j) > 0 && slots_[j].state != State::kBusy;
    }
    if (others_loading) continue;
    std::vector<WorkerModel> deferred = std::move(s.deferred);
    s.deferred.clear();
    for (const WorkerModel& model : deferred) SendLoad(static_cast<int>(i), model);
  }
}

void WorkerPool::RemoveModel(const std::string& model) {
  flatbuffers::FlatBufferBuilder b;
  auto drop = proto::CreateDropModel(b, b.CreateString(model));
  proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::DropModel,
                                              drop.Union()));
  int told = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    // Loaded, or still loading (a busy worker loads after its run): the drop follows the load.
    if (!loads_.Holds(i, model) || s.state == State::kDead || s.process == nullptr) continue;
    // One that cannot be reached is dying; its replacement loads only the catalog.
    if (SendTo(static_cast<int>(i), b, -1).ok()) ++told;
  }
  loads_.Forget(model);
  for (Slot& s : slots_) {
    std::erase_if(s.deferred, [&](const WorkerModel& m) { return m.name == model; });
  }
  Event(base::LogLevel::kInfo, "workers_unload_model").Field("model", model).Field("workers", told);
}

void WorkerPool::RefreshReadiness() {
  bool ready = true;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].state == State::kStarting || slots_[i].state == State::kDead ||
        loads_.pending(i) > 0) {
      ready = false;
    }
  }
  absl::MutexLock lock(&mu_);
  ready_ = ready;
}

bool WorkerPool::AwaitReady(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&ready_), timeout);
}

void WorkerPool::ScheduleRespawn(int slot, bool was_ready, const absl::Status& why) {
  if (stopping_) return;
  const absl::Duration delay =
      respawns_.Failed(static_cast<size_t>(slot), was_ready, why.message(), absl::Now());
  if (delay == absl::ZeroDuration()) {
    Spawn(slot);
    return;
  }
  Event(base::LogLevel::kError, "worker_start_failed")
      .Field("slot", slot)
      .Field("failures_in_a_row", respawns_.start_failures(static_cast<size_t>(slot)))
      .Field("retry_in_ms", absl::ToDoubleMilliseconds(delay), 0)
      .Field("error", why.message());
}

absl::Time WorkerPool::NextRespawn() const {
  // Shutting down, nothing is respawned: a due restart must not spin the loop's timer.
  return stopping_ ? absl::InfiniteFuture() : respawns_.Next();
}

void WorkerPool::RespawnDue() {
  if (stopping_) return;
  for (size_t slot : respawns_.Due(absl::Now())) Spawn(static_cast<int>(slot));
}

absl::Time WorkerPool::NextSilenceDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    // Commands left unread count from the first one queued, announced or not.
    if (s.process != nullptr && s.state != State::kDead && s.kill_reason.empty()) {
      const absl::Time unsent = s.process->UnsentSince();
      if (unsent != absl::InfiniteFuture()) {
        next = std::min(next, unsent + options_.silence_timeout);
      }
    }
    // Heartbeats start once it announced itself; before, it may still be setting up a device.
    if (s.process == nullptr || s.state == State::kDead || !loads_.announced(i) ||
        !s.kill_reason.empty()) {
      continue;
    }
    next = std::min(next, s.last_heard + options_.silence_timeout);
  }
  return next;
}

void WorkerPool::KillSilent(absl::Time now) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.process != nullptr && s.state != State::kDead && s.kill_reason.empty()) {
      const absl::Time unsent = s.process->UnsentSince();
      if (unsent != absl::InfiniteFuture() && now >= unsent + options_.silence_timeout) {
        Kill(static_cast<int>(i),
             absl::StrCat("killed: the worker took none of its commands for ",
                          absl::FormatDuration(now - unsent),
                          " (it stopped reading its socket: stopped or wedged)"));
        continue;
      }
    }
    if (s.process == nullptr || s.state == State::kDead || !loads_.announced(i) ||
        !s.kill_reason.empty() || now < s.last_heard + options_.silence_timeout) {
      continue;
    }
    Kill(static_cast<int>(i),
         absl::StrCat("killed: the worker sent nothing for ",
                      absl::FormatDuration(now - s.last_heard),
                      " (no heartbeat: stopped or wedged)"));
  }
}

void WorkerPool::OnDied(int slot, const absl::Status& why) {
  Slot& s = slots_[slot];
  if (s.state == State::kDead) return;
  Event(stopping_ ? base::LogLevel::kInfo : base::LogLevel::kError, "worker_exit")
      .Field("slot", slot)
      .Field("detail", why.message());
  // Ready once it announced itself and answered its first loads; a crash after that is a task's.
  const bool was_ready = s.state == State::kIdle || s.state == State::kBusy;
  const bool was_busy = s.state == State::kBusy;
  s.state = State::kDead;
  // Nothing of a dead process is in flight: release whoever waits for its drain.
  options_.release_drain(static_cast<uint32_t>(slot), s.drain_value);
  // Its unanswered loads never will be: they stop holding up registrations. Its replacement
  // loads the whole catalog, held-back loads included.
  loads_.Died(static_cast<size_t>(slot));
  s.deferred.clear();
  s.process.reset();
  s.regions = RegionMappings();  // its mappings died with it
  const bool killed = !s.kill_reason.empty();
  listener_->OnWorkerDied(slot, killed ? absl::UnavailableError(s.kill_reason) : why, killed,
                          was_busy);
  ScheduleRespawn(slot, was_ready, why);
  SendDeferredLoads();
  RefreshReadiness();
}

bool WorkerPool::Free(int slot) const {
  const Slot& s = slots_[slot];
  return s.state == State::kIdle && loads_.pending(static_cast<size_t>(slot)) == 0 &&
         absl::Now() - s.last_heard < std::min(options_.suspect_after, options_.silence_timeout);
}

bool WorkerPool::Usable(int slot, const std::string& model) const {
  return Free(slot) && loads_.Loaded(static_cast<size_t>(slot), model);
}

WorkerPool::Outlook WorkerPool::ForModel(const std::string& model, absl::Status* never) const {
  bool possible = false, all_gave_up = true;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (Usable(static_cast<int>(i), model)) return Outlook::kNow;
    const State state = slots_[i].state;
    const bool gave_up = respawns_.GaveUp(i);
    all_gave_up &= gave_up;
    // A worker still starting (or about to be respawned), loading or busy may yet run it.
    possible |= (!gave_up && (state == State::kStarting || state == State::kDead)) ||
                state == State::kBusy || loads_.pending(i) > 0 || loads_.Loaded(i, model);
  }
  if (possible) return Outlook::kLater;
  if (never == nullptr) return Outlook::kNever;
  *never = all_gave_up
               ? absl::UnavailableError(absl::StrCat(
                     "no worker can start: each failed ", RespawnBackoff::kMaxStartFailures,
                     " times in a row before it was ready (last: ", respawns_.last_error(0),
                     "); pswitchd keeps retrying, see its log"))
               : absl::FailedPreconditionError(absl::StrCat(
                     "no worker has model '", model,
                     "' loaded (its load failed; see pswitchd's log)"));
  return Outlook::kNever;
}

WorkerPool::Outlook WorkerPool::ForAnyWorker() const {
  bool starting = false;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (Free(static_cast<int>(i))) return Outlook::kNow;
    starting |= slots_[i].state == State::kStarting || loads_.pending(i) > 0;
  }
  return starting ? Outlook::kLater : Outlook::kNever;
}

int WorkerPool::FreeSlot(int preferred) const {
  if (preferred >= 0 && preferred < size() && Free(preferred)) return preferred;
  for (int i = size() - 1; i >= 0; --i) {
    if (Free(i)) return i;
  }
  return -1;
}

int WorkerPool::UsableOther(const std::string& model, int except) const {
  for (int i = 0; i < size(); ++i) {
    if (i != except && Usable(i, model)) return i;
  }
  return -1;
}

absl::Status WorkerPool::Send(int slot, const flatbuffers::FlatBufferBuilder& command) {
  return SendTo(slot, command, -1);
}

absl::Status WorkerPool::SendTo(int slot, const flatbuffers::FlatBufferBuilder& command, int fd) {
  Slot& s = slots_[slot];
  if (s.process == nullptr || s.state == State::kDead) {
    return absl::UnavailableError(absl::StrCat("worker slot ", slot, " has no process"));
  }
  absl::Status sent = fd >= 0 ? s.process->SendWithFd(command, fd) : s.process->Send(command);
  if (sent.code() == absl::StatusCode::kResourceExhausted) {
    // The worker is not reading: its backlog would grow without bound. It is replaced, and what
    // was to be sent fails as its task will: the worker is gone (not the caller's quota).
    std::string reason = absl::StrCat("killed: ", sent.message());
    if (s.kill_reason.empty()) Kill(slot, reason);
    return absl::UnavailableError(std::move(reason));
  }
  return sent;
}

void WorkerPool::SweepRegions(int slot) {
  Slot& s = slots_[slot];
  if (s.process == nullptr || s.state == State::kDead || s.regions.size() == 0) return;
  const size_t unmapped =
      s.regions.UnmapExpired([this, slot](const flatbuffers::FlatBufferBuilder& b, int fd) {
        return SendTo(slot, b, fd);
      });
  if (unmapped > 0) {
    Event(base::LogLevel::kDebug, "worker_regions_unmapped")
        .Field("slot", slot)
        .Field("regions", unmapped)
        .Field("still_mapped", s.regions.size());
  }
}

void WorkerPool::SweepRegions() {
  for (int i = 0; i < size(); ++i) SweepRegions(i);
}

absl::Status WorkerPool::SendRun(
    int slot, uint64_t task, const flatbuffers::FlatBufferBuilder& run,
    const std::vector<std::shared_ptr<const dataplane::TransferRegion>>& regions) {
  SweepRegions(slot);
  Slot& s = slots_[slot];
  if (s.process == nullptr || s.state == State::kDead) {
    return absl::UnavailableError(absl::StrCat("worker slot ", slot, " has no process"));
  }
  // Commands are handled in order: each region is mapped before the Run that reads it.
  const uint64_t evicted_before = s.regions.evicted();
  PSWITCH_RETURN_IF_ERROR(
      s.regions.MapMissing(regions, [this, slot](const flatbuffers::FlatBufferBuilder& b, int fd) {
        return SendTo(slot, b, fd);
      }));
  if (s.regions.evicted() != evicted_before) {
    Event(base::LogLevel::kInfo, "worker_regions_evicted")
        .Field("slot", slot)
        .Field("task", task)
        .Field("evicted", s.regions.evicted() - evicted_before)
        .Field("limit", RegionMappings::kMaxMappedRegions);
  }
  absl::Status sent = Send(slot, run);
  if (!sent.ok()) return sent;
  slots_[slot].state = State::kBusy;
  slots_[slot].last_task = task;
  return absl::OkStatus();
}

std::optional<uint32_t> WorkerPool::SendStop(int slot) {
  Slot& s = slots_[slot];
  const uint32_t value = ++s.drain_value;
  Builder b;
  auto stop = proto::CreateStop(b, static_cast<uint32_t>(slot), value);
  proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::Stop, stop.Union()));
  if (!Send(slot, b).ok()) return std::nullopt;
  return value;
}

void WorkerPool::Kill(int slot, std::string reason) {
  Slot& s = slots_[slot];
  if (s.process == nullptr || s.state == State::kDead) return;
  Event(base::LogLevel::kWarn, "worker_killed")
      .Field("slot", slot)
      .Field("pid", s.process->pid())
      .Field("task", s.last_task)
      .Field("reason", reason);
  s.kill_reason = std::move(reason);
  s.process->Kill();
}

const char* WorkerPool::StateName(int slot) const {
  switch (slots_[slot].state) {
    case State::kStarting:
      return "starting";
    case State::kIdle:
      return "idle";
    case State::kBusy:
      return "busy";
    case State::kDead:
      return "dead";
  }
  return "unknown";
}

pid_t WorkerPool::pid(int slot) const {
  const Slot& s = slots_[slot];
  return s.process != nullptr ? s.process->pid() : 0;
}

}  // namespace pswitch::controller
