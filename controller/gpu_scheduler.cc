#include "controller/gpu_scheduler.h"

#include <signal.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/status.h"
#include "gpu/copy_engine.h"
#include "memdaemon/arena_layout.h"
#include "memdaemon/state_area.h"
#include "proto/wire_status.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {
namespace {

using Builder = flatbuffers::FlatBufferBuilder;

}  // namespace

struct GpuScheduler::Slot {
  enum class State { kStarting, kIdle, kBusy, kDead };
  std::unique_ptr<WorkerProcess> process;
  State state = State::kStarting;
  uint32_t drain_value = 0;
  uint64_t last_task = 0;   // whose leftovers its next drain cleans
  std::string kill_reason;  // why its worker died, when the scheduler killed it
};

struct GpuScheduler::Running {
  uint64_t task_id = 0;
  int slot = -1;
  bool stop_sent = false;
  absl::Time started;
  std::shared_ptr<memdaemon::Transmission> transmission;  // null when the model was resident
  const CatalogEntry* entry = nullptr;
  // Training with a stateful optimizer: its state's arena area, saved to the task's pinned host
  // checkpoint when it is preempted.
  std::unique_ptr<memdaemon::StateArea> optimizer_state;
  SwitchTimeline timeline;
  CheckpointKey state_key;  // its optimizer-state checkpoint (the task's, or a fill job's)
};

GpuScheduler::GpuScheduler(const SchedulerOptions& options, memdaemon::MemDaemon* daemon,
                           ModelCatalog* catalog)
    : options_(options),
      daemon_(daemon),
      catalog_(catalog),
      queue_(options.policy, options.inference_preempts_training),
      respawns_(static_cast<size_t>(std::max(options.workers, 0))),
      loads_(static_cast<size_t>(std::max(options.workers, 0))),
      checkpoints_(options.checkpoints ? options.checkpoints
                                       : std::make_shared<StateCheckpoints>()) {}

absl::StatusOr<std::unique_ptr<GpuScheduler>> GpuScheduler::Start(const SchedulerOptions& options,
                                                                  memdaemon::MemDaemon* daemon,
                                                                  ModelCatalog* catalog) {
  if (options.workers < 1 || options.workers > static_cast<int>(memdaemon::kDrainFlagCount)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker count ", options.workers, " out of range [1, ", memdaemon::kDrainFlagCount, "]"));
  }
  std::unique_ptr<GpuScheduler> s(new GpuScheduler(options, daemon, catalog));
  for (int i = 0; i < options.workers; ++i) s->slots_.push_back(std::make_unique<Slot>());
  s->loop_ = std::thread([p = s.get()] { p->Loop(); });
  s->Post([p = s.get()] {
    for (size_t i = 0; i < p->slots_.size(); ++i) p->SpawnSlot(static_cast<int>(i));
  });
  return s;
}

GpuScheduler::~GpuScheduler() {
  Post([this] {
    stopping_ = true;
    while (auto ticket = queue_.Pop()) {
      Finish(ticket->id, absl::CancelledError("pswitchd is shutting down"));
    }
    StopRunning();
  });
  loop_.join();
}

void GpuScheduler::Post(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (loop_done_) return;  // late events (a worker's death at shutdown) find no loop
  }
  asio::post(io_, [this, fn = std::move(fn)] {
    fn();
    AfterEvent();
  });
}

namespace {

std::chrono::nanoseconds Until(absl::Time deadline) {
  return absl::ToChronoNanoseconds(std::max(deadline - absl::Now(), absl::ZeroDuration()));
}

}  // namespace

void GpuScheduler::AfterEvent() {
  // A busy loop must not starve the stop deadline; its timer may not have had its turn yet.
  if (absl::Now() >= kill_deadline_) EnforceStop();
  if (stopping_) {
    // A running task gets a bounded time to reach its sync point, then the loop ends anyway.
    if (!stop_timer_armed_) {
      stop_timer_armed_ = true;
      stop_timer_.expires_after(std::chrono::seconds(30));
      stop_timer_.async_wait([this](const asio::error_code& ec) {
        if (!ec) io_.stop();
      });
    }
    if (running_ == nullptr) {
      io_.stop();
      return;
    }
  } else {
    MaybeStart();  // may stop a task, arming a deadline below
  }
  ArmTimers();
}

void GpuScheduler::ArmTimers() {
  // Deadlines are timers on the loop, re-armed to whatever is due next. A due stop deadline is
  // enforced by AfterEvent itself.
  ArmTimer(kill_timer_, armed_kill_, kill_deadline_, [] {});
  // Shutting down, nothing is respawned: a due restart must not spin the timer.
  ArmTimer(respawn_timer_, armed_respawn_,
           stopping_ ? absl::InfiniteFuture() : respawns_.Next(), [this] { RespawnDue(); });
}

void GpuScheduler::ArmTimer(asio::steady_timer& timer, absl::Time& armed, absl::Time deadline,
                            std::function<void()> due) {
  if (deadline == armed) return;
  armed = deadline;
  timer.cancel();
  if (deadline == absl::InfiniteFuture()) return;
  timer.expires_after(Until(deadline));
  timer.async_wait([this, &armed, due = std::move(due)](const asio::error_code& ec) {
    if (ec) return;  // re-armed or shut down
    armed = absl::InfiniteFuture();
    due();
    AfterEvent();
  });
}

