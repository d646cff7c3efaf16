#include "controller/gpu_scheduler.h"

#include <algorithm>
#include <chrono>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "api/types.h"
#include "base/clock.h"
#include "base/status.h"
#include "controller/worker_commands.h"
#include "gpu/device.h"
#include "memdaemon/arena_layout.h"
#include "memdaemon/memdaemon.h"
#include "memdaemon/state_area.h"
#include "proto/wire_status.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {

using registry::CatalogEntry;
using registry::EntryRef;
using registry::ModelCatalog;

namespace {

// The model label of a task's metrics: fill runs run a private model per job ("fill-N"), which
// would make one label value per job, so they share one.
std::string MetricModel(const TaskSpec& spec) { return spec.fill ? "fill" : spec.model; }

// What a worker loads for `entry`.
// `registering`: for the registration's own loads; a worker started later loads the catalog
// and warms every model for serving (a finished training fill job's model is served, its
// training warm-up no longer required).
WorkerModel WorkerModelOf(const CatalogEntry& entry, bool warm_ups, bool registering) {
  WorkerModel model{entry.request.name, entry.request.zoo_model,     entry.stored->layers(),
                    entry.train_order,  entry.stored->total_bytes(), entry.archive,
                    entry.archive_bytes};
  model.dtype = entry.request.dtype;
  if (!warm_ups) return model;
  // At the batch it serves (or a fill job steps at), and a training step wherever one may run:
  // a fill job's model times its step, which its first bubble is then admitted by.
  const registry::WarmFor purpose =
      registering ? entry.request.warm_for : registry::WarmFor::kServing;
  model.warm.batch = std::max<uint32_t>(entry.request.batch_size, 1);
  model.warm.train = entry.trainable.ok() && purpose != registry::WarmFor::kFillInference;
  model.warm.train_required = purpose == registry::WarmFor::kFillTraining;
  model.warm.measure = purpose != registry::WarmFor::kServing;
  return model;
}

// Task `task`'s failure when its inputs' arrival ended with `why`.
absl::Status InputsNeverArrived(uint64_t task, const absl::Status& why) {
  return absl::Status(why.code(),
                      absl::StrCat("task ", task, ": its inputs never arrived: ", why.message()));
}

}  // namespace

struct GpuScheduler::RunResult {
  int slot = -1;        // the worker that ran it
  absl::Status status;  // the worker's verdict
  // What the run did; its timeline is the run's, with the worker's marks and the answer's time.
  TaskOutcome outcome;
  // The outputs the worker listed, copied out of the message (or why they could not be read).
  absl::StatusOr<std::vector<proto::HostTensor>> outputs;
  // False for a task abandoned before its Run went out (AbandonUnrun): it never touched the
  // weights, so its failure does not make the region untrusted.
  bool ran = true;
  // It gave the GPU back before its Run (YieldUnrun): it goes back to the queue, unanswered.
  bool requeue = false;
};

struct GpuScheduler::Running {
  uint64_t task_id = 0;
  int slot = -1;  // -1: a placeholder holding the GPU (no worker of it runs)
  bool stop_sent = false;
  std::shared_ptr<memdaemon::Transmission> transmission;  // null when the model was resident
  EntryRef entry;  // null for a synthetic fill run
  std::unique_ptr<TrainingState> training;  // training runs only
  SwitchTimeline timeline;
  // Set once its worker answered before its switch's copy ended: the answer, completed when the
  // Switcher reports the copy's end (CopyEnded). The run then has no slot.
  std::unique_ptr<RunResult> answered;
  // Placed on `slot` (Prepare sent, its copy started) with its Run held until its inputs arrive
  // (InputsEnded) and its optimizer state is restored off the loop (RestoreEnded); `batch` is
  // the Run's. While `restoring`, `training` is the restore's and the run holds the GPU whatever
  // happens to it, until RestoreEnded.
  bool awaiting_inputs = false;
  bool restoring = false;
  uint32_t batch = 0;
  absl::Time placed_at = absl::InfinitePast();  // when it was placed (its inputs' hold)
  bool copied = false;  // its switch's copy ended well (CopyEnded)
  int64_t stop_sent_ns = 0;     // its worker was told to stop (StopRunning; 0: not)
  uint64_t weights_offset = 0;  // where its model's weights are in the arena
  // The optimizer state's room in the weights pool it holds (WeightsCache::ReserveState), freed
  // or kept for its resume when it ends (Complete, EndTraining's save); none without one.
  std::optional<CheckpointKey> state;
  bool RunHeld() const { return awaiting_inputs || restoring; }
};

GpuScheduler::GpuScheduler(const SchedulerOptions& options, memdaemon::MemDaemon* daemon,
                           ModelCatalog* catalog)
    : options_(options),
      daemon_(daemon),
      catalog_(catalog),
      queue_(options.policy, options.inference_preempts_training),
      checkpoints_(options.checkpoints ? options.checkpoints
                                       : std::make_shared<StateCheckpoints>()),
      telemetry_(options.telemetry ? options.telemetry : std::make_shared<Telemetry>()),
      loop_(std::make_shared<EventLoop>([this] { AfterEvent(); })),
      loop_role_(loop_->role()),
      // What is due is done by AfterEvent (a stop, a deadline, an input hold), or here.
      kill_timer_(
          loop_->io(), [] {}, [this] { AfterEvent(); }),
      deadline_timer_(
          loop_->io(), [] {}, [this] { AfterEvent(); }),
      respawn_timer_(
          loop_->io(),
          [this] {
            loop_role_.AssertHeld();
            pool_->RespawnDue();
          },
          [this] { AfterEvent(); }),
      silence_timer_(
          loop_->io(),
          [this] {
            loop_role_.AssertHeld();
            pool_->KillSilent(absl::Now());
          },
          [this] { AfterEvent(); }),
      shutdown_timer_(loop_->io(), [this] { loop_->Stop(); }),
      inputs_hold_timer_(
          loop_->io(), [] {}, [this] { AfterEvent(); }) {
  WorkerPoolOptions pool;
  pool.gpu = options.gpu;
  pool.workers = options.workers;
  pool.region_offset = options.region_offset;
  pool.silence_timeout = options.worker_silence_timeout;
  pool.launch = options.launch
                    ? options.launch
                    : [spawn = options.spawn](uint32_t id, WorkerProcess::EventHandler handler)
      -> absl::StatusOr<std::unique_ptr<WorkerLink>> {
    WorkerSpawnOptions with_id = spawn;
    with_id.worker_id = id;
    PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<WorkerProcess> process,
                             WorkerProcess::Spawn(with_id, std::move(handler)));
    return std::unique_ptr<WorkerLink>(std::move(process));
  };
  pool.models = [catalog, warm_ups = options.warm_ups] {
    std::vector<WorkerModel> models;
    for (const EntryRef& entry : catalog->List()) {
      models.push_back(WorkerModelOf(*entry, warm_ups, /*registering=*/false));
    }
    return models;
  };
  pool.release_drain = [daemon](uint32_t slot, uint32_t promised) {
    daemon->ReleaseDrain(slot, promised);
  };
  pool_ = std::make_unique<WorkerPool>(std::move(pool), loop_, static_cast<WorkerPool::Listener*>(this));
  WeightsCacheOptions cache;
  cache.pool_offset = options.region_offset;
  cache.pool_bytes = options.region_bytes;
  cache.region_alignment = options.region_alignment;
  cache.flag_count = memdaemon::kReadyFlagCount;
  cache.enabled = options.weights_cache;
  cache.capacity_bytes = options.weights_cache_bytes;
  cache.policy = options.eviction_policy;
  switcher_ = std::make_unique<Switcher>(
      SwitcherOptions{options.gpu, cache, options.drain_timeout}, &daemon->transmitter(),
      pool_.get(), loop_, [this](uint64_t task, uint32_t epoch, const absl::Status& copied) {
        CopyEnded(task, epoch, copied);
      });
  switcher_->set_on_evicted([this](const std::string& evicted, const std::string& for_model) {
    telemetry_->Evicted(options_.gpu, evicted, for_model);
  });
  switcher_->set_on_pinned_moved([this](const std::string& moved, const std::string& for_model) {
    loop_role_.AssertHeld();  // posted to the loop by the Switcher
    MovePinned(moved, {for_model});
  });
}

absl::StatusOr<std::unique_ptr<GpuScheduler>> GpuScheduler::Start(const SchedulerOptions& options,
                                                                  memdaemon::MemDaemon* daemon,
                                                                  ModelCatalog* catalog) {
  if (options.workers < 1 || options.workers > static_cast<int>(memdaemon::kDrainFlagCount)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker count ", options.workers, " out of range [1, ", memdaemon::kDrainFlagCount, "]"));
  }
  if (options.region_bytes == 0) {
    return absl::InvalidArgumentError("the weights pool (region_bytes) must not be empty");
  }
  PSWITCH_RETURN_IF_ERROR(daemon->arena().CheckRange(options.region_offset, options.region_bytes));
  std::unique_ptr<GpuScheduler> s(new GpuScheduler(options, daemon, catalog));
  s->loop_thread_ = std::thread([p = s.get()] { p->Loop(); });
  s->Post([p = s.get()] {
    p->loop_role_.AssertHeld();
    p->pool_->Start();
  });
  return s;
}

GpuScheduler::~GpuScheduler() {
  Post([this] {
    loop_role_.AssertHeld();
    stopping_ = true;
    pool_->StopRespawning();
    while (auto ticket = queue_.Pop()) {
      Finish(ticket->id, absl::CancelledError("pswitchd is shutting down"));
    }
    for (auto& [model, done] : unloads_) done(absl::CancelledError("pswitchd is shutting down"));
    unloads_.clear();
    StopRunning();
  });
  loop_thread_.join();
}

base::Log GpuScheduler::Event(base::LogLevel level, absl::string_view event) const {
  base::Log line(level, event);
  line.Field("gpu", options_.gpu);
  return line;
}

void GpuScheduler::AfterEvent() {
  loop_role_.AssertHeld();
  // A busy loop must not starve the stop deadline; its timer may not have had its turn yet.
  EnforceStop();
  EnforceResidentPause();
  KillSilentStopper();
  FinishUnloads();
  telemetry_->WeightsCache(options_.gpu, switcher_->cache().stats());
  PublishResident();
  if (stopping_) {
    // A running task gets a bounded time to reach its sync point, then the loop ends anyway.
    if (!shutdown_timer_.armed()) shutdown_timer_.ArmAt(absl::Now() + absl::Seconds(30));
    // A checkpoint in flight ends (and answers its task) before the loop does, and so does a
    // task placed ahead, whose Run is out.
    if (running_ == nullptr && next_ == nullptr && being_checkpointed_.empty()) {
      loop_->Stop();
      return;
    }
  } else {
    EnforceDeadlines();
    FailLostUnsaved();
    MaybeStart();  // may stop a task, arming its deadline below
  }
  // Deadlines are timers, re-armed to whatever is due next; AfterEvent enforces a due stop.
  kill_timer_.ArmAt(std::min({stop_deadline_.deadline(), SilentStopperDue(),
                              resident_pause_ ? resident_pause_->due : absl::InfiniteFuture()}));
  deadline_timer_.ArmAt(stopping_ ? absl::InfiniteFuture() : tasks_table_.NextDeadline());
  respawn_timer_.ArmAt(pool_->NextRespawn());
  silence_timer_.ArmAt(stopping_ ? absl::InfiniteFuture() : pool_->NextSilenceDeadline());
  inputs_hold_timer_.ArmAt(stopping_ ? absl::InfiniteFuture() : InputsHoldEnds());
}

void GpuScheduler::Loop() {
  // Runs until AfterEvent stops it (shutdown), whatever is or is not queued.
  loop_->Run();
  loop_role_.AssertHeld();  // still the loop's thread: what it left is answered here
  if (running_ != nullptr) {
    Finish(running_->task_id, absl::DeadlineExceededError("task did not stop before shutdown"));
    FreeRunState(*running_);
    running_.reset();
  }
  if (next_ != nullptr) {
    Finish(next_->task_id, absl::CancelledError("pswitchd is shutting down"));
    next_.reset();
  }
  for (const auto& [id, held] : being_checkpointed_) {
    Finish(id, absl::DeadlineExceededError("its checkpoint did not end before shutdown"));
  }
  being_checkpointed_.clear();
  // Every task gets an answer: also one that went back to the queue when shutdown stopped it
  // (training resumes from a checkpoint, but not in this process).
  while (auto ticket = queue_.Pop()) {
    Finish(ticket->id, absl::CancelledError("pswitchd is shutting down"));
  }
  // Workers shut down and are reaped; their death events find the loop closed.
  pool_->Close();
}

void GpuScheduler::OnDrained(int slot, uint64_t task, const proto::Drained& drained) {
  loop_role_.AssertHeld();  // WorkerPool calls its Listener on the loop
  absl::Duration clean = absl::Nanoseconds(drained.clean_end_ns() - drained.clean_start_ns());
  bool after_drain = drained.clean_start_ns() >= drained.drained_ns();
  Event(base::LogLevel::kInfo, "worker_drained")
      .Field("slot", slot)
      .Field("task", task)
      .Field("clean_us", absl::ToDoubleMicroseconds(clean), 1)
      .Field("cleaned_after_drain", after_drain);
  tasks_.RecordCleaning(task, clean, after_drain);
}

void GpuScheduler::AddModel(EntryRef entry, ModelLoads::Done done) {
  Post([this, entry, done = std::move(done)] {
    loop_role_.AssertHeld();
    switcher_->Pin(entry->request.name, entry->request.pin_resident);
    // A model pinned resident is copied in once every worker has loaded it: its first task is
    // already a hit. A registration does not fail for it (the pin still holds from its first
    // task on); why it could not be copied now is logged.
    ModelLoads::Done loaded = done;
    if (entry->request.pin_resident && options_.weights_cache) {
      loaded = [this, entry, done = std::move(done)](const LoadOutcome& outcome) {
        loop_role_.AssertHeld();
        if (outcome.status.ok()) {
          std::set<std::string> placed;
          for (const Running* run : {running_.get(), next_.get()}) {
            if (run != nullptr && run->entry != nullptr) placed.insert(run->entry->request.name);
          }
          absl::Status preloaded = switcher_->Preload(*entry, std::move(placed));
          Event(preloaded.ok() ? base::LogLevel::kInfo : base::LogLevel::kWarn,
                "weights_pinned_at_registration")
              .Field("model", entry->request.name)
              .Field("error", preloaded);
        }
        done(outcome);
      };
    }
    pool_->AddModel(WorkerModelOf(*entry, options_.warm_ups, /*registering=*/true), loaded);
  });
}

void GpuScheduler::DropModel(std::string model, std::function<void(absl::Status)> done) {
  Post([this, model = std::move(model), done = std::move(done)]() mutable {
    loop_role_.AssertHeld();
    if (stopping_) {
      done(absl::CancelledError("pswitchd is shutting down"));
      return;
    }
    std::vector<uint64_t> queued;
    for (const auto& [id, record] : tasks_table_.all()) {
      if (record.spec.model == model && !record.spec.fill) queued.push_back(id);
    }
    for (uint64_t id : queued) {
      if (queue_.Remove(id)) {
        Finish(id, absl::UnavailableError(absl::StrCat("task ", id, " failed: model '", model,
                                                       "' was unloaded before it started")));
      }
    }
    for (const auto& [id, held] : being_checkpointed_) {
      // By the task's model: a run whose weights stayed resident holds no region.
      const TaskRecord* record = tasks_table_.Find(id);
      if (record == nullptr || record->spec.model != model) continue;
      tasks_table_.at(id).StopFor(
          absl::CancelledError(absl::StrCat("task ", id, " cancelled: model '", model,
                                            "' is being unloaded (its weights were saved)")));
    }
    // A task placed ahead of it finishes, as a running inference batch does; the unload waits.
    if (running_ != nullptr && running_->entry != nullptr &&
        running_->entry->request.name == model) {
      const uint64_t id = running_->task_id;
      if (tasks_table_.at(id).spec.kind == TaskKind::kTraining) {
        tasks_table_.at(id).StopFor(
            absl::CancelledError(absl::StrCat("task ", id, " cancelled: model '", model,
                                              "' is being unloaded (its weights were saved)")));
        StopRunning();
      }
      // A running inference batch finishes and is answered; the unload waits for it.
    }
    Event(base::LogLevel::kInfo, "model_unloading")
        .Field("model", model)
        .Field("queued_failed", queued.size())
        .Field("waits_for_task", running_ != nullptr && running_->entry != nullptr &&
                                     running_->entry->request.name == model);
    unloads_.emplace_back(std::move(model), std::move(done));
  });
}

void GpuScheduler::FailLostUnsaved() {
  for (auto it = unsaved_owners_.begin(); it != unsaved_owners_.end();) {
    const uint64_t id = *it;
    TaskRecord* record = tasks_table_.Find(id);
    if (record != nullptr && record->weights_unsaved &&
        switcher_->UnsavedTask(record->spec.model) == id) {
      ++it;
      continue;
    }
    // Lost while its optimizer state is still being saved off the loop (it is in no queue
    // then): it fails once that save puts it back in the queue, not silently never.
    if (record != nullptr && record->weights_unsaved && being_checkpointed_.contains(id)) {
      ++it;
      continue;
    }
    it = unsaved_owners_.erase(it);
    if (record == nullptr || !record->weights_unsaved || !queue_.Remove(id)) continue;
    Event(base::LogLevel::kError, "unsaved_weights_lost")
        .Field("task", id)
        .Field("model", record->spec.model);
    Finish(id, LostUnsaved(id, record->spec.model));
  }
}

absl::Status GpuScheduler::LostUnsaved(uint64_t task_id, const std::string& model) {
  return absl::DataLossError(absl::StrCat(
      "task ", task_id,
      " failed: the weights it trained before it was preempted were kept on "
      "the GPU unsaved and were lost there (a run on model '",
      model, "' failed or its worker died mid-run) before they could be written back"));
}

void GpuScheduler::EndQueued(uint64_t task_id, absl::Status why) {
  if (!EndOnceSaved(task_id, why)) Finish(task_id, why);
}

bool GpuScheduler::EndOnceSaved(uint64_t task_id, const absl::Status& why) {
  TaskRecord* record = tasks_table_.Find(task_id);
  if (record == nullptr || !record->weights_unsaved) return false;
  const std::string& model = record->spec.model;
  if (switcher_->UnsavedTask(model) != task_id || !WriteBack(model)) return false;
  // Answered by WrittenBack, and still found meanwhile (a cancel, a deadline, shutdown).
  record->StopFor(why);
  being_checkpointed_[task_id] = std::string();  // the write-back holds the region itself
  return true;
}

bool GpuScheduler::WriteBack(const std::string& model) {
  const ResidentModel* region = switcher_->cache().Find(model);
  if (region == nullptr || region->unsaved_task == 0) return false;
  if (region->state_of) return SaveState(*region->state_of);
  if (writing_back_.contains(model)) return true;  // WrittenBack comes
  // Read by another checkpoint (none holds a region with unsaved weights: another training of
  // the model first has them written back); the caller tries again later.
  if (switcher_->BeingCheckpointed(model)) return false;
  absl::StatusOr<EntryRef> entry = catalog_->Find(model);
  if (!entry.ok()) return false;  // unloaded: nothing to save it into
  const uint64_t task = region->unsaved_task;
  const uint64_t offset = region->offset;
  Event(base::LogLevel::kInfo, "unsaved_weights_write_back")
      .Field("model", model)
      .Field("task", task)
      .Field("bytes", region->bytes);
  switcher_->CheckpointReading(model);
  writing_back_.insert(model);
  checkpointing_.Add([this, model, task, offset, entry = *std::move(entry), daemon = daemon_,
                      loop = loop_, before = options_.before_checkpoint]() mutable {
    if (before) before(task);
    uint64_t generation = 0;
    absl::Status saved = daemon->CheckpointWeights(offset, *entry->stored, &generation);
    entry.reset();  // the model may be unregistered once this is done
    loop->Post([this, model, task, generation, saved = std::move(saved)] {
      loop_role_.AssertHeld();
      WrittenBack(model, task, generation, saved);
    });
  });
  return true;
}

void GpuScheduler::FreeRunState(Running& run) {
  if (std::optional<CheckpointKey> state = std::exchange(run.state, std::nullopt)) {
    switcher_->FreeState(*state);
  }
}

CheckpointKey GpuScheduler::StateKey(uint64_t task_id, const TaskSpec& spec) {
  return spec.fill ? spec.fill->state_key : CheckpointKey::Task(task_id);
}

uint64_t GpuScheduler::OptimizerBytes(const TaskSpec& spec, const registry::CatalogEntry& entry) {
  return spec.kind == TaskKind::kTraining
             ? api::OptimizerStateSlots(spec.trainer) * entry.optimizer_slot_bytes
             : 0;
}

bool GpuScheduler::SaveState(CheckpointKey key) {
  const ResidentModel* region = switcher_->FindState(key);
  if (region == nullptr || region->unsaved_task == 0) return false;
  if (switcher_->StateHeld(key)) return true;  // StateWrittenBack comes
  const uint64_t task = region->unsaved_task;
  const memdaemon::StateArea::Room room{region->offset, region->bytes};
  const uint64_t bytes = region->state_bytes;
  Event(base::LogLevel::kInfo, "optimizer_state_write_back")
      .Field("task", task)
      .Field("bytes", bytes);
  switcher_->HoldState(key);
  checkpointing_.Add(
      [this, key, task, room, bytes, daemon = daemon_, checkpoints = checkpoints_, loop = loop_] {
        absl::Status saved = SaveKeptState(*daemon, *checkpoints, key, room, bytes);
        loop->Post([this, key, task, saved = std::move(saved)] {
          loop_role_.AssertHeld();
          StateWrittenBack(key, task, saved);
        });
      });
  return true;
}