void GpuScheduler::Loop() {
  // Runs until AfterEvent stops it (shutdown), whatever is or is not queued.
  auto work = asio::make_work_guard(io_);
  io_.run();
  if (running_ != nullptr) {
    Finish(running_->task_id, absl::DeadlineExceededError("task did not stop before shutdown"));
    running_.reset();
  }
  // Every task gets an answer: also one that went back to the queue when shutdown stopped it
  // (training resumes from a checkpoint, but not in this process).
  while (auto ticket = queue_.Pop()) {
    Finish(ticket->id, absl::CancelledError("pswitchd is shutting down"));
  }
  // Workers shut down and are reaped; their death events arrive after the loop has ended.
  {
    absl::MutexLock lock(&mu_);
    loop_done_ = true;
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    const uint32_t promised = slots_[i]->drain_value;
    slots_[i].reset();
    // Nothing of that worker is in flight any more: no transmission may wait for its drain.
    daemon_->ReleaseDrain(static_cast<uint32_t>(i), promised);
  }
  slots_.clear();
  for (Watcher& w : watchers_) w.thread.join();
}

void GpuScheduler::WatchTransmission(std::shared_ptr<memdaemon::Transmission> transmission,
                                     uint64_t task_id, int drain_slot) {
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = watchers_.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread thread([this, transmission = std::move(transmission), task_id, drain_slot, done] {
    // The copy engine bounds every job (drain and per-group deadlines); these waits only keep
    // this thread responsive to shutdown.
    absl::StatusOr<std::vector<memdaemon::GroupTrace>> result;
    while (true) {
      result = transmission->Wait(absl::Milliseconds(500));
      if (transmission->finished()) break;
      absl::MutexLock lock(&mu_);
      if (loop_done_) break;
    }
    {
      absl::MutexLock lock(&mu_);
      if (!loop_done_ && transmission->finished()) {
        const uint32_t epoch = transmission->epoch();
        absl::Status status = result.status();
        asio::post(io_, [this, task_id, epoch, drain_slot, status] {
          if (status.ok()) {
            OnTransmitted(task_id);
          } else {
            OnTransmissionFailed(task_id, epoch, drain_slot, status);
          }
          AfterEvent();
        });
      }
    }
    done->store(true);
  });
  watchers_.push_back(Watcher{std::move(thread), std::move(done)});
}

base::Log GpuScheduler::Event(base::LogLevel level, absl::string_view event) const {
  base::Log line(level, event);
  line.Field("gpu", options_.gpu);
  return line;
}

void GpuScheduler::OnTransmissionFailed(uint64_t task_id, uint32_t epoch, int drain_slot,
                                        const absl::Status& why) {
  Event(base::LogLevel::kWarn, "transmission_failed")
      .Field("task", task_id)
      .Field("epoch", epoch)
      .Field("error", why);
  // The region holds part of this model and part of whatever was there: a later task for it
  // must transmit again rather than run on partly old weights.
  residency_.Failed(epoch);
  // The old tenant never wrote its drain value: its stream may wait on a flag no one will write,
  // so it is never reused. Its death releases the drain (OnWorkerDied), which lets the copy
  // stream behind it go on.
  if (absl::IsDeadlineExceeded(why) && drain_slot >= 0 &&
      drain_slot < static_cast<int>(slots_.size())) {
    Slot& s = *slots_[drain_slot];
    if (s.process != nullptr && s.state != Slot::State::kDead) {
      Event(base::LogLevel::kError, "worker_killed")
          .Field("slot", drain_slot)
          .Field("pid", s.process->pid())
          .Field("reason", "not drained");
      s.kill_reason = absl::StrCat("killed: the worker did not drain within ",
                                   absl::FormatDuration(options_.drain_timeout),
                                   " of being told to stop");
      ::kill(s.process->pid(), SIGKILL);
    }
  }
}

void GpuScheduler::OnTransmitted(uint64_t task_id) {
  if (running_ == nullptr || running_->task_id != task_id) return;
  tasks_.MarkTransmitted(task_id);
}

void GpuScheduler::OnDrained(int slot, const proto::Drained& drained) {
  Slot& s = *slots_[slot];
  if (s.last_task == 0) return;
  absl::Duration clean = absl::Nanoseconds(drained.clean_end_ns() - drained.clean_start_ns());
  bool after_drain = drained.clean_start_ns() >= drained.drained_ns();
  Event(base::LogLevel::kInfo, "worker_drained")
      .Field("slot", slot)
      .Field("task", s.last_task)
      .Field("clean_us", absl::ToDoubleMicroseconds(clean), 1)
      .Field("cleaned_after_drain", after_drain);
  tasks_.RecordCleaning(s.last_task, clean, after_drain);
}

absl::Status GpuScheduler::AcquireOptimizerState(Running& run, const TaskSpec& spec) {
  const uint64_t bytes =
      models::OptimizerStateSlots(spec.trainer) * run.entry->optimizer_slot_bytes;
  if (spec.kind != TaskKind::kTraining || bytes == 0) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<memdaemon::StateArea>> area =
      memdaemon::StateArea::Acquire(*daemon_, absl::StrCat("task-", run.task_id, "-optimizer"),
                                    bytes, checkpoints_->Take(run.state_key));
  if (!area.ok()) return area.status();
  run.optimizer_state = std::move(*area);
  return absl::OkStatus();
}

absl::Status GpuScheduler::ReleaseOptimizerState(Running& run, bool keep) {
  std::unique_ptr<memdaemon::StateArea> area = std::move(run.optimizer_state);
  if (area == nullptr || !keep) return absl::OkStatus();  // dropped: its lease goes with it
  absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> saved = area->SaveAndRelease();
  if (!saved.ok()) return saved.status();
  checkpoints_->Put(run.state_key, std::move(*saved));
  return absl::OkStatus();
}

void GpuScheduler::SpawnSlot(int slot) {
  WorkerSpawnOptions spawn = options_.spawn;
  spawn.worker_id = static_cast<uint32_t>(slot);
  Slot& s = *slots_[slot];
  // The drain flag keeps its value across workers: counting on from it keeps every later drain
  // wait meaningful.
  const uint32_t drain_value = s.drain_value;
  s = Slot{};
  s.drain_value = drain_value;
  loads_.Reset(static_cast<size_t>(slot));
  auto process = WorkerProcess::Spawn(
      spawn, [this, slot](uint32_t, absl::StatusOr<std::vector<uint8_t>> event) {
        Post([this, slot, event = std::move(event)] { OnWorkerEvent(slot, event); });
      });
  if (!process.ok()) {
    Event(base::LogLevel::kError, "worker_spawn_failed")
        .Field("slot", slot)
        .Field("error", process.status());
    s.state = Slot::State::kDead;
    ScheduleRespawn(slot, /*was_ready=*/false, process.status());
    return;
  }
  s.process = std::move(*process);
  s.state = Slot::State::kStarting;
  RefreshReadiness();
}

void GpuScheduler::OnWorkerEvent(int slot, const absl::StatusOr<std::vector<uint8_t>>& event) {
  if (!event.ok()) {
    OnWorkerDied(slot, event.status());
    return;
  }
  auto* e = flatbuffers::GetRoot<proto::WorkerEvent>(event->data());
  switch (e->body_type()) {
    case proto::WorkerEventBody::WorkerReady:
      loads_.Announce(static_cast<size_t>(slot));
      LoadAll(slot);
      break;
    case proto::WorkerEventBody::ModelLoaded: {
      auto* loaded = e->body_as_ModelLoaded();
      std::string name = loaded->name() ? loaded->name()->str() : "";
      absl::Status status =
          loaded->error() != nullptr ? proto::FromWireError(loaded->error()) : absl::OkStatus();
      if (status.ok()) {
        if (loaded->warm_ns() > 0) {
          // What the warm-up took off the first task: CUDA context, cuBLAS/cuDNN, modules.
          Event(base::LogLevel::kInfo, "worker_warmed")
              .Field("slot", slot)
              .Field("model", name)
              .Field("warm_ms", loaded->warm_ns() / 1e6, 1);
        }
      } else {
        Event(base::LogLevel::kError, "model_load_failed")
            .Field("slot", slot)
            .Field("model", name)
            .Field("error", status);
      }
      loads_.Answered(static_cast<size_t>(slot), name, status);
      MarkIdleOnceLoaded(slot);
      RefreshReadiness();
      break;
    }
    case proto::WorkerEventBody::RunDone:
      OnRunDone(slot, *event);
      break;
    case proto::WorkerEventBody::Drained:
      // The copy engine waits on the drain flag itself; this reports the cleaning.
      OnDrained(slot, *e->body_as_Drained());
      break;
    default:
      break;
  }
}

void GpuScheduler::LoadAll(int slot) {
  for (const CatalogEntry* entry : catalog_->List()) SendLoad(slot, *entry);
  MarkIdleOnceLoaded(slot);
  RefreshReadiness();
}

void GpuScheduler::MarkIdleOnceLoaded(int slot) {
  Slot& s = *slots_[slot];
  if (s.state != Slot::State::kStarting || !loads_.announced(static_cast<size_t>(slot)) ||
      loads_.pending(static_cast<size_t>(slot)) > 0) {
    return;
  }
  s.state = Slot::State::kIdle;
  // Operators (and the end-to-end tests) see when a fresh worker can take tasks.
  Event(base::LogLevel::kInfo, "worker_ready")
      .Field("slot", slot)
      .Field("pid", s.process->pid())
      .Field("models", loads_.loaded_count(static_cast<size_t>(slot)));
}

void GpuScheduler::SendLoad(int slot, const CatalogEntry& entry) {
  Slot& s = *slots_[slot];
  Builder b;
  auto load = proto::CreateLoadModel(
      b, b.CreateString(entry.request.name), b.CreateString(entry.request.zoo_model),
      options_.region_offset, static_cast<uint32_t>(entry.stored->num_layers()),
      entry.stored->total_bytes());
  b.Finish(proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::LoadModel, load.Union()));
  if (s.process != nullptr && s.process->Send(b).ok()) {
    loads_.Sent(static_cast<size_t>(slot), entry.request.name);
  }
}