void GpuScheduler::StateWrittenBack(CheckpointKey key, uint64_t task, const absl::Status& saved) {
  switcher_->ReleaseState(key);
  switcher_->FreeState(key);  // in host memory now, or lost
  Event(saved.ok() ? base::LogLevel::kInfo : base::LogLevel::kError, "optimizer_state_written")
      .Field("task", task)
      .Field("error", saved);
  TaskRecord* owner = tasks_table_.Find(task);
  if (owner == nullptr) {
    checkpoints_->Drop(key);  // it ended meanwhile
    return;
  }
  if (saved.ok()) return;
  // Its task must not resume from zeros: it fails now, or when it would start.
  owner->state_lost = saved;
  if (queue_.Remove(task)) Finish(task, saved);
}

void GpuScheduler::WrittenBack(const std::string& model, uint64_t task, uint64_t generation,
                               const absl::Status& saved) {
  switcher_->CheckpointRead(model);
  writing_back_.erase(model);
  Event(saved.ok() ? base::LogLevel::kInfo : base::LogLevel::kError, "unsaved_weights_written")
      .Field("model", model)
      .Field("task", task)
      .Field("error", saved);
  TaskRecord* owner = tasks_table_.Find(task);
  // Ended while queued (EndQueued): answered now that its weights are saved, or lost.
  const bool ending = being_checkpointed_.erase(task) > 0 && owner != nullptr;
  if (saved.ok()) {
    switcher_->Checkpointed(model, generation);
    unsaved_owners_.erase(task);
    if (owner == nullptr) return;
    owner->weights_unsaved = false;
    if (!ending) return;
    if (std::optional<absl::Status> why = owner->TakeStopReason()) {
      Finish(task, absl::Status(why->code(),
                                absl::StrCat(why->message(), " after ", owner->resume_iteration,
                                             " iterations (weights saved)")));
    }
    return;
  }
  // The region may still hold them, but nothing can keep them: the store is what a task resumes
  // from, and it is older. The task they belong to fails rather than resume from there.
  switcher_->Untrust(model);
  if (owner != nullptr && (ending || queue_.Remove(task))) {
    Finish(task, absl::DataLossError(
                     absl::StrCat("task ", task,
                                  " failed: its weights trained since it was preempted could "
                                  "not be written back to the pinned store: ",
                                  saved.message())));
  }
}

void GpuScheduler::MovePinned(const std::string& moved, std::set<std::string> keep) {
  absl::StatusOr<EntryRef> entry = catalog_->Find(moved);
  if (!entry.ok()) return;  // unloaded meanwhile: nothing to copy
  for (const Running* run : {running_.get(), next_.get()}) {
    if (run != nullptr && run->entry != nullptr) keep.insert(run->entry->request.name);
  }
  keep.erase(std::string());
  // Its pin holds either way: should no room be left now, its next task copies it in.
  absl::Status copied = switcher_->Preload(**entry, std::move(keep));
  Event(copied.ok() ? base::LogLevel::kInfo : base::LogLevel::kWarn, "pinned_weights_copied_again")
      .Field("model", moved)
      .Field("error", copied);
}

void GpuScheduler::FinishUnloads() {
  for (auto it = unloads_.begin(); it != unloads_.end();) {
    const std::string& model = it->first;
    const bool busy = (running_ != nullptr && running_->entry != nullptr &&
                       running_->entry->request.name == model) ||
                      (next_ != nullptr && next_->entry->request.name == model) ||
                      switcher_->BeingCheckpointed(model) || switcher_->Copying(model);
    if (busy) {
      ++it;
      continue;
    }
    switcher_->Unloaded(model);
    pool_->RemoveModel(model);
    Event(base::LogLevel::kInfo, "model_unloaded").Field("model", model);
    std::function<void(absl::Status)> done = std::move(it->second);
    it = unloads_.erase(it);
    done(absl::OkStatus());
  }
}

// AwaitReady is the pool's one method for any thread (it waits on the pool's own mutex), and
// the pointer itself never changes after construction.
bool GpuScheduler::AwaitWorkersReady(absl::Duration timeout) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return pool_->AwaitReady(timeout);
}

void GpuScheduler::OnWorkerDied(int slot, const absl::Status& why, bool killed, bool was_busy) {
  loop_role_.AssertHeld();  // WorkerPool calls its Listener on the loop
  // A half-finished training step may have touched the weights.
  switcher_->SlotDied(slot, was_busy);
  if (killed) telemetry_->WorkerKilled(options_.gpu);
  telemetry_->WorkerRestarted(options_.gpu);  // the pool replaces every worker that dies
  if (next_ != nullptr && next_->slot == slot) {
    // The task placed ahead on it: its Run went out there, so it fails as a running task's does.
    const uint64_t id = next_->task_id;
    next_.reset();
    absl::Status failed =
        absl::UnavailableError(absl::StrCat("task ", id, " failed: ", why.message()));
    Finish(id, killed ? MarkKilled(std::move(failed)) : failed);
  }
  if (running_ == nullptr || running_->slot != slot) return;
  const uint64_t id = running_->task_id;
  TaskRecord* record = tasks_table_.Find(id);
  if (running_->awaiting_inputs && record != nullptr && !record->requeued_after_death) {
    record->requeued_after_death = true;
    // Its Run never went out: it did not run on the dead worker, so it goes back to the queue's
    // head (its bytes keep arriving) for another worker, rather than fail for this one. Once: a
    // placement that kills its worker must not kill one after another. No second hold either.
    record->inputs_yielded = true;
    std::unique_ptr<Running> run = std::move(running_);
    Event(base::LogLevel::kWarn, "task_requeued")
        .Field("task", id)
        .Field("slot", slot)
        .Field("reason", absl::StrCat("its worker died before its Run: ", why.message()));
    RunResult result = Unrun(*run, absl::OkStatus());
    result.requeue = true;
    HoldOrComplete(std::move(run), std::move(result));
    return;
  }
  absl::Status failed = absl::UnavailableError(absl::StrCat(
      "task ", id, " failed: ", why.message(), "; the task's model state is its last checkpoint"));
  if (running_->RunHeld()) {
    // No Run went out (its state is still being copied into the arena, or its inputs arrive
    // after a requeue already): the GPU stays held until the restore and the copy end.
    AbandonUnrun(killed ? MarkKilled(std::move(failed)) : failed);
    return;
  }
  // Its training state is dropped: it resumes from its last checkpoint.
  FreeRunState(*running_);
  running_.reset();
  Finish(id, killed ? MarkKilled(std::move(failed)) : failed);
}

void GpuScheduler::StopRunning() {
  if (running_ == nullptr || running_->stop_sent) return;
  if (running_->awaiting_inputs) {
    // No Run went out: nothing to stop, the task is abandoned (with the reason it stops for).
    const uint64_t id = running_->task_id;
    const TaskRecord* record = tasks_table_.Find(id);
    absl::Status why =
        record != nullptr && record->stop_reason ? *record->stop_reason
        : stopping_
            ? absl::CancelledError("pswitchd is shutting down")
            : absl::CancelledError(absl::StrCat("task ", id, " stopped before its inputs arrived"));
    AbandonUnrun(std::move(why));
    return;
  }
  if (running_->restoring) {
    // No Run went out yet and none will: the restore's end completes it as a run stopped
    // before its first iteration (RestoreEnded). Nothing to kill meanwhile.
    running_->stop_sent = true;
    return;
  }
  // A resident fill run may be waiting on its bell between bubbles: woken, it ends at once (rung
  // before the message, so the run's end never waits for the message's way).
  if (BubbleBell* bell = RunningBell()) bell->Stop();
  // An unreachable worker is dead; its death event fails the task.
  (void)switcher_->Stop(running_->slot);
  running_->stop_sent = true;
  running_->stop_sent_ns = base::MonotonicNowNs();
  // A worker that never answers (stopped, or its stream waiting on a flag no one writes) must
  // not hold the GPU's queue: past the drain deadline it is killed, which fails its task.
  stop_deadline_.Arm(running_->task_id, absl::Now() + options_.drain_timeout,
                     absl::StrCat("killed: the worker did not stop within ",
                                  absl::FormatDuration(options_.drain_timeout),
                                  " of being told to (it did not drain)"));
}

void GpuScheduler::EnforceDeadlines() {
  const absl::Time now = absl::Now();
  for (const uint64_t id : tasks_table_.TakeExpired(now)) {
    absl::Status missed = absl::DeadlineExceededError(
        absl::StrCat("task ", id, " did not finish by its deadline"));
    if (queue_.Remove(id)) {
      EndQueued(id, absl::DeadlineExceededError(
                        absl::StrCat(missed.message(), " (it was still queued)")));
    } else if (next_ != nullptr && next_->task_id == id) {
      tasks_table_.at(id).StopFor(std::move(missed));  // answered with it once it finishes
    } else if (being_checkpointed_.contains(id)) {
      tasks_table_.at(id).StopFor(std::move(missed));  // answered when its checkpoint ends
    } else if (running_ != nullptr && running_->task_id == id) {
      // Stopped at its next sync point (training saves its weights); killed past the drain
      // timeout if it never gets there.
      tasks_table_.at(id).StopFor(std::move(missed));
      StopRunning();
    }
  }
}

absl::Time GpuScheduler::SilentStopperDue() const {
  // Only while a task waits behind it (placed ahead, or queued): otherwise the silence and
  // drain timeouts bound it as any tenant's.
  if ((next_ == nullptr && queue_.empty()) || running_ == nullptr || !running_->stop_sent ||
      running_->slot < 0 || running_->restoring || running_->answered != nullptr ||
      pool_->Killing(running_->slot)) {
    return absl::InfiniteFuture();
  }
  return pool_->LastHeard(running_->slot) +
         std::min(options_.stopping_silence_timeout, options_.worker_silence_timeout);
}

void GpuScheduler::KillSilentStopper() {
  const absl::Time due = SilentStopperDue();
  if (due == absl::InfiniteFuture() || absl::Now() < due) return;
  // Stopped or wedged (a SIGSTOPped tenant): the tasks behind it do not wait for the watchdog.
  // Its death fails its run as any kill does.
  pool_->Kill(running_->slot,
              absl::StrCat("killed: the worker went silent (no heartbeat for ",
                           absl::FormatDuration(absl::Now() - pool_->LastHeard(running_->slot)),
                           ") after being told to stop, with tasks waiting behind it"));
}

BubbleBell* GpuScheduler::RunningBell() const {
  if (running_ == nullptr) return nullptr;
  const TaskRecord* record = tasks_table_.Find(running_->task_id);
  if (record == nullptr || !record->spec.fill) return nullptr;
  return record->spec.fill->bell.get();
}

void GpuScheduler::EnforceResidentPause() {
  if (!resident_pause_ || absl::Now() < resident_pause_->due) return;
  const ResidentPause pause = *resident_pause_;
  resident_pause_.reset();
  BubbleBell* bell = RunningBell();
  // Ended, or being stopped (its own deadline): nothing to check.
  if (bell == nullptr || running_->task_id != pause.task || running_->slot < 0 ||
      running_->stop_sent) {
    return;
  }
  // Not paused: a step begun with no bubble open, one in progress with none opened since
  // (pswitchd's own count, not the page's), or the step it was in at the close, uncut.
  const BubbleBell::Report report = bell->Read();
  const bool none_opened = bell->opens() == pause.close.opens;
  const int64_t well_after = pause.close.closed_ns + absl::ToInt64Nanoseconds(pause.grace) / 2;
  const bool late_start = report.late_starts > pause.close.late_starts ||
                          (none_opened && report.last_step_start_ns > well_after);
  const bool still_stepping = report.stepping && none_opened;
  const bool same_step = report.stepping && pause.close.step_start_ns != 0 &&
                         report.last_step_start_ns == pause.close.step_start_ns;
  if (!late_start && !still_stepping && !same_step) return;
  pool_->Kill(running_->slot,
              absl::StrCat("killed: the fill task did not pause within ",
                           absl::FormatDuration(pause.grace), " of its bubble's end"));
}

void GpuScheduler::EnforceStop() {
  std::optional<StopDeadline::Expired> expired = stop_deadline_.Due(absl::Now());
  // A run whose checkpoint is being written (slot -1) has no worker left to kill.
  // Nor does one whose state is being restored (its Run never went out; the restore is bounded).
  if (!expired || running_ == nullptr || running_->task_id != expired->task || running_->slot < 0 ||
      running_->restoring) {
    return;
  }
  // Its death event fails the run and respawns the worker.
  pool_->Kill(running_->slot, std::move(expired->reason));
}

uint64_t GpuScheduler::SubmitFill(TaskSpec spec, TaskCallback done) {
  const uint64_t id = tasks_.Add(spec.model);
  if (spec.arrival_ns == 0) spec.arrival_ns = base::MonotonicNowNs();
  Post([this, id, spec = std::move(spec), done = std::move(done)]() mutable {
    loop_role_.AssertHeld();
    TaskTicket ticket{id, spec.model, spec.kind, INT32_MIN, absl::InfiniteFuture()};
    // A fill run has no deadline of its own: its bubble bounds it.
    tasks_table_.Add(id, std::move(spec), std::move(done), /*deadline=*/false);
    absl::Status admitted =
        stopping_ ? absl::FailedPreconditionError("pswitchd is shutting down")
                  : bubble_runs_.Admit(ticket, running_ != nullptr &&
                                                   tasks_table_.at(running_->task_id).spec.fill);
    if (!admitted.ok()) Finish(id, admitted);
  });
  return id;
}

void GpuScheduler::EndBubble(absl::Duration grace, std::optional<ResidentClose> resident) {
  Post([this, grace, resident, ended = absl::Now()] {
    loop_role_.AssertHeld();
    if (std::optional<uint64_t> id = bubble_runs_.EndBubble()) AnswerUnstartedFill(*id, ended);
    if (running_ == nullptr || !tasks_table_.at(running_->task_id).spec.fill) return;
    if (RunningBell() != nullptr) {
      // Resident: its bell told it; it is only checked.
      if (resident)
        resident_pause_ = ResidentPause{running_->task_id, *resident, ended + grace, grace};
      return;
    }
    StopRunning();
    stop_deadline_.Arm(running_->task_id, ended + grace,
                       absl::StrCat("killed: the fill task did not pause within ",
                                    absl::FormatDuration(grace), " of its bubble's end"));
  });
}

void GpuScheduler::StopFill(uint64_t task_id) {
  Post([this, task_id] {
    loop_role_.AssertHeld();
    if (bubble_runs_.Withdraw(task_id)) {
      AnswerUnstartedFill(task_id, absl::Now());
    } else if (running_ != nullptr && running_->task_id == task_id) {
      StopRunning();
    }
  });
}

void GpuScheduler::AnswerUnstartedFill(uint64_t id, absl::Time at) {
  // It never started: nothing to pause.
  TaskOutcome outcome;
  outcome.task_id = id;
  outcome.stopped_early = true;
  outcome.paused_at = at;
  outcome.iterations_done = tasks_table_.at(id).spec.fill->first_iteration;
  Finish(id, outcome);
}

void GpuScheduler::MaybePreempt() {
  // A task that yielded while its inputs arrive preempts nothing until they are in.
  const TaskTicket* waiting = queue_.PeekIf([this](const TaskTicket& t) { return !Parked(t.id); });
  const TaskRecord* running = tasks_table_.Find(running_->task_id);
  if (waiting == nullptr || running_->stop_sent || running == nullptr) return;
  if (running_->awaiting_inputs) {
    // It holds its place, as the inference it is would once running, but only for its hold
    // while a task that can run at once waits.
    const TaskTicket* ready =
        queue_.PeekIf([this](const TaskTicket& t) { return !InputsArriving(t.id); });
    if (ready != nullptr && absl::Now() >= InputsHoldEnds()) YieldUnrun(ready->id);
    return;
  }
  const TaskSpec& s = running->spec;
  TaskTicket running_ticket{running_->task_id, s.model, s.kind, s.priority, s.deadline};
  running_ticket.arrival_seq = INT64_MIN;  // it was scheduled first
  // Every task outranks a fill run: fill only uses idle time.
  if (s.fill) {
    StopRunning();  // a fill run's pause, counted by the fill side
  } else if (queue_.ShouldPreempt(running_ticket, *waiting)) {
    telemetry_->Preempted(options_.gpu);
    StopRunning();
  }
}

void GpuScheduler::MaybeStart() {
  while (true) {
    if (running_ != nullptr) {
      MaybePreempt();  // a task that yields unrun may give the GPU back at once
      if (running_ != nullptr) {
        PlaceAhead();
        return;
      }
    }
    if (next_ != nullptr) {
      PromoteAhead();
      continue;
    }
    // A task that yielded while its inputs arrive waits for them, unless nothing else waits.
    const TaskTicket* next = queue_.PeekIf([this](const TaskTicket& t) { return !Parked(t.id); });
    if (next == nullptr) next = queue_.Peek();
    const TaskTicket* fill_run = bubble_runs_.Next(/*tasks_waiting=*/next != nullptr);
    const bool fill = fill_run != nullptr;
    if (next == nullptr && !fill) {
      MaybeCompact();
      return;
    }
    const TaskTicket ticket = fill ? *fill_run : *next;
    WorkerPool::Outlook outlook;
    absl::Status never;
    if (fill && tasks_table_.at(ticket.id).spec.fill->synthetic) {
      // No model to switch in: any free worker runs it, once one is up.
      outlook = pool_->ForAnyWorker();
      never = absl::UnavailableError("no idle worker for the synthetic fill task");
    } else {
      outlook = switcher_->ForModel(ticket.model, &never);
      // Room only where a checkpoint still reads, or where a preempted task's weights or
      // optimizer state are unsaved: placed once the checkpoint has read, and those are written
      // back. A training run needs room for its optimizer state as well, unless its own is kept.
      if (absl::StatusOr<EntryRef> entry = catalog_->Find(ticket.model);
          outlook == WorkerPool::Outlook::kNow && entry.ok()) {
        const TaskSpec& spec = tasks_table_.at(ticket.id).spec;
        const CheckpointKey state = StateKey(ticket.id, spec);
        RoomWait wait = switcher_->WaitsForRoom(**entry, OptimizerBytes(spec, **entry), state);
        for (const std::string& name : wait.write_back) WriteBack(name);
        // Its own state, kept while it was preempted, is being saved to make room: resumed
        // once that is done, from host memory.
        if (wait.waits || switcher_->StateHeld(state)) outlook = WorkerPool::Outlook::kLater;
      }
      // Another training task trains on the model only once a preempted one's unsaved weights
      // are saved: should it fail, the preempted task's progress would go with the region.
      if (const uint64_t owner = switcher_->UnsavedTask(ticket.model);
          outlook == WorkerPool::Outlook::kNow && ticket.kind == TaskKind::kTraining &&
          owner != 0 && owner != ticket.id) {
        WriteBack(ticket.model);
        outlook = WorkerPool::Outlook::kLater;
      }
    }
    if (outlook == WorkerPool::Outlook::kLater) return;  // wait
    if (fill) {
      bubble_runs_.Taken();
    } else {
      queue_.Remove(ticket.id);
    }
    absl::Status started = outlook == WorkerPool::Outlook::kNever ? never : StartTask(ticket);
    if (!started.ok()) Finish(ticket.id, started);
  }
}

void GpuScheduler::MaybeCompact() {
  if (!options_.weights_cache || !options_.compact_weights || running_ != nullptr ||
      next_ != nullptr || stopping_) {
    return;
  }
  // Only where merging would give room to a model that has none: the registered models not
  // resident here. Asked first whether free space is split at all (every idle event comes here).
  if (!switcher_->cache().Fragmented()) return;
  std::vector<uint64_t> wanted;
  for (const EntryRef& entry : catalog_->List()) {
    if (switcher_->cache().Find(entry->request.name) != nullptr) continue;
    wanted.push_back(switcher_->cache().RoomFor(entry->stored->total_bytes()));
  }
  std::optional<RegionMove> move = switcher_->PlanMove(wanted);
  if (!move) return;
  // A model no longer in the catalog is being unloaded: its region goes with it (FinishUnloads).
  absl::StatusOr<EntryRef> entry = catalog_->Find(move->model);
  if (!entry.ok()) return;
  // A move that cannot start leaves the model where it was (or, stale, to be copied again at
  // its next request), and compaction pauses until a copy succeeds (Switcher::Move).
  if (absl::Status moved = switcher_->Move(**entry, *move); !moved.ok()) {
    Event(base::LogLevel::kWarn, "weights_move_failed")
        .Field("model", move->model)
        .Field("error", moved);
  }
}