void GpuScheduler::AddModel(const CatalogEntry* entry, std::function<void(absl::Status)> done) {
  Post([this, entry, done = std::move(done)] {
    const std::string& name = entry->request.name;
    std::set<size_t> answers;
    for (size_t i = 0; i < slots_.size(); ++i) {
      // A worker that has not announced itself yet loads the whole catalog (this model included)
      // when it does; every other live one, even one still loading, is sent this model now.
      if (slots_[i]->state == Slot::State::kDead || !loads_.announced(i)) continue;
      if (loads_.Loaded(i, name)) continue;
      if (loads_.Loading(i, name)) {  // its start-up load is in flight: its answer counts
        answers.insert(i);
        continue;
      }
      SendLoad(static_cast<int>(i), *entry);
      if (loads_.Loading(i, name)) answers.insert(i);
    }
    loads_.Await(name, std::move(answers), done);
  });
}

void GpuScheduler::RefreshReadiness() {
  bool ready = true;
  for (const auto& s : slots_) {
    if (s->state == Slot::State::kStarting || s->state == Slot::State::kDead) ready = false;
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (loads_.pending(i) > 0) ready = false;
  }
  absl::MutexLock lock(&mu_);
  workers_ready_ = ready;
}

bool GpuScheduler::AwaitWorkersReady(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&workers_ready_), timeout);
}

void GpuScheduler::ScheduleRespawn(int slot, bool was_ready, const absl::Status& why) {
  if (stopping_) return;
  const absl::Duration delay =
      respawns_.Failed(static_cast<size_t>(slot), was_ready, why.message(), absl::Now());
  if (delay == absl::ZeroDuration()) {
    SpawnSlot(slot);
    return;
  }
  Event(base::LogLevel::kError, "worker_start_failed")
      .Field("slot", slot)
      .Field("failures_in_a_row", respawns_.start_failures(static_cast<size_t>(slot)))
      .Field("retry_in_ms", absl::ToDoubleMilliseconds(delay), 0)
      .Field("error", why.message());
}

void GpuScheduler::RespawnDue() {
  if (stopping_) return;
  for (size_t slot : respawns_.Due(absl::Now())) SpawnSlot(static_cast<int>(slot));
}

void GpuScheduler::OnWorkerDied(int slot, const absl::Status& why) {
  Slot& s = *slots_[slot];
  Event(stopping_ ? base::LogLevel::kInfo : base::LogLevel::kError, "worker_exit")
      .Field("slot", slot)
      .Field("detail", why.message());
  // Ready once it announced itself and answered its first loads; a crash after that is a task's.
  const bool was_ready = s.state == Slot::State::kIdle || s.state == Slot::State::kBusy;
  s.state = Slot::State::kDead;
  // Nothing of a dead process is in flight: release whoever waits for its drain.
  daemon_->ReleaseDrain(static_cast<uint32_t>(slot), s.drain_value);
  if (running_ != nullptr && running_->slot == slot) {
    uint64_t id = running_->task_id;
    (void)ReleaseOptimizerState(*running_, false);
    running_.reset();
    const bool killed = !s.kill_reason.empty();
    absl::Status failed = absl::UnavailableError(
        absl::StrCat("task ", id, " failed: ", killed ? s.kill_reason : why.message(),
                     "; the task's model state is its last checkpoint"));
    Finish(id, killed ? MarkKilled(std::move(failed)) : failed);
  }
  residency_.SlotDied(slot);  // a half-finished training step may have touched the weights
  // Its unanswered loads never will be: they stop holding up registrations.
  loads_.Died(static_cast<size_t>(slot));
  s.process.reset();
  ScheduleRespawn(slot, was_ready, why);
  RefreshReadiness();
}

std::optional<uint32_t> GpuScheduler::SendStop(int slot) {
  Slot& s = *slots_[slot];
  uint32_t value = ++s.drain_value;
  Builder b;
  auto stop = proto::CreateStop(b, static_cast<uint32_t>(slot), value);
  b.Finish(proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::Stop, stop.Union()));
  if (s.process == nullptr || !s.process->Send(b).ok()) return std::nullopt;
  last_stop_sent_ns_ = base::MonotonicNowNs();
  return value;
}

void GpuScheduler::StopRunning() {
  if (running_ == nullptr || running_->stop_sent) return;
  // An unreachable worker is dead; its death event fails the task.
  (void)SendStop(running_->slot);
  running_->stop_sent = true;
  // A worker that never answers (stopped, or its stream waiting on a flag no one writes) must
  // not hold the GPU's queue: past the drain deadline it is killed, which fails its task.
  ArmStopDeadline(running_->task_id, absl::Now() + options_.drain_timeout,
                  absl::StrCat("killed: the worker did not stop within ",
                               absl::FormatDuration(options_.drain_timeout),
                               " of being told to (it did not drain)"));
}

void GpuScheduler::ArmStopDeadline(uint64_t task, absl::Time deadline, std::string reason) {
  if (kill_task_ == task && kill_deadline_ <= deadline) return;  // an earlier one stands
  kill_task_ = task;
  kill_deadline_ = deadline;
  kill_reason_ = std::move(reason);
}

bool GpuScheduler::Usable(int slot, const std::string& model) const {
  const Slot& s = *slots_[slot];
  return s.state == Slot::State::kIdle && loads_.pending(static_cast<size_t>(slot)) == 0 &&
         loads_.Loaded(static_cast<size_t>(slot), model);
}

uint64_t GpuScheduler::SubmitFill(TaskSpec spec, TaskCallback done) {
  const uint64_t id = tasks_.Add(spec.model);
  if (spec.arrival_ns == 0) spec.arrival_ns = base::MonotonicNowNs();
  Post([this, id, spec = std::move(spec), done = std::move(done)]() mutable {
    const bool busy =
        fill_pending_ || (running_ != nullptr && specs_.at(running_->task_id).first.fill);
    TaskTicket ticket{id, spec.model, spec.kind, INT32_MIN, absl::InfiniteFuture()};
    specs_[id] = {std::move(spec), std::move(done)};
    if (stopping_ || busy) {
      Finish(id, absl::FailedPreconditionError(stopping_ ? "pswitchd is shutting down"
                                                         : "a fill run is already on this GPU"));
      return;
    }
    fill_pending_ = ticket;
  });
  return id;
}

void GpuScheduler::EndBubble(absl::Duration grace) {
  Post([this, grace, ended = absl::Now()] {
    if (fill_pending_) {
      // It never started: nothing to pause.
      uint64_t id = fill_pending_->id;
      fill_pending_.reset();
      TaskOutcome outcome;
      outcome.task_id = id;
      outcome.stopped_early = true;
      outcome.paused_at = ended;
      outcome.iterations_done = specs_.at(id).first.fill->first_iteration;
      Finish(id, outcome);
    }
    if (running_ == nullptr || !specs_.at(running_->task_id).first.fill) return;
    StopRunning();
    ArmStopDeadline(running_->task_id, ended + grace,
                    absl::StrCat("killed: the fill task did not pause within ",
                                 absl::FormatDuration(grace), " of its bubble's end"));
  });
}

void GpuScheduler::EnforceStop() {
  const uint64_t task = kill_task_;
  kill_deadline_ = absl::InfiniteFuture();
  kill_task_ = 0;
  if (running_ == nullptr || running_->task_id != task) return;  // it stopped in time
  Slot& s = *slots_[running_->slot];
  if (s.process == nullptr || s.state == Slot::State::kDead) return;
  Event(base::LogLevel::kWarn, "worker_killed")
      .Field("task", task)
      .Field("pid", s.process->pid())
      .Field("reason", kill_reason_);
  s.kill_reason = kill_reason_;
  ::kill(s.process->pid(), SIGKILL);  // its death event fails the run and respawns the worker
}

void GpuScheduler::MaybeStart() {
  while (true) {
    if (running_ != nullptr) {
      const TaskTicket* waiting = queue_.Peek();
      auto spec = specs_.find(running_->task_id);
      if (waiting != nullptr && !running_->stop_sent && spec != specs_.end()) {
        TaskTicket running{running_->task_id, spec->second.first.model, spec->second.first.kind,
                           spec->second.first.priority, spec->second.first.deadline};
        running.arrival_seq = INT64_MIN;  // it was scheduled first
        // Every task outranks a fill run: fill only uses idle time.
        if (spec->second.first.fill || queue_.ShouldPreempt(running, *waiting)) StopRunning();
      }
      return;
    }
    const TaskTicket* next = queue_.Peek();
    // A fill run only gets the GPU when no task wants it.
    const bool fill = next == nullptr && fill_pending_.has_value();
    if (next == nullptr && !fill) return;
    TaskTicket ticket = fill ? *fill_pending_ : *next;
    auto pop = [&] {
      if (fill) {
        fill_pending_.reset();
      } else {
        queue_.Pop();
      }
    };
    if (fill && specs_.at(ticket.id).first.fill->synthetic) {
      // No model to switch in: any idle worker runs it, once one is up.
      bool idle = false, starting = false;
      for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot& s = *slots_[i];
        idle |= s.state == Slot::State::kIdle && loads_.pending(i) == 0;
        starting |= s.state == Slot::State::kStarting || loads_.pending(i) > 0;
      }
      if (!idle && starting) return;
      pop();
      absl::Status started = StartTask(ticket);
      if (!started.ok()) Finish(ticket.id, started);
      continue;
    }
    bool resident = residency_.Holds(ticket.model);
    if (resident ? !Usable(residency_.active_slot(), ticket.model) : false) return;  // wait
    if (!resident) {
      bool any = false, possible = false, all_gave_up = true;
      for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot& s = *slots_[i];
        any |= Usable(static_cast<int>(i), ticket.model);
        const bool gave_up = respawns_.GaveUp(i);
        all_gave_up &= gave_up;
        // A worker still starting (or about to be respawned), loading or busy may yet run it.
        possible |= (!gave_up && (s.state == Slot::State::kStarting ||
                                  s.state == Slot::State::kDead)) ||
                    s.state == Slot::State::kBusy || loads_.pending(i) > 0 ||
                    loads_.Loaded(i, ticket.model);
      }
      if (!any && possible) return;
      if (!any) {
        pop();
        Finish(ticket.id,
               all_gave_up
                   ? absl::UnavailableError(absl::StrCat(
                         "no worker can start: each failed ", RespawnBackoff::kMaxStartFailures,
                         " times in a row before it was ready (last: ", respawns_.last_error(0),
                         "); pswitchd keeps retrying, see its log"))
                   : absl::FailedPreconditionError(
                         absl::StrCat("no worker has model '", ticket.model,
                                      "' loaded (its load failed; see pswitchd's log)")));
        continue;
      }
    }
    pop();
    absl::Status started = StartTask(ticket);
    if (!started.ok()) Finish(ticket.id, started);
  }
}