void GpuScheduler::PlaceAhead() {
  if (!options_.place_at_arrival || next_ != nullptr || running_ == nullptr ||
      !running_->stop_sent) {
    return;
  }
  const TaskTicket* head = queue_.PeekIf([this](const TaskTicket& t) { return !Parked(t.id); });
  if (head == nullptr) return;
  const TaskTicket ticket = *head;
  TaskRecord& record = tasks_table_.at(ticket.id);
  TaskSpec& spec = record.spec;
  // An inference that runs the moment the GPU is free: nothing of it is held for inputs or an
  // optimizer state, and its model is not the one still stopping.
  if (spec.kind != TaskKind::kInference || spec.fill) return;
  if (spec.inputs_arrival) {
    std::optional<absl::Status> ended = spec.inputs_arrival->ended();
    if (!ended || !ended->ok()) return;
  }
  const std::string stopping = running_->entry != nullptr ? running_->entry->request.name : "";
  if (spec.model == stopping) return;
  absl::Status never;
  if (switcher_->ForModel(spec.model, &never) != WorkerPool::Outlook::kNow) return;
  if (!CheckRegionSlices(spec).ok()) return;  // it fails when its turn comes, as before
  absl::StatusOr<EntryRef> entry = catalog_->Find(spec.model);
  if (!entry.ok()) return;
  auto run = std::make_unique<Running>();
  run->task_id = ticket.id;
  run->entry = *std::move(entry);
  run->timeline.arrival_ns = spec.arrival_ns;
  run->timeline.placed_ns = base::MonotonicNowNs();
  if (running_->stop_sent_ns >= spec.arrival_ns) {
    run->timeline.stop_sent_ns = running_->stop_sent_ns;
  } else if (switcher_->last_stop_sent_ns() >= spec.arrival_ns) {
    run->timeline.stop_sent_ns = switcher_->last_stop_sent_ns();
  }
  Switcher::Ahead ahead{running_->slot, {}};
  if (!stopping.empty()) ahead.keep.insert(stopping);
  absl::StatusOr<Switcher::Placement> placed =
      switcher_->Place(ticket.id, *run->entry, run->timeline, &ahead);
  if (!placed.ok()) {
    // No standby, or room only where the stopping tenant is: placed when the GPU is free.
    Event(base::LogLevel::kDebug, "task_not_placed_ahead")
        .Field("task", ticket.id)
        .Field("error", placed.status());
    return;
  }
  queue_.Remove(ticket.id);
  if (spec.started_ns == 0) spec.started_ns = base::MonotonicNowNs();
  run->transmission = placed->transmission;
  run->weights_offset = placed->weights_offset;
  run->slot = placed->slot;
  run->batch = spec.batch > 0 ? spec.batch : run->entry->request.batch_size;
  run->placed_at = absl::Now();
  tasks_.SetState(ticket.id, TaskState::kSwitching, 0, pool_->pid(placed->slot));
  Event(base::LogLevel::kInfo, "task_placed_ahead")
      .Field("task", ticket.id)
      .Field("model", spec.model)
      .Field("slot", placed->slot)
      .Field("stopping_task", running_->task_id)
      .Field("switching", run->transmission != nullptr);
  next_ = std::move(run);
  // Its Run goes out now: nothing of it is where the stopping tenant may write (its region and
  // flags are apart, its worker is another), so it computes as its groups land, whether that
  // tenant stops at its next layer, late, or never (a silent one is still killed, for the tasks
  // after it). For at most the old tenant's last layer both compute.
  if (spec.inputs_arrival) next_->timeline.inputs_ns = spec.inputs_arrival->arrived_ns();
  absl::Status sent = CheckRegionSlices(spec);
  if (sent.ok()) sent = SendRun(*next_, next_->slot, spec, next_->batch);
  if (!sent.ok()) {
    // Its worker is unreachable (its death event follows) or its inputs' file shrank: it fails
    // as a task whose Run failed does; its copy ends on its own.
    const uint64_t id = next_->task_id;
    next_.reset();
    Finish(id, sent);
  }
}

void GpuScheduler::NoteOldStopped(SwitchTimeline& timeline) const {
  if (timeline.stop_sent_ns != 0 && last_stopped_ns_ >= timeline.stop_sent_ns) {
    timeline.old_stopped_ns = last_stopped_ns_;
  }
}

void GpuScheduler::PromoteAhead() {
  running_ = std::move(next_);
  Running& run = *running_;
  NoteOldStopped(run.timeline);
  // Its Run is out: a stop reason that came meanwhile is answered with its result, and a missed
  // deadline also stops it now (bounded by the drain deadline, as for any running task).
  const TaskRecord* record = tasks_table_.Find(run.task_id);
  if (record != nullptr && record->stop_reason && run.answered == nullptr) StopRunning();
}

absl::Status GpuScheduler::StartTask(const TaskTicket& ticket) {
  TaskSpec& started = tasks_table_.at(ticket.id).spec;
  // Inputs that will never come need no switch (the failure's own event may still be queued).
  std::optional<absl::Status> inputs_ended =
      started.inputs_arrival ? started.inputs_arrival->ended() : absl::OkStatus();
  if (inputs_ended && !inputs_ended->ok()) return InputsNeverArrived(ticket.id, *inputs_ended);
  // Before anything is placed or sent: a shared-memory file may have shrunk since admission.
  PSWITCH_RETURN_IF_ERROR(CheckRegionSlices(started));
  if (started.started_ns == 0) started.started_ns = base::MonotonicNowNs();
  const TaskSpec& spec = started;
  auto run = std::make_unique<Running>();
  run->task_id = ticket.id;
  if (spec.fill && spec.fill->synthetic) {
    // A synthetic fill run: no model; the active worker when free, so no standby waits.
    const int slot = pool_->FreeSlot(switcher_->active_slot());
    if (slot < 0) return absl::UnavailableError("no idle worker for the synthetic fill task");
    PSWITCH_RETURN_IF_ERROR(SendRun(*run, slot, spec, 1));
    running_ = std::move(run);
    return absl::OkStatus();
  }
  PSWITCH_ASSIGN_OR_RETURN(run->entry, catalog_->Find(spec.model));
  // Its weights stayed unsaved in its region when it was preempted: resumed only on them. A
  // worker that died mid-run on the model, or a failed run, untrusted them since.
  if (tasks_table_.at(ticket.id).weights_unsaved &&
      switcher_->UnsavedTask(spec.model) != ticket.id) {
    return LostUnsaved(ticket.id, spec.model);
  }
  run->timeline.arrival_ns = spec.arrival_ns;
  run->timeline.placed_ns = base::MonotonicNowNs();
  // The Stop that made room for it, when one went out after it arrived.
  if (switcher_->last_stop_sent_ns() >= spec.arrival_ns) {
    run->timeline.stop_sent_ns = switcher_->last_stop_sent_ns();
    if (last_stopped_ns_ >= run->timeline.stop_sent_ns) {
      run->timeline.old_stopped_ns = last_stopped_ns_;
    }
  }
  const CheckpointKey state_key = StateKey(ticket.id, spec);
  const uint64_t optimizer_bytes = OptimizerBytes(spec, *run->entry);
  if (std::optional<absl::Status> lost = tasks_table_.at(ticket.id).state_lost) return *lost;
  if (spec.kind == TaskKind::kTraining && optimizer_bytes == 0) {
    // A stateless optimizer: no area, nothing to copy.
    PSWITCH_ASSIGN_OR_RETURN(
        run->training, TrainingState::Begin(daemon_, checkpoints_.get(), ticket.id, state_key, 0));
  }
  PSWITCH_ASSIGN_OR_RETURN(Switcher::Placement placed,
                           switcher_->Place(ticket.id, *run->entry, run->timeline));
  run->transmission = placed.transmission;
  run->weights_offset = placed.weights_offset;
  // Its optimizer state's room in the pool: the one its last run left it in (kept while it was
  // preempted), or a new one, filled from host memory (RestoreState).
  memdaemon::StateArea::Room state_room;
  bool state_resident = false;
  if (optimizer_bytes > 0) {
    if (const ResidentModel* kept = switcher_->FindState(state_key); kept != nullptr) {
      if (kept->unsaved_task != ticket.id || kept->state_bytes != optimizer_bytes) {
        return absl::InternalError(
            absl::StrCat("task ", ticket.id, ": the optimizer state kept for it is not its own"));
      }
      switcher_->UseState(state_key);
      state_room = {kept->offset, kept->bytes};
      state_resident = true;
    } else {
      PSWITCH_ASSIGN_OR_RETURN(const uint64_t offset,
                               switcher_->ReserveState(state_key, optimizer_bytes, spec.model));
      state_room = {offset, switcher_->cache().RoomFor(optimizer_bytes)};
    }
    run->state = state_key;
  }
  const uint32_t batch = spec.batch > 0 ? spec.batch : run->entry->request.batch_size;
  if (!inputs_ended || optimizer_bytes > 0) {
    // The switch is under way; the Run waits for the bytes (InputsEnded) and for the optimizer
    // state's restore (RestoreEnded), which overlaps the weights' copy.
    run->slot = placed.slot;
    run->batch = batch;
    run->placed_at = absl::Now();
    run->awaiting_inputs = !inputs_ended;
    run->restoring = optimizer_bytes > 0;
    if (run->transmission != nullptr) {
      tasks_.SetState(ticket.id, TaskState::kSwitching, 0, pool_->pid(placed.slot));
    }
    Event(base::LogLevel::kInfo, run->awaiting_inputs ? "task_awaits_inputs" : "task_awaits_state")
        .Field("task", ticket.id)
        .Field("model", spec.model)
        .Field("slot", placed.slot)
        .Field("optimizer_bytes", optimizer_bytes)
        .Field("switching", run->transmission != nullptr);
    running_ = std::move(run);
    if (optimizer_bytes > 0) {
      RestoreState(ticket.id, state_key, optimizer_bytes, state_room, state_resident);
    }
    return absl::OkStatus();
  }
  if (spec.inputs_arrival) run->timeline.inputs_ns = spec.inputs_arrival->arrived_ns();
  PSWITCH_RETURN_IF_ERROR(SendRun(*run, placed.slot, spec, batch));
  running_ = std::move(run);
  return absl::OkStatus();
}

void GpuScheduler::InputsEnded(uint64_t task_id) {
  loop_role_.AssertHeld();
  const TaskRecord* record = tasks_table_.Find(task_id);
  if (record == nullptr) return;  // answered meanwhile
  const TaskSpec& spec = record->spec;
  std::optional<absl::Status> ended = spec.inputs_arrival->ended();
  if (!ended) return;
  if (!ended->ok()) {
    absl::Status failed = InputsNeverArrived(task_id, *ended);
    Event(base::LogLevel::kInfo, "task_inputs_failed")
        .Field("task", task_id)
        .Field("error", failed);
    if (queue_.Remove(task_id)) {
      Finish(task_id, failed);
    } else if (running_ != nullptr && running_->task_id == task_id && running_->awaiting_inputs) {
      AbandonUnrun(std::move(failed));
    }
    return;
  }
  // Still queued: it runs when its turn comes, as any task.
  if (running_ == nullptr || running_->task_id != task_id || !running_->awaiting_inputs) return;
  running_->awaiting_inputs = false;
  SendHeldRun();
}

void GpuScheduler::SendHeldRun() {
  Running& run = *running_;
  if (run.RunHeld() || run.stop_sent) return;
  const TaskSpec& spec = tasks_table_.at(run.task_id).spec;
  if (spec.inputs_arrival) run.timeline.inputs_ns = spec.inputs_arrival->arrived_ns();
  absl::Status sent = CheckRegionSlices(spec);
  if (sent.ok()) sent = SendRun(run, run.slot, spec, run.batch);
  if (!sent.ok()) AbandonUnrun(std::move(sent));
}

void GpuScheduler::RestoreState(uint64_t task_id, CheckpointKey key, uint64_t optimizer_bytes,
                                memdaemon::StateArea::Room room, bool resident) {
  // The job owns what it makes until the loop takes it; if the loop has ended by then, the
  // state (its pinned staging) goes with the dropped post, off the loop.
  checkpointing_.Add([this, task_id, key, optimizer_bytes, room, resident, daemon = daemon_,
                      checkpoints = checkpoints_, loop = loop_,
                      before = options_.before_state_restore] {
    if (before) before(task_id);
    auto state =
        std::make_shared<absl::StatusOr<std::unique_ptr<TrainingState>>>(TrainingState::Begin(
            daemon, checkpoints.get(), task_id, key, optimizer_bytes, room, resident));
    loop->Post([this, task_id, state] {
      loop_role_.AssertHeld();
      RestoreEnded(task_id, std::move(*state));
    });
  });
}