absl::Status GpuScheduler::StartTask(const TaskTicket& ticket) {
  const TaskSpec& spec = specs_.at(ticket.id).first;
  auto run = std::make_unique<Running>();
  run->task_id = ticket.id;
  run->state_key = spec.fill ? spec.fill->state_key : CheckpointKey::Task(ticket.id);
  if (spec.fill && spec.fill->synthetic) {
    PSWITCH_RETURN_IF_ERROR(SendSynthetic(*run, ticket, spec));
    running_ = std::move(run);
    return absl::OkStatus();
  }
  PSWITCH_ASSIGN_OR_RETURN(const CatalogEntry* entry, catalog_->Find(spec.model));
  run->entry = entry;
  run->started = absl::Now();
  run->timeline.arrival_ns = spec.arrival_ns;
  // The Stop that made room for it, when one went out after it arrived.
  if (last_stop_sent_ns_ >= spec.arrival_ns) run->timeline.stop_sent_ns = last_stop_sent_ns_;
  PSWITCH_RETURN_IF_ERROR(AcquireOptimizerState(*run, spec));
  absl::Status started = SendTask(*run, ticket, spec, *entry);
  if (!started.ok()) (void)ReleaseOptimizerState(*run, false);
  PSWITCH_RETURN_IF_ERROR(started);
  running_ = std::move(run);
  return absl::OkStatus();
}

absl::Status GpuScheduler::SendTask(Running& run, const TaskTicket& ticket, const TaskSpec& spec,
                                    const CatalogEntry& entry) {
  const int active = residency_.active_slot();
  int slot = -1;
  if (residency_.Holds(spec.model)) {
    slot = active;
  } else {
    // A standby (not the active worker) takes the new model: the active one drains meanwhile.
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (static_cast<int>(i) != active && Usable(static_cast<int>(i), spec.model)) {
        slot = static_cast<int>(i);
        break;
      }
    }
    if (slot < 0) slot = active;
    memdaemon::TransmitRequest request;
    request.model = entry.stored;
    request.groups = entry.plan;
    request.weights_offset = options_.region_offset;
    int drain_slot = -1;
    // An idle old tenant has nothing in flight (its RunDone came after its stream synchronised):
    // no Stop, no device-side drain wait, no round trip on the switch.
    if (active >= 0 && slots_[active]->state != Slot::State::kIdle) {
      if (std::optional<uint32_t> value = SendStop(active)) {
        request.drain =
            memdaemon::DrainCondition{static_cast<uint32_t>(active), *value, options_.drain_timeout};
        drain_slot = active;
        run.timeline.stop_sent_ns = last_stop_sent_ns_;
      }
    }
    if (request.groups.size() > memdaemon::kReadyFlagCount) {
      return absl::ResourceExhaustedError(
          absl::StrCat("model '", spec.model, "' has ", request.groups.size(),
                       " groups; this GPU has ", memdaemon::kReadyFlagCount, " ready flags"));
    }
    request.flag_base = 0;
    PSWITCH_ASSIGN_OR_RETURN(run.transmission, daemon_->transmitter().Start(request));
    WatchTransmission(run.transmission, ticket.id, drain_slot);
    residency_.Switched(slot, spec.model, run.transmission->epoch());
  }
  Slot& s = *slots_[slot];
  Builder prepare;
  auto last = prepare.CreateVector(entry.group_last_layer);
  auto body = proto::CreatePrepare(prepare, prepare.CreateString(spec.model), residency_.epoch(),
                                   /*flag_base=*/0, last);
  prepare.Finish(
      proto::CreateWorkerCommand(prepare, 0, proto::WorkerCommandBody::Prepare, body.Union()));
  PSWITCH_RETURN_IF_ERROR(s.process->Send(prepare));
  return SendRun(run, slot, ticket, spec, spec.batch > 0 ? spec.batch : entry.request.batch_size);
}

absl::Status GpuScheduler::SendSynthetic(Running& run, const TaskTicket& ticket,
                                         const TaskSpec& spec) {
  int slot = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = *slots_[i];
    if (s.state == Slot::State::kIdle && loads_.pending(i) == 0) {
      slot = static_cast<int>(i);
      if (slot == residency_.active_slot()) break;  // prefer the active worker: no standby waits
    }
  }
  if (slot < 0) return absl::UnavailableError("no idle worker for the synthetic fill task");
  return SendRun(run, slot, ticket, spec, 1);
}