void GpuScheduler::RestoreEnded(uint64_t task_id,
                                absl::StatusOr<std::unique_ptr<TrainingState>> state) {
  if (running_ == nullptr || running_->task_id != task_id || !running_->restoring) {
    // Every run whose state is being restored holds the GPU until this end; should one not,
    // its state still goes off the loop.
    Event(base::LogLevel::kWarn, "state_restore_orphaned").Field("task", task_id);
    checkpointing_.Add([orphan = std::make_shared<decltype(state)>(std::move(state))]() mutable {
      orphan.reset();
    });
    return;
  }
  running_->restoring = false;
  absl::Status restored = state.status();
  if (restored.ok()) running_->training = std::move(*state);
  Event(base::LogLevel::kInfo, "task_state_restored")
      .Field("task", task_id)
      .Field("ok", restored.ok())
      .Field("resident", restored.ok() && running_->training->restored_resident())
      .FieldMs("after_placed_ms", absl::Now() - running_->placed_at);
  if (running_->answered != nullptr) {
    // Abandoned while its state was copied: answered now, or when its copy ends.
    std::unique_ptr<Running> run = std::move(running_);
    std::unique_ptr<RunResult> result = std::move(run->answered);
    HoldOrComplete(std::move(run), std::move(*result));
    return;
  }
  if (!restored.ok()) {
    AbandonUnrun(absl::Status(restored.code(), absl::StrCat("task ", task_id,
                                                            ": its optimizer state could not be "
                                                            "restored: ",
                                                            restored.message())));
    return;
  }
  if (running_->stop_sent) {
    // Told to stop (preempted, cancelled, its bubble ended, shutdown) before its Run: it ends as
    // a run stopped before its first iteration, and EndTraining saves its state (unchanged) for
    // its resume or drops it, as for any stopped run.
    std::unique_ptr<Running> run = std::move(running_);
    RunResult result = Unrun(*run, absl::OkStatus());
    const TaskRecord& record = tasks_table_.at(task_id);
    result.outcome.stopped_early = true;
    result.outcome.paused_at = absl::Now();
    result.outcome.iterations_done =
        record.spec.fill ? record.spec.fill->first_iteration : record.resume_iteration;
    HoldOrComplete(std::move(run), std::move(result));
    return;
  }
  SendHeldRun();
}

GpuScheduler::RunResult GpuScheduler::Unrun(const Running& run, absl::Status why) {
  RunResult result;
  result.slot = run.slot;
  result.status = std::move(why);
  result.ran = false;
  result.outcome.task_id = run.task_id;
  result.outcome.timeline = run.timeline;
  result.outcome.timeline.result_ns = base::MonotonicNowNs();
  result.outputs = std::vector<proto::HostTensor>();
  return result;
}

void GpuScheduler::HoldOrComplete(std::unique_ptr<Running> run, RunResult result,
                                  std::unique_ptr<Running>* holder) {
  run->awaiting_inputs = false;
  if (run->restoring || (run->transmission != nullptr && !run->transmission->finished())) {
    // The worker is done with the run (it answered, or it was never sent its Run: a Prepare only
    // set its gate), but the copy engine has not retired the copy yet (on the host backend its
    // observer often lags the worker), or the state's restore is still in flight. The answer
    // waits for the copy's end (CopyEnded) and the restore's (RestoreEnded) rather than go out
    // without its phases (or with a copy that then fails): the switch's timeline is the headline
    // figure. The loop does not wait; the copy engine bounds the copy (a stall ends it, a lost
    // device fails it). The GPU stays held, with no slot: the worker is idle, and its death or a
    // message of it no longer concerns this run (nothing to stop or kill: EnforceStop,
    // StopRunning and MaybePreempt leave it alone).
    Event(base::LogLevel::kInfo, "answer_waits_for_copy")
        .Field("task", run->task_id)
        .Field("slot", run->slot);
    run->slot = -1;
    run->stop_sent = true;
    run->answered = std::make_unique<RunResult>(std::move(result));
    *(holder != nullptr ? holder : &running_) = std::move(run);
    return;
  }
  CompleteRun(std::move(run), std::move(result));
}

void GpuScheduler::AbandonUnrun(absl::Status why) {
  std::unique_ptr<Running> run = std::move(running_);
  RunResult result = Unrun(*run, std::move(why));
  Event(base::LogLevel::kInfo, "task_abandoned_unrun")
      .Field("task", run->task_id)
      .Field("slot", run->slot)
      .Field("error", result.status);
  HoldOrComplete(std::move(run), std::move(result));
}

void GpuScheduler::YieldUnrun(uint64_t to_task) {
  std::unique_ptr<Running> run = std::move(running_);
  const absl::Duration held = absl::Now() - run->placed_at;
  TaskRecord& record = tasks_table_.at(run->task_id);
  record.inputs_yielded = true;
  Event(base::LogLevel::kInfo, "task_yields_gpu")
      .Field("task", run->task_id)
      .Field("model", record.spec.model)
      .Field("slot", run->slot)
      .FieldMs("held_ms", held)
      .Field("to_task", to_task)
      .Field("reason", "inputs still arriving");
  RunResult result = Unrun(*run, absl::OkStatus());
  result.requeue = true;
  HoldOrComplete(std::move(run), std::move(result));
}

bool GpuScheduler::InputsArriving(uint64_t id) const {
  loop_role_.AssertHeld();
  const TaskRecord* record = tasks_table_.Find(id);
  return record != nullptr && record->spec.inputs_arrival != nullptr &&
         !record->spec.inputs_arrival->ended().has_value();
}

absl::Time GpuScheduler::InputsHoldEnds() const {
  if (running_ == nullptr || !running_->awaiting_inputs || running_->stop_sent) {
    return absl::InfiniteFuture();
  }
  const TaskTicket* ready =
      queue_.PeekIf([this](const TaskTicket& t) { return !InputsArriving(t.id); });
  if (ready == nullptr) return absl::InfiniteFuture();
  // A task that yielded once holds the GPU only while nothing else can run.
  const TaskRecord* record = tasks_table_.Find(running_->task_id);
  return running_->placed_at + (record != nullptr && record->inputs_yielded ? absl::ZeroDuration()
                                                                            : options_.inputs_hold);
}

absl::Status GpuScheduler::SendRun(Running& run, int slot, const TaskSpec& spec, uint32_t batch) {
  RunState state;
  state.first_iteration =
      spec.fill ? spec.fill->first_iteration : tasks_table_.at(run.task_id).resume_iteration;
  if (run.training != nullptr) {
    state.optimizer_offset = run.training->optimizer_offset();
    state.optimizer_bytes = run.training->optimizer_bytes();
  }
  flatbuffers::FlatBufferBuilder b;
  BuildRun(b, run.task_id, spec, batch, state);
  PSWITCH_RETURN_IF_ERROR(pool_->SendRun(slot, run.task_id, b, spec.regions));
  run.slot = slot;
  tasks_.SetState(run.task_id,
                  run.transmission && !run.copied ? TaskState::kSwitching : TaskState::kRunning,
                  state.first_iteration, pool_->pid(slot));
  return absl::OkStatus();
}

void GpuScheduler::OnProgress(int slot, uint64_t task, uint32_t iterations) {
  loop_role_.AssertHeld();  // WorkerPool calls its Listener on the loop
  if (running_ == nullptr || running_->slot != slot || running_->task_id != task) return;
  tasks_.Progress(task, iterations);
}

GpuScheduler::RunResult GpuScheduler::ReadRunDone(int slot, const SwitchTimeline& placed,
                                                  const proto::RunDone& done) {
  RunResult result;
  result.slot = slot;
  result.status = done.error() != nullptr ? proto::FromWireError(done.error()) : absl::OkStatus();
  TaskOutcome& outcome = result.outcome;
  outcome.task_id = done.task_id();
  outcome.iterations_done = done.iterations_done();
  outcome.loss = done.loss();
  outcome.stopped_early = done.stopped_early();
  outcome.paused_at = absl::Now();
  outcome.fill_step_time = absl::Nanoseconds(done.step_ns());
  outcome.fill_steps = done.steps();
  outcome.fill_predicted_step = absl::Nanoseconds(done.last_step_ns());
  outcome.fill_step_overran = done.fill_step_overran();
  outcome.timeline = placed;
  // The answer's time is when the worker's came, however long its copy's end takes after it.
  outcome.timeline.result_ns = base::MonotonicNowNs();
  outcome.timeline.first_layer_start_ns = done.first_layer_start_ns();
  outcome.timeline.first_layer_done_ns = done.first_layer_done_ns();
  if (const auto* gates = done.group_gates_ns(); gates != nullptr) {
    // The worker sends at most kMaxStreamMarks; more would be a broken worker.
    for (size_t g = 0; g < std::min<size_t>(gates->size(), gpu::kMaxStreamMarks); ++g) {
      outcome.timeline.group_gates_ns.push_back(gates->Get(static_cast<flatbuffers::uoffset_t>(g)));
    }
  }
  result.outputs = proto::FromWireTensors(done.outputs());
  return result;
}

void GpuScheduler::OnRunDone(int slot, const proto::RunDone& done) {
  loop_role_.AssertHeld();  // WorkerPool calls its Listener on the loop
  if (next_ != nullptr && next_->slot == slot && next_->task_id == done.task_id()) {
    // The task placed ahead finished before the old tenant stopped: answered now, or at its
    // copy's end (CopyEnded), the GPU still the old tenant's in the meantime.
    std::unique_ptr<Running> run = std::move(next_);
    // The old tenant may have answered already (its own answer waiting for its copy's end).
    NoteOldStopped(run->timeline);
    RunResult result = ReadRunDone(slot, run->timeline, done);
    HoldOrComplete(std::move(run), std::move(result), &next_);
    return;
  }
  if (running_ == nullptr || running_->slot != slot || running_->task_id != done.task_id()) return;
  std::unique_ptr<Running> run = std::move(running_);
  RunResult result = ReadRunDone(slot, run->timeline, done);
  // What the run did stays in the task's status however it ends (a cancel's error says it too).
  if (tasks_table_.at(run->task_id).spec.kind == TaskKind::kTraining) {
    tasks_.Progress(run->task_id, result.outcome.iterations_done);
  }
  stop_deadline_.Met(run->task_id);
  if (run->stop_sent_ns != 0) {
    // How long the old tenant took to stop: a training step under way is cut at its next
    // layer, so this is about one layer's compute, not a whole iteration.
    last_stopped_ns_ = result.outcome.timeline.result_ns;
    Event(base::LogLevel::kInfo, "task_stopped")
        .Field("task", run->task_id)
        .Field("slot", slot)
        .Field("step_cut", done.step_cut())
        .Field("iterations_done", done.iterations_done())
        .Field("stop_ms", (last_stopped_ns_ - run->stop_sent_ns) / 1e6);
  }
  // The worker saw every group's flag; the copy may still be in flight.
  HoldOrComplete(std::move(run), std::move(result));
}