absl::Status GpuScheduler::SendRun(Running& run, int slot, const TaskTicket& ticket,
                                   const TaskSpec& spec, uint32_t batch) {
  Slot& s = *slots_[slot];
  Builder b;
  auto inputs = proto::CreateWireTensors(b, spec.inputs);
  uint32_t first = spec.fill                               ? spec.fill->first_iteration
                   : resume_iteration_.contains(ticket.id) ? resume_iteration_[ticket.id]
                                                           : 0;
  flatbuffers::Offset<proto::FillRun> fill = 0;
  if (spec.fill) {
    const FillRunSpec& f = *spec.fill;
    const proto::FillRunKind kind =
        f.synthetic ? proto::FillRunKind::Synthetic : proto::FillRunKind::Model;
    fill = proto::CreateFillRun(b, f.bubble_end_ns, absl::ToInt64Nanoseconds(f.margin),
                                absl::ToInt64Nanoseconds(f.step), f.memory_cap, kind,
                                b.CreateString(f.dataset_path),
                                absl::ToInt64Nanoseconds(f.synthetic_step), f.synthetic_alloc_bytes,
                                f.ignore_pause, b.CreateString(f.device_lock_path));
  }
  const uint64_t state_offset = run.optimizer_state ? run.optimizer_state->offset() : 0;
  const uint64_t state_bytes = run.optimizer_state ? run.optimizer_state->bytes() : 0;
  auto run_body = proto::CreateRun(
      b, ticket.id, b.CreateString(spec.model), inputs, spec.kind == TaskKind::kTraining, first,
      spec.iterations, batch, spec.seed,
      spec.trainer.optimizer == models::OptimizerKind::kAdam ? proto::Optimizer::Adam
                                                             : proto::Optimizer::Sgd,
      spec.trainer.learning_rate, spec.trainer.momentum, state_offset, state_bytes, fill);
  b.Finish(proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::Run, run_body.Union()));
  PSWITCH_RETURN_IF_ERROR(s.process->Send(b));
  s.state = Slot::State::kBusy;
  s.last_task = ticket.id;
  run.slot = slot;
  tasks_.SetState(ticket.id, run.transmission ? TaskState::kSwitching : TaskState::kRunning, first,
           s.process->pid());
  return absl::OkStatus();
}

void GpuScheduler::OnRunDone(int slot, const std::vector<uint8_t>& payload) {
  auto* done = flatbuffers::GetRoot<proto::WorkerEvent>(payload.data())->body_as_RunDone();
  Slot& s = *slots_[slot];
  if (s.state == Slot::State::kBusy) s.state = Slot::State::kIdle;
  if (running_ == nullptr || running_->slot != slot || running_->task_id != done->task_id()) return;
  std::unique_ptr<Running> run = std::move(running_);
  const TaskSpec& spec = specs_.at(run->task_id).first;
  absl::Status status =
      done->error() != nullptr ? proto::FromWireError(done->error()) : absl::OkStatus();
  TaskOutcome outcome;
  outcome.task_id = run->task_id;
  outcome.iterations_done = done->iterations_done();
  outcome.loss = done->loss();
  outcome.stopped_early = done->stopped_early();
  outcome.paused_at = absl::Now();
  outcome.fill_step_time = absl::Nanoseconds(done->step_ns());
  outcome.fill_steps = done->steps();
  outcome.fill_predicted_step = absl::Nanoseconds(done->last_step_ns());
  if (kill_task_ == run->task_id) {  // it stopped in time
    kill_task_ = 0;
    kill_deadline_ = absl::InfiniteFuture();
  }
  outcome.timeline = run->timeline;
  outcome.timeline.result_ns = base::MonotonicNowNs();
  outcome.timeline.first_layer_start_ns = done->first_layer_start_ns();
  outcome.timeline.first_layer_done_ns = done->first_layer_done_ns();
  if (run->transmission != nullptr) {
    // Every group was ready before the worker could finish, so the copy thread has (almost)
    // seen the job end; bounded all the same: the scheduler thread never waits unboundedly.
    auto traces = run->transmission->Wait(absl::Milliseconds(200));
    if (traces.ok() && !traces->empty()) {
      outcome.switch_time =
          absl::Nanoseconds(traces->back().ready_ns - traces->front().copy_start_ns);
      outcome.timeline.drained_ns = traces->front().copy_start_ns;
      outcome.timeline.first_group_ready_ns = traces->front().ready_ns;
      outcome.timeline.last_group_ready_ns = traces->back().ready_ns;
    } else if (!traces.ok() && run->transmission->finished()) {
      residency_.Failed(run->transmission->epoch());
      if (status.ok()) status = traces.status();
    }
  }
  if (run->transmission != nullptr) {
    // The switch as its parts, on one clock, in ms after the task's arrival (-1: did not happen).
    const SwitchTimeline& t = outcome.timeline;
    auto ms = [&t](int64_t ns) { return ns == 0 ? -1.0 : (ns - t.arrival_ns) / 1e6; };
    Event(base::LogLevel::kInfo, "task_switch")
        .Field("task", run->task_id)
        .Field("model", spec.model)
        .FieldMs("copy_ms", outcome.switch_time)
        .Field("stop_sent_ms", ms(t.stop_sent_ns))
        .Field("drained_ms", ms(t.drained_ns))
        .Field("first_group_ms", ms(t.first_group_ready_ns))
        .Field("first_layer_start_ms", ms(t.first_layer_start_ns))
        .Field("first_layer_done_ms", ms(t.first_layer_done_ns))
        .Field("last_group_ms", ms(t.last_group_ready_ns))
        .Field("result_ms", ms(t.result_ns));
  }
  if (!status.ok() && run->transmission != nullptr) {
    // A task that failed on a switch leaves no trusted residency behind (defect 4).
    residency_.Failed(run->transmission->epoch());
  }
  if (spec.kind == TaskKind::kTraining) {
    // The stopped worker has nothing in flight: save what it trained before anyone overwrites it.
    const memdaemon::StoredModel& stored = *run->entry->stored;
    absl::Status saved = daemon_->arena().CopyToHost(
        options_.region_offset, std::span<std::byte>(stored.host_bytes(), stored.total_bytes()));
    if (!saved.ok() && status.ok()) status = saved;
    bool cancelled = cancel_requested_.erase(run->task_id) > 0;
    const bool unfinished = status.ok() && !cancelled && done->stopped_early() &&
                            done->iterations_done() < spec.iterations;
    // A fill run goes back to its fill manager, which brings it back at its next bubble.
    const bool resumes = unfinished && !spec.fill;
    absl::Status state_saved = ReleaseOptimizerState(*run, unfinished);
    if (!state_saved.ok() && status.ok()) status = state_saved;
    if (resumes && state_saved.ok()) {
      resume_iteration_[run->task_id] = done->iterations_done();
      TaskTicket again{run->task_id, spec.model, spec.kind, spec.priority, spec.deadline};
      queue_.PushFront(again);
      tasks_.Requeue(run->task_id, done->iterations_done());
      return;
    }
    if (cancelled && status.ok()) {
      Finish(run->task_id, absl::CancelledError(absl::StrCat(
                               "task ", run->task_id, " cancelled after ", done->iterations_done(),
                               " iterations (weights saved)")));
      return;
    }
  }
  if (!status.ok()) {
    Finish(run->task_id, status);
    return;
  }
  auto outputs = proto::FromWireTensors(done->outputs());
  if (!outputs.ok()) {
    Finish(run->task_id, outputs.status());
    return;
  }
  outcome.outputs = std::move(*outputs);
  Finish(run->task_id, outcome);
}