void GpuScheduler::CopyEnded(uint64_t task, uint32_t epoch, const absl::Status& copied) {
  loop_role_.AssertHeld();
  // A copy with no task (a preload, a move): nothing waits for it here; AfterEvent plans what
  // comes next (the next move, on an idle GPU).
  if (task == 0) return;
  // Only the end of the run's own copy concerns it (not an earlier placement's, late).
  const auto ours = [&](const Running* run) {
    return run != nullptr && run->task_id == task && run->transmission != nullptr &&
           run->transmission->epoch() == epoch;
  };
  if (ours(next_.get())) {
    if (copied.ok()) next_->copied = true;
    // Running: a failed copy fails it through its worker's epoch check. Answered already: now.
    if (next_->answered == nullptr) {
      if (copied.ok()) tasks_.MarkTransmitted(task);
      return;
    }
    std::unique_ptr<Running> run = std::move(next_);
    std::unique_ptr<RunResult> result = std::move(run->answered);
    CompleteRun(std::move(run), std::move(*result));
    return;
  }
  if (!ours(running_.get())) return;
  if (copied.ok()) {
    running_->copied = true;
    // A task still waiting for its inputs or state stays "switching" until its Run goes out.
    if (!running_->RunHeld()) tasks_.MarkTransmitted(task);
  }
  if (running_->RunHeld() && running_->answered == nullptr) {
    // Its switch failed: no Run will find its weights.
    if (!copied.ok()) AbandonUnrun(copied);
    return;
  }
  // A run still running, or one whose checkpoint is being written, has nothing waiting here;
  // one whose state's restore is still in flight is completed at its end (RestoreEnded).
  if (running_->answered == nullptr || running_->restoring) return;
  std::unique_ptr<Running> run = std::move(running_);
  std::unique_ptr<RunResult> result = std::move(run->answered);
  CompleteRun(std::move(run), std::move(*result));
}

void GpuScheduler::CompleteRun(std::unique_ptr<Running> run, RunResult result) {
  // Its optimizer state's room is free once the run ended, unless EndTraining takes it over
  // (saved or kept off the loop).
  absl::Cleanup free_state = [this, &run] {
    loop_role_.AssertHeld();  // runs where CompleteRun does
    FreeRunState(*run);
  };
  TaskRecord* record = tasks_table_.Find(run->task_id);
  if (record == nullptr) return;  // answered meanwhile
  const TaskSpec& spec = record->spec;
  // A fill run's bubble may have ended while its answer waited for the copy: nothing to kill.
  stop_deadline_.Met(run->task_id);
  absl::Status status = std::move(result.status);
  TaskOutcome& outcome = result.outcome;
  if (run->transmission != nullptr) {
    // A task abandoned before its Run never touched the weights: its failure is not theirs.
    absl::Status copied =
        switcher_->Completed(run->task_id, spec.model, *run->transmission,
                             status.ok() || !result.ran, outcome.timeline, outcome.switch_time);
    if (status.ok()) status = copied;
    if (copied.ok() && run->entry != nullptr && run->entry->stored != nullptr) {
      telemetry_->Switched(options_.gpu, MetricModel(spec), outcome.timeline,
                           run->entry->stored->total_bytes());
    }
  }
  if (result.requeue) {
    // It gave the GPU back before its Run, its inputs still arriving: back to the queue's head,
    // unless it was cancelled or missed its deadline meanwhile.
    if (std::optional<absl::Status> why = record->TakeStopReason()) {
      Finish(run->task_id, *why);
      return;
    }
    // Its bytes failed meanwhile (InputsEnded found it neither queued nor awaiting them): it
    // fails now, not when its turn comes again, which could be after every task ranked before it.
    if (std::optional<absl::Status> ended =
            spec.inputs_arrival ? spec.inputs_arrival->ended() : std::nullopt;
        ended && !ended->ok()) {
      Finish(run->task_id, InputsNeverArrived(run->task_id, *ended));
      return;
    }
    queue_.PushFront(TaskTicket{run->task_id, spec.model, spec.kind, spec.priority, spec.deadline});
    tasks_.SetState(run->task_id, TaskState::kQueued);
    return;
  }
  telemetry_->TaskRan(options_.gpu, run->task_id, MetricModel(spec), spec.kind, result.slot,
                      outcome.timeline, status.ok());
  // A training run that failed may have left its model's weights half updated in place: the
  // next task copies them again from the pinned store, which only a good run's checkpoint moves.
  if (!status.ok() && result.ran && spec.kind == TaskKind::kTraining) {
    switcher_->Untrust(spec.model);
  }
  // Compute on resident weights only: a switch's first task also waits for later groups' copies.
  if (status.ok() && spec.kind == TaskKind::kInference && run->transmission == nullptr &&
      outcome.timeline.first_layer_start_ns > 0 &&
      outcome.timeline.result_ns > outcome.timeline.first_layer_start_ns) {
    switcher_->ObserveCompute(spec.model, absl::Nanoseconds(outcome.timeline.result_ns -
                                                            outcome.timeline.first_layer_start_ns));
  }
  if (run->training != nullptr && EndTraining(*run, spec, outcome, status)) return;
  if (std::optional<absl::Status> why = record->TakeStopReason(); why && status.ok()) {
    status = *std::move(why);
  }
  if (!status.ok()) {
    Finish(run->task_id, status);
    return;
  }
  if (!result.outputs.ok()) {
    Finish(run->task_id, result.outputs.status());
    return;
  }
  // Placed outputs must lie where the task said; they reach the outcome as they are.
  if (absl::Status placed = CheckRunOutputs(*result.outputs, spec.outputs_to); !placed.ok()) {
    Finish(run->task_id, placed);
    return;
  }
  outcome.outputs = std::move(*result.outputs);
  Finish(run->task_id, outcome);
}

bool GpuScheduler::EndTraining(Running& run, const TaskSpec& spec, const TaskOutcome& outcome,
                               absl::Status& status) {
  const uint64_t id = run.task_id;
  const uint32_t first_iteration =
      spec.fill ? spec.fill->first_iteration : tasks_table_.at(id).resume_iteration;
  const std::string model = run.entry != nullptr ? run.entry->request.name : std::string();
  // Weights an earlier run of it left unsaved in the region are this run's to save as well.
  const bool owns_unsaved = !model.empty() && switcher_->UnsavedTask(model) == id;
  TrainingState::Ending ending;
  ending.run_ok = status.ok();
  ending.trained = outcome.iterations_done > first_iteration || owns_unsaved;
  ending.transmission = run.transmission;
  ending.region_offset = run.weights_offset;
  ending.model = run.entry != nullptr ? run.entry->stored : nullptr;
  // A run that resumes keeps its optimizer state: one stopped early, not for good. A cancel that
  // comes while the checkpoint runs still wins (TrainingSaved looks again).
  ending.keep_optimizer = status.ok() && !tasks_table_.at(id).stop_reason &&
                          outcome.stopped_early && outcome.iterations_done < spec.iterations;
  // A run stopped to resume is off the GPU while its state is saved: it waits for its turn
  // again, and says so (TrainingSaved requeues it, counting the preemption, once saved).
  if (ending.keep_optimizer && !spec.fill) {
    tasks_.SetState(id, TaskState::kQueued, outcome.iterations_done);
  }
  // With the cache on, a task that resumes leaves its weights in its region, trusted and
  // unsaved, for its next run: nothing is copied now, and they are written back only when that
  // region is evicted, another training task takes the model, or the task ends (WriteBack).
  // Only weights its switch's copy brought whole (or that were resident) in the region the cache
  // still gives the model: keep_optimizer needs the run's status OK, which covers its copy once
  // that has finished (the cache may not have seen the copy's end yet).
  const ResidentModel* region = model.empty() ? nullptr : switcher_->cache().Find(model);
  ending.weights_stay_resident = ending.keep_optimizer && !spec.fill && options_.weights_cache &&
                                 options_.keep_preempted_training && options_.sole_gpu &&
                                 region != nullptr && region->offset == run.weights_offset &&
                                 (run.transmission == nullptr || run.transmission->finished());
  // Its optimizer state stays in its room too (a fill job's next bubble may be on another GPU),
  // within the operator's budget for kept state (SchedulerOptions::resident_state_bytes).
  if (ending.keep_optimizer && !spec.fill && options_.weights_cache &&
      options_.keep_preempted_training && run.state.has_value()) {
    uint64_t kept_bytes = 0;
    for (const ResidentModel& r : switcher_->cache().List()) {
      if (r.state_of && r.unsaved_task != 0) kept_bytes += r.state_bytes;
    }
    const ResidentModel* room = switcher_->FindState(*run.state);
    // The states' own sizes count (what the operator sizes the cap by), not their rooms'.
    ending.state_stays_resident = room != nullptr &&
                                  room->state_bytes <= options_.resident_state_bytes &&
                                  kept_bytes <= options_.resident_state_bytes - room->state_bytes;
    // Kept from now on (End copies nothing of it), so a task waiting for room may have it
    // saved at once rather than take the weights first.
    if (ending.state_stays_resident) switcher_->KeepState(*run.state, id);
  }
  // A state that goes (saved to host memory, or dropped, once End is done) is held until then: a
  // reservation that needs its room waits for it rather than fail.
  if (run.state && !ending.state_stays_resident) switcher_->HoldState(*run.state);
  if (ending.weights_stay_resident && ending.trained) {
    switcher_->KeepUnsaved(model, id);
    tasks_table_.at(id).weights_unsaved = true;
    unsaved_owners_.insert(id);
  }
  // The GPU is free at once: the next task runs while the checkpoint reads the region off the
  // loop. The region is held meanwhile (no reservation takes it, no task runs on the model), an
  // unload of the model waits (FinishUnloads), and a cancel or deadline still finds the task
  // (being_checkpointed_). Its worker is idle: its death or a message of it no longer concerns it.
  // Weights that stay resident are not read: their region is not held.
  const std::string held_model = ending.weights_stay_resident ? std::string() : model;
  if (!held_model.empty()) switcher_->CheckpointReading(held_model);
  being_checkpointed_[id] = held_model;
  // What the job uses it owns (the training state, the entry keeping the model registered); the
  // loop only gets the result, dropped if the loop has ended by then.
  // (std::function needs a copyable job, hence shared_ptr; the job holds the only reference.)
  const bool state_stays = ending.state_stays_resident;
  checkpointing_.Add(
      [this, id, ending = std::move(ending), state = std::exchange(run.state, std::nullopt),
       state_stays, training = std::shared_ptr<TrainingState>(std::move(run.training)),
       entry = run.entry, loop = loop_, run_status = status, iterations = outcome.iterations_done,
       outcome, before = held_model.empty() ? nullptr : options_.before_checkpoint]() mutable {
        if (before) before(id);
        bool kept = false;
        absl::Status saved = training->End(ending, kept);
        const uint64_t generation = training->saved_generation();
        const std::string model = entry->request.name;
        training.reset();  // the lease and any staging buffer go here, off the loop
        entry.reset();
        absl::Status status = run_status.ok() ? saved : run_status;
        loop->Post([this, id, model, generation, trained = ending.trained, saved_ok = saved.ok(),
                    status = std::move(status), kept, iterations, state, state_stays,
                    outcome = std::move(outcome)]() mutable {
          loop_role_.AssertHeld();
          // Its optimizer state's room: kept for its resume (since EndTraining), or free (saved to
          // host memory, or dropped) now that nothing reads it. One kept but then not (its weights
          // could not be saved) that a save to make room reads is freed by that save's end.
          if (state) {
            if (!state_stays) switcher_->ReleaseState(*state);  // EndTraining's hold
            if (!(kept && state_stays) && !switcher_->StateHeld(*state)) {
              switcher_->FreeState(*state);
            }
          }
          if (auto it = being_checkpointed_.find(id); it != being_checkpointed_.end()) {
            if (!it->second.empty()) switcher_->CheckpointRead(it->second);
            being_checkpointed_.erase(it);
          }
          // The resident weights are what the pinned store now holds; or, when they could not be
          // saved after training, they are newer than it and must not be served or trained on.
          if (generation != 0) {
            switcher_->Checkpointed(model, generation);
          } else if (trained && !saved_ok) {
            switcher_->Untrust(model);
          }
          TrainingSaved(id, std::move(status), kept, iterations, std::move(outcome));
        });
      });
  return true;
}