uint64_t GpuScheduler::Submit(TaskSpec spec, TaskCallback done) {
  const uint64_t id = tasks_.Add(spec.model);
  absl::Time submitted = absl::Now();
  if (spec.arrival_ns == 0) spec.arrival_ns = base::MonotonicNowNs();
  Post([this, id, submitted, spec = std::move(spec), done = std::move(done)]() mutable {
    TaskTicket ticket{id, spec.model, spec.kind, spec.priority, spec.deadline};
    // Latency is measured from submission, whatever happens in between.
    TaskCallback timed = [submitted,
                          done = std::move(done)](const absl::StatusOr<TaskOutcome>& outcome) {
      if (!outcome.ok()) {
        done(outcome);
        return;
      }
      TaskOutcome with_latency = *outcome;
      with_latency.latency = absl::Now() - submitted;
      done(with_latency);
    };
    if (stopping_) {
      timed(absl::CancelledError("pswitchd is shutting down"));
      return;
    }
    specs_[id] = {std::move(spec), std::move(timed)};
    queue_.Push(ticket);
  });
  return id;
}

void GpuScheduler::Finish(uint64_t task_id, const absl::StatusOr<TaskOutcome>& outcome) {
  auto it = specs_.find(task_id);
  tasks_.Finish(task_id, outcome.status(), outcome.ok() ? outcome->iterations_done : 0);
  resume_iteration_.erase(task_id);
  checkpoints_->Drop(CheckpointKey::Task(task_id));
  if (it == specs_.end()) return;
  TaskCallback callback = std::move(it->second.second);
  specs_.erase(it);
  callback(outcome);
}

absl::StatusOr<TaskStatus> GpuScheduler::Query(uint64_t task_id) const {
  return tasks_.Query(task_id);
}

std::vector<TaskStatus> GpuScheduler::Recent(size_t limit) const { return tasks_.Recent(limit); }

absl::Status GpuScheduler::Cancel(uint64_t task_id) {
  PSWITCH_ASSIGN_OR_RETURN(TaskStatus info, Query(task_id));
  if (info.state >= TaskState::kSucceeded) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", task_id, " already ", TaskStateName(info.state)));
  }
  Post([this, task_id] {
    if (queue_.Remove(task_id)) {
      Finish(task_id, absl::CancelledError(absl::StrCat("task ", task_id, " cancelled")));
      return;
    }
    auto spec = specs_.find(task_id);
    if (running_ != nullptr && running_->task_id == task_id && spec != specs_.end() &&
        spec->second.first.kind == TaskKind::kTraining) {
      cancel_requested_.insert(task_id);
      StopRunning();
    }
    // A running inference batch always finishes; its result is still delivered.
  });
  return absl::OkStatus();
}

}  // namespace pswitch::controller