void GpuScheduler::TrainingSaved(uint64_t task_id, absl::Status status, bool resumable,
                                 uint32_t iterations, TaskOutcome outcome) {
  TaskRecord* record = tasks_table_.Find(task_id);
  if (record == nullptr) return;  // answered meanwhile (shutdown)
  const TaskSpec& spec = record->spec;
  std::optional<absl::Status> stopped_for_good = record->TakeStopReason();
  // A fill run goes back to its fill manager, which brings it back at its next bubble.
  if (resumable && status.ok() && !stopped_for_good && !spec.fill) {
    record->resume_iteration = iterations;
    queue_.PushFront(TaskTicket{task_id, spec.model, spec.kind, spec.priority, spec.deadline});
    tasks_.Requeue(task_id, iterations);
    return;
  }
  if (stopped_for_good && status.ok()) {
    // Its weights stayed unsaved in the region (it was stopped to resume, then for good): saved
    // first, then answered.
    record->resume_iteration = iterations;
    if (EndOnceSaved(task_id, *stopped_for_good)) return;
    Finish(task_id, absl::Status(stopped_for_good->code(),
                                 absl::StrCat(stopped_for_good->message(), " after ", iterations,
                                              " iterations (weights saved)")));
    return;
  }
  if (!status.ok()) {
    Finish(task_id, status);
    return;
  }
  Finish(task_id, outcome);  // training answers carry no tensors
}

absl::StatusOr<uint64_t> GpuScheduler::Submit(TaskSpec spec, TaskCallback done) {
  if (unfinished_.fetch_add(1) >= options_.max_queued_tasks) {
    unfinished_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        "GPU ", options_.gpu, " already has ", options_.max_queued_tasks,
        " unfinished tasks (--max-queued-tasks); try again later"));
  }
  const uint64_t id = tasks_.Add(spec.model);
  absl::Time submitted = absl::Now();
  if (spec.arrival_ns == 0) spec.arrival_ns = base::MonotonicNowNs();
  Post([this, id, submitted, spec = std::move(spec), done = std::move(done)]() mutable {
    loop_role_.AssertHeld();
    TaskTicket ticket{id, spec.model, spec.kind, spec.priority, spec.deadline};
    // Latency is measured from submission, whatever happens in between.
    TaskCallback timed = [this, submitted,
                          done = std::move(done)](const absl::StatusOr<TaskOutcome>& outcome) {
      unfinished_.fetch_sub(1);
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
    std::shared_ptr<InputsArrival> arrival = spec.inputs_arrival;
    tasks_table_.Add(id, std::move(spec), std::move(timed));
    queue_.Push(ticket);
    if (arrival != nullptr) {
      // Its end comes on a front end's thread (or at once, if it already came): handled on the
      // loop. Dropped once the loop has ended; Finish unwatches.
      arrival->Watch([this, id, loop = loop_] { loop->Post([this, id] { InputsEnded(id); }); });
    }
  });
  return id;
}

void GpuScheduler::Finish(uint64_t task_id, const absl::StatusOr<TaskOutcome>& outcome) {
  std::optional<TaskRecord> record = tasks_table_.Take(task_id);
  tasks_.Finish(task_id, outcome.status(), outcome.ok() ? outcome->iterations_done : 0);
  unsaved_owners_.erase(task_id);
  checkpoints_->Drop(CheckpointKey::Task(task_id));
  if (!record) return;
  const TaskSpec& spec = record->spec;
  if (spec.kind == TaskKind::kTraining && options_.weights_cache) {
    // Its optimizer state, kept while it was preempted, goes (one being saved goes once
    // saved: StateWrittenBack). One a run still uses is that run's to free.
    const CheckpointKey state = CheckpointKey::Task(task_id);
    if (const ResidentModel* kept = switcher_->FindState(state);
        kept != nullptr && kept->unsaved_task == task_id && !switcher_->StateHeld(state)) {
      switcher_->FreeState(state);
    }
    // Ended while preempted (cancelled, past its deadline, shut down): the weights it trained
    // are saved as a stop saves them, unless its model is going.
    const bool unloading = std::any_of(unloads_.begin(), unloads_.end(),
                                       [&](const auto& u) { return u.first == spec.model; });
    if (record->weights_unsaved && !unloading && switcher_->UnsavedTask(spec.model) == task_id) {
      WriteBack(spec.model);
    }
  }
  if (spec.inputs_arrival) spec.inputs_arrival->Unwatch();
  const int64_t now_ns = base::MonotonicNowNs();
  telemetry_->TaskFinished(
      options_.gpu, MetricModel(spec), spec.kind,
      spec.started_ns == 0 ? absl::ZeroDuration() : absl::Nanoseconds(spec.started_ns - spec.arrival_ns),
      absl::Nanoseconds(now_ns - spec.arrival_ns), outcome.ok());
  record->done(outcome);
}

absl::StatusOr<TaskStatus> GpuScheduler::Query(uint64_t task_id) const {
  return tasks_.Query(task_id);
}

std::vector<TaskStatus> GpuScheduler::Recent(size_t limit) const { return tasks_.Recent(limit); }

std::pair<uint64_t, uint64_t> GpuScheduler::ArenaUse() const {
  uint64_t used = 0;
  for (const memdaemon::Lease& lease : daemon_->leases().List()) used += lease.bytes;
  return {daemon_->arena().size_bytes(), used};
}

void GpuScheduler::PublishResident() {
  std::set<std::string> resident;
  for (const ResidentModel& r : switcher_->cache().List()) {
    if (r.trusted && !r.state_of) resident.insert(r.model);
  }
  absl::MutexLock lock(&resident_mu_);
  if (resident != resident_) resident_ = std::move(resident);
}

std::set<std::string> GpuScheduler::ResidentModels() const {
  absl::MutexLock lock(&resident_mu_);
  return resident_;
}

absl::StatusOr<GpuSnapshot> GpuScheduler::Snapshot(absl::Duration timeout) const {
  // Shared with the loop's handler, which may run after this call has timed out.
  struct Pending {
    absl::Notification done;
    GpuSnapshot snapshot;
  };
  auto pending = std::make_shared<Pending>();
  loop_->Post([this, pending] {
    loop_role_.AssertHeld();
    GpuSnapshot& s = pending->snapshot;
    s.resident_model = switcher_->active_model();
    s.resident = switcher_->cache().List();
    std::erase_if(s.resident, [](const ResidentModel& r) { return !r.trusted; });
    s.cache = switcher_->cache().stats();
    s.cache_capacity_bytes = switcher_->cache().capacity_bytes();
    s.cache_enabled = switcher_->cache().enabled();
    for (int slot = 0; slot < pool_->size(); ++slot) {
      s.workers.push_back({slot, static_cast<int>(pool_->pid(slot)), pool_->StateName(slot),
                           slot == switcher_->active_slot()});
    }
    pending->done.Notify();
  });
  if (!pending->done.WaitForNotificationWithTimeout(timeout)) {
    // Also once the loop has ended: a posted handler is then dropped.
    return absl::UnavailableError(absl::StrCat("GPU ", options_.gpu, " did not answer within ",
                                               absl::FormatDuration(timeout)));
  }
  GpuSnapshot s = std::move(pending->snapshot);
  s.gpu = options_.gpu;
  s.queue_depth = unfinished_.load();
  std::tie(s.arena_bytes, s.arena_used_bytes) = ArenaUse();
  return s;
}

absl::Status GpuScheduler::Cancel(uint64_t task_id) {
  PSWITCH_ASSIGN_OR_RETURN(TaskStatus info, Query(task_id));
  if (info.state >= TaskState::kSucceeded) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", task_id, " already ", TaskStateName(info.state)));
  }
  Post([this, task_id] {
    loop_role_.AssertHeld();
    if (queue_.Remove(task_id)) {
      EndQueued(task_id, absl::CancelledError(absl::StrCat("task ", task_id, " cancelled")));
      return;
    }
    TaskRecord* record = tasks_table_.Find(task_id);
    // Placed ahead, its Run is out: a running inference batch finishes and is delivered, as
    // below.
    if (next_ != nullptr && next_->task_id == task_id) return;
    if (running_ != nullptr && running_->task_id == task_id && running_->awaiting_inputs) {
      // Placed, but not running yet: it gives the GPU back.
      AbandonUnrun(absl::CancelledError(absl::StrCat("task ", task_id, " cancelled")));
      return;
    }
    if (running_ != nullptr && running_->task_id == task_id && running_->answered != nullptr &&
        running_->answered->requeue) {
      // It yielded unrun and waits for its copy's end to go back to the queue: it goes nowhere.
      if (record != nullptr) {
        record->StopFor(absl::CancelledError(absl::StrCat("task ", task_id, " cancelled")));
      }
      return;
    }
    if (being_checkpointed_.contains(task_id) && record != nullptr) {
      // Stopped and being checkpointed: it is not requeued (TrainingSaved).
      record->StopFor(absl::CancelledError(absl::StrCat("task ", task_id, " cancelled")));
      return;
    }
    if (running_ != nullptr && running_->task_id == task_id && record != nullptr &&
        record->spec.kind == TaskKind::kTraining) {
      record->StopFor(absl::CancelledError(absl::StrCat("task ", task_id, " cancelled")));
      StopRunning();
    }
    // A running inference batch always finishes; its result is still delivered.
  });
  return absl::OkStatus();
}

}  // namespace pswitch::controller
