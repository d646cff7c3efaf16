// The scheduler with a task whose inputs are still arriving (issue 26, item 3: a raw TCP
// payload): its switch starts from the header, its Run waits for the inputs, inputs that never
// arrive fail it cleanly and give the GPU to the next task, and a trickling payload gives the GPU
// back to a ready task after its hold. And a training run's optimizer state is restored off the
// loop (issue 26, item 6): its Run waits for the restore, which blocks nothing else, and a
// preempted run resumes from exactly the state it left. Fake workers (the test plays their
// side), an in-process memdaemon on the host backend, a real catalog of tiny models.
#include "controller/gpu_scheduler.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/clock.h"
#include "base/log.h"
#include "controller/inputs_arrival.h"
#include "gtest/gtest.h"
#include "memdaemon/host_test_daemon.h"
#include "models/model_inspection.h"
#include "proto/framing.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {

using registry::ModelCatalog;

namespace {

constexpr absl::Duration kWait = absl::Seconds(20);

// What every fake worker was sent and what every task was answered, for the test thread to wait
// on (the scheduler's loop writes both).
class Record {
 public:
  void Command(std::string line) {
    absl::MutexLock lock(&mu_);
    commands_.push_back(std::move(line));
  }
  // A Run's optimizer area and first iteration.
  struct RunState {
    uint64_t optimizer_offset = 0;
    uint64_t optimizer_bytes = 0;
    uint32_t first_iteration = 0;
  };
  void Run(uint64_t task, RunState state) {
    absl::MutexLock lock(&mu_);
    runs_[task] = state;
  }
  // Where the last Prepare of `model` bound its weights (arena offset; nullopt: never).
  void Prepared(const std::string& model, uint64_t offset) {
    absl::MutexLock lock(&mu_);
    prepared_at_[model] = offset;
  }
  std::optional<uint64_t> PreparedAt(const std::string& model) {
    absl::MutexLock lock(&mu_);
    auto it = prepared_at_.find(model);
    return it == prepared_at_.end() ? std::nullopt : std::optional<uint64_t>(it->second);
  }
  RunState LastRun(uint64_t task) {
    absl::MutexLock lock(&mu_);
    return runs_[task];
  }
  void Answer(uint64_t task, absl::StatusOr<TaskOutcome> outcome) {
    absl::MutexLock lock(&mu_);
    answers_.emplace(task, std::move(outcome));
  }
  // Whether `count` commands starting with `prefix` were sent within `timeout`.
  bool AwaitCommand(const std::string& prefix, absl::Duration timeout, int count = 1) {
    absl::MutexLock lock(&mu_);
    auto sent = [&] {
      int n = 0;
      for (const std::string& c : commands_) n += absl::StartsWith(c, prefix) ? 1 : 0;
      return n >= count;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&sent), timeout);
  }
  bool Sent(const std::string& prefix) { return AwaitCommand(prefix, absl::ZeroDuration()); }
  // Task `task`'s answer, once it came (within `timeout`); Unknown when none did.
  absl::StatusOr<TaskOutcome> AwaitAnswer(uint64_t task, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto answered = [&] { return answers_.contains(task); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&answered), timeout)) {
      return absl::UnknownError(absl::StrCat("task ", task, " was not answered"));
    }
    return answers_.at(task);
  }
  // The slot of the last command starting with `prefix` (-1: none).
  int LastSlot(const std::string& prefix) {
    absl::MutexLock lock(&mu_);
    for (auto it = commands_.rbegin(); it != commands_.rend(); ++it) {
      if (!absl::StartsWith(*it, prefix)) continue;
      const size_t at = it->rfind("slot ");
      return at == std::string::npos ? -1 : std::stoi(it->substr(at + 5));
    }
    return -1;
  }
  std::string Commands() {
    absl::MutexLock lock(&mu_);
    std::string all;
    for (const std::string& c : commands_) absl::StrAppend(&all, c, "\n");
    return all;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> commands_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::StatusOr<TaskOutcome>> answers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, RunState> runs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> prepared_at_ ABSL_GUARDED_BY(mu_);
};

// A worker that is only its commands: each is recorded as "<kind> <slot> <details>"; the test
// plays its side (Ready, Loaded, RunDone) through the pool's handler.
class ScriptedWorker : public WorkerLink {
 public:
  ScriptedWorker(int slot, WorkerProcess::EventHandler handler, Record* record)
      : slot_(slot), handler_(std::move(handler)), record_(record) {}
  absl::Status Send(const flatbuffers::FlatBufferBuilder& command) override {
    return SendWithFd(command, -1);
  }
  absl::Status SendWithFd(const flatbuffers::FlatBufferBuilder& command, int) override {
    auto* c = flatbuffers::GetRoot<proto::WorkerCommand>(command.GetBufferPointer());
    std::string line = absl::StrCat(proto::EnumNameWorkerCommandBody(c->body_type()), " ");
    if (auto* load = c->body_as_LoadModel()) absl::StrAppend(&line, load->name()->str(), " ");
    if (auto* prepare = c->body_as_Prepare()) {
      absl::StrAppend(&line, prepare->model()->str(), " ");
      record_->Prepared(prepare->model()->str(), prepare->weights_offset());
    }
    if (auto* run = c->body_as_Run()) {
      absl::StrAppend(&line, run->task_id(), " ");
      record_->Run(run->task_id(), {run->optimizer_state_offset(), run->optimizer_state_bytes(),
                                    run->first_iteration()});
    }
    absl::StrAppend(&line, "slot ", slot_);
    record_->Command(std::move(line));
    return absl::OkStatus();
  }
  pid_t pid() const override { return 1000 + slot_; }
  void Kill() override { handler_(0, absl::UnavailableError("killed")); }
  // The process ends on its own (a crash): its death reaches the scheduler as the pool's would.
  void Die(absl::string_view how) { handler_(0, absl::UnavailableError(how)); }

  void Ready() {
    flatbuffers::FlatBufferBuilder b;
    auto body = proto::CreateWorkerReady(b, 0, static_cast<uint32_t>(slot_));
    proto::Finish(
        b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::WorkerReady, body.Union()));
    Emit(b);
  }
  void Loaded(const std::string& model) {
    flatbuffers::FlatBufferBuilder b;
    auto body = proto::CreateModelLoaded(b, b.CreateString(model), 0);
    proto::Finish(
        b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::ModelLoaded, body.Union()));
    Emit(b);
  }
  void RunDone(uint64_t task, uint32_t iterations_done = 0, bool stopped_early = false) {
    flatbuffers::FlatBufferBuilder b;
    auto body = proto::CreateRunDone(b, task, 0, iterations_done, stopped_early);
    proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::RunDone, body.Union()));
    Emit(b);
  }

 private:
  void Emit(const flatbuffers::FlatBufferBuilder& b) {
    handler_(0, std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()));
  }
  const int slot_;
  WorkerProcess::EventHandler handler_;
  Record* const record_;
};

class InputsArrivingTest : public ::testing::Test {
 protected:
  static constexpr int kWorkers = 2;

  void SetUp() override {
    auto daemon = memdaemon::HostTestDaemon();
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    catalog_ = std::make_unique<ModelCatalog>(daemon_.get(), 16 << 20, models::InspectInProcess());
    for (const char* name : {"a", "b"}) {
      ASSERT_TRUE(catalog_->Register({name, "tiny_mlp", "", 1, "auto"}).ok());
    }
    SchedulerOptions options;
    options.workers = kWorkers;
    options.region_offset = 32 << 20;                 // clear of any lease
    options.region_bytes = 16 << 20;                  // the catalog's layout check's size
    options.worker_silence_timeout = absl::Hours(1);  // the scripted workers send no heartbeat
    options.inputs_hold = inputs_hold_;
    options.place_at_arrival = place_at_arrival_;
    options.stopping_silence_timeout = stopping_silence_;
    options.telemetry = telemetry_;
    options.resident_state_bytes = resident_state_bytes_;
    options.policy = policy_;
    // Room for one model's weights only (and, with state_room_, one training run's optimizer
    // state): each change of model evicts the other.
    if (one_model_cache_) {
      const registry::CatalogEntry& a = *catalog_->Find("a").value();
      options.weights_cache_bytes =
          WeightsCache::RegionBytes(a.stored->total_bytes()) +
          (state_room_ ? WeightsCache::RegionBytes(a.optimizer_slot_bytes) : 0);
    }
    if (tweak_options_) tweak_options_(options);
    options.before_state_restore = [this](uint64_t) {
      absl::MutexLock lock(&gate_mu_);
      gate_mu_.Await(absl::Condition(&restores_open_));
    };
    options.before_checkpoint = [this](uint64_t) {
      absl::MutexLock lock(&gate_mu_);
      gate_mu_.Await(absl::Condition(&checkpoints_open_));
    };
    options.launch =
        [this](uint32_t slot,
               WorkerProcess::EventHandler handler) -> absl::StatusOr<std::unique_ptr<WorkerLink>> {
      auto worker =
          std::make_unique<ScriptedWorker>(static_cast<int>(slot), std::move(handler), &record_);
      absl::MutexLock lock(&workers_mu_);
      workers_[static_cast<int>(slot)] = worker.get();
      return std::unique_ptr<WorkerLink>(std::move(worker));
    };
    auto scheduler = GpuScheduler::Start(options, daemon_.get(), catalog_.get());
    ASSERT_TRUE(scheduler.ok()) << scheduler.status();
    scheduler_ = std::move(*scheduler);
    {
      absl::MutexLock lock(&workers_mu_);
      auto launched = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(workers_mu_) {
        return workers_.size() == kWorkers;
      };
      ASSERT_TRUE(workers_mu_.AwaitWithTimeout(absl::Condition(&launched), kWait));
    }
    // Each worker announces itself, is told to load every model, and does.
    for (int slot = 0; slot < kWorkers; ++slot) {
      Worker(slot)->Ready();
      for (const char* model : {"a", "b"}) {
        ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("LoadModel ", model, " slot ", slot), kWait))
            << record_.Commands();
        Worker(slot)->Loaded(model);
      }
    }
    ASSERT_TRUE(scheduler_->AwaitWorkersReady(kWait));
  }
  void TearDown() override {
    OpenRestores();  // a restore still held must end for the scheduler to shut down
    OpenCheckpoints();
    scheduler_.reset();
  }
  // Restores of optimizer state wait (off the loop) until OpenRestores.
  void HoldRestores() {
    absl::MutexLock lock(&gate_mu_);
    restores_open_ = false;
  }
  void OpenRestores() {
    absl::MutexLock lock(&gate_mu_);
    restores_open_ = true;
  }
  // Checkpoints of stopped training runs wait (off the loop) until OpenCheckpoints.
  void HoldCheckpoints() {
    absl::MutexLock lock(&gate_mu_);
    checkpoints_open_ = false;
  }
  void OpenCheckpoints() {
    absl::MutexLock lock(&gate_mu_);
    checkpoints_open_ = true;
  }
  // A training task of `model` for `iterations` (SGD with momentum: one slot of state).
  // A task's id once Submit returned it: an answer that comes first (a task refused as it
  // starts, on the loop, before the submitting thread stored the id) waits for it, bounded.
  struct PendingId {
    std::atomic<uint64_t> id{0};
    absl::Notification set;
    uint64_t Get() {
      set.WaitForNotificationWithTimeout(kWait);
      return id.load();
    }
    void Set(uint64_t value) {
      id.store(value);
      set.Notify();
    }
  };
  uint64_t SubmitTraining(const std::string& model, uint32_t iterations, int priority = 0,
                          absl::Time expires = absl::InfiniteFuture(),
                          api::TrainerOptions trainer = {}) {
    TaskSpec spec;
    spec.model = model;
    spec.kind = TaskKind::kTraining;
    spec.trainer = trainer;
    spec.iterations = iterations;
    spec.priority = priority;
    spec.expires = expires;
    auto id = std::make_shared<PendingId>();
    absl::StatusOr<uint64_t> task =
        scheduler_->Submit(std::move(spec), [this, id](const absl::StatusOr<TaskOutcome>& outcome) {
          record_.Answer(id->Get(), outcome);
        });
    EXPECT_TRUE(task.ok()) << task.status();
    id->Set(task.ok() ? *task : 0);
    return task.ok() ? *task : 0;
  }
  // Training runs' optimizer states in the weights pool (a run's, or kept for a preempted task).
  size_t OptimizerStates() const {
    absl::StatusOr<GpuSnapshot> s = scheduler_->Snapshot(kWait);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->cache.states : SIZE_MAX;
  }

  ScriptedWorker* Worker(int slot) {
    absl::MutexLock lock(&workers_mu_);
    return workers_.at(slot);
  }
  // An inference of `model` whose inputs are still arriving when `arrival` is set.
  uint64_t Submit(const std::string& model, std::shared_ptr<InputsArrival> arrival = nullptr) {
    TaskSpec spec;
    spec.model = model;
    proto::HostTensor input;
    input.name = "input";
    input.dtype = proto::DType::F32;
    input.shape = {1, 4};
    input.data.assign(16, 0);
    spec.inputs.push_back(std::move(input));
    spec.inputs_arrival = std::move(arrival);
    auto id = std::make_shared<PendingId>();
    absl::StatusOr<uint64_t> task =
        scheduler_->Submit(std::move(spec), [this, id](const absl::StatusOr<TaskOutcome>& outcome) {
          record_.Answer(outcome.ok() ? outcome->task_id : id->Get(), outcome);
        });
    EXPECT_TRUE(task.ok()) << task.status();
    id->Set(task.ok() ? *task : 0);
    return task.ok() ? *task : 0;
  }
  // The slot a command starting with `prefix` went to (-1: none did).
  int SlotOf(const std::string& prefix) {
    for (int slot = 0; slot < kWorkers; ++slot) {
      if (record_.Sent(absl::StrCat(prefix, "slot ", slot))) return slot;
    }
    return -1;
  }
  // Cancels training task `task`, running, has its worker stop after `iterations`, and expects
  // it answered Cancelled.
  void CancelRunningTraining(uint64_t task, uint32_t iterations) {
    ASSERT_TRUE(scheduler_->Cancel(task).ok());
    Worker(record_.LastSlot(absl::StrCat("Run ", task, " ")))->RunDone(task, iterations, true);
    EXPECT_EQ(record_.AwaitAnswer(task, kWait).status().code(), absl::StatusCode::kCancelled);
  }
  // Every event posted before this call has been handled.
  void Settle() { ASSERT_TRUE(scheduler_->Snapshot(kWait).ok()); }
  // `model`'s region in the cache, as the loop sees it; nullopt when not resident.
  std::optional<ResidentModel> RegionOf(const std::string& model) {
    absl::StatusOr<GpuSnapshot> s = scheduler_->Snapshot(kWait);
    if (!s.ok()) return std::nullopt;
    for (const ResidentModel& r : s->resident) {
      if (r.model == model && r.trusted) return r;
    }
    return std::nullopt;
  }
  // `model`'s region once its copy has ended (a worker trains only on weights that landed);
  // nullopt when it does not within kWait.
  std::optional<ResidentModel> CopiedRegionOf(const std::string& model) {
    std::optional<ResidentModel> r;
    if (!Eventually([&] {
          r = RegionOf(model);
          return r && !r->copying;
        })) {
      return std::nullopt;
    }
    return r;
  }
  // Whether `done` comes true within kWait (work off the loop: a lease dropped, a write-back).
  static bool Eventually(const std::function<bool()>& done) {
    const absl::Time until = absl::Now() + kWait;
    while (!done()) {
      if (absl::Now() > until) return false;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }

  // Long by default: a task waiting for its inputs keeps the GPU for these tests' whole length.
  absl::Duration inputs_hold_ = absl::Hours(1);
  bool place_at_arrival_ = true;
  // The scripted workers send no heartbeats: only a test about silence makes this short.
  absl::Duration stopping_silence_ = absl::Hours(1);
  bool one_model_cache_ = false;
  bool state_room_ = false;
  uint64_t resident_state_bytes_ = UINT64_MAX;
  Policy policy_ = Policy::kFcfs;
  // Runs in SetUp once "a" and "b" are registered, before the scheduler starts.
  std::function<void(SchedulerOptions&)> tweak_options_;
  std::shared_ptr<Telemetry> telemetry_ = std::make_shared<Telemetry>();
  absl::Mutex gate_mu_;
  bool restores_open_ ABSL_GUARDED_BY(gate_mu_) = true;
  bool checkpoints_open_ ABSL_GUARDED_BY(gate_mu_) = true;
  Record record_;
  std::unique_ptr<memdaemon::MemDaemon> daemon_;
  std::unique_ptr<ModelCatalog> catalog_;
  absl::Mutex workers_mu_;
  std::map<int, ScriptedWorker*> workers_ ABSL_GUARDED_BY(workers_mu_);
  std::unique_ptr<GpuScheduler> scheduler_;
};

TEST_F(InputsArrivingTest, TheSwitchStartsBeforeTheInputsArriveAndTheRunWaitsForThem) {
  auto arrival = std::make_shared<InputsArrival>();
  const uint64_t task = Submit("a", arrival);
  // Placed and switched in: the worker got its Prepare, the model's copy started.
  ASSERT_TRUE(record_.AwaitCommand("Prepare a ", kWait)) << record_.Commands();
  const int slot = SlotOf("Prepare a ");
  ASSERT_GE(slot, 0);
  Settle();
  auto status = scheduler_->Query(task);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state, TaskState::kSwitching);
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", task, " "))) << "ran before its inputs arrived";

  arrival->End(absl::OkStatus());
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", task, " slot ", slot), kWait))
      << "the Run goes to the worker that was prepared\n"
      << record_.Commands();
  Worker(slot)->RunDone(task);
  absl::StatusOr<TaskOutcome> outcome = record_.AwaitAnswer(task, kWait);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  const SwitchTimeline& t = outcome->timeline;
  EXPECT_GT(t.inputs_ns, t.placed_ns) << "the inputs' end is in the breakdown, after placement";
  EXPECT_GE(t.result_ns, t.inputs_ns);
}

TEST_F(InputsArrivingTest, InputsThatNeverArriveFailThePlacedTaskAndTheNextTaskRuns) {
  auto arrival = std::make_shared<InputsArrival>();
  const uint64_t stalled = Submit("a", arrival);
  ASSERT_TRUE(record_.AwaitCommand("Prepare a ", kWait)) << record_.Commands();
  const uint64_t next = Submit("b");
  Settle();
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", next, " ")))
      << "a task waiting for its inputs holds its place\n"
      << record_.Commands();

  arrival->End(absl::DeadlineExceededError("the frame deadline passed"));
  absl::StatusOr<TaskOutcome> failed = record_.AwaitAnswer(stalled, kWait);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDeadlineExceeded) << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "inputs never arrived"))
      << failed.status();
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", stalled, " ")));
  auto status = scheduler_->Query(stalled);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state, TaskState::kFailed);

  // The GPU is free: the next task is switched in and runs.
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", next, " "), kWait)) << record_.Commands();
  const int slot = SlotOf(absl::StrCat("Run ", next, " "));
  ASSERT_GE(slot, 0);
  Worker(slot)->RunDone(next);
  absl::StatusOr<TaskOutcome> ran = record_.AwaitAnswer(next, kWait);
  EXPECT_TRUE(ran.ok()) << ran.status();

  // The abandoned switch left "a" trusted in no worse state: a later task of it runs.
  const uint64_t again = Submit("a");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", again, " "), kWait)) << record_.Commands();
  Worker(SlotOf(absl::StrCat("Run ", again, " ")))->RunDone(again);
  EXPECT_TRUE(record_.AwaitAnswer(again, kWait).ok());
}

// A worker that dies while its placed task still waits for its inputs never ran it: the task
// goes back to the queue and runs on another worker once its bytes are in, not failed.
TEST_F(InputsArrivingTest, AWorkerThatDiesBeforeThePlacedTasksRunLeavesItQueuedNotFailed) {
  auto arrival = std::make_shared<InputsArrival>();
  const uint64_t task = Submit("a", arrival);
  ASSERT_TRUE(record_.AwaitCommand("Prepare a ", kWait)) << record_.Commands();
  const int dead = SlotOf("Prepare a ");
  ASSERT_GE(dead, 0);
  Worker(dead)->Die("killed by the test");
  const int other = 1 - dead;
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Prepare a slot ", other), kWait))
      << "placed again on the live worker\n"
      << record_.Commands();
  auto status = scheduler_->Query(task);
  ASSERT_TRUE(status.ok());
  EXPECT_NE(status->state, TaskState::kFailed);
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", task, " ")));

  arrival->End(absl::OkStatus());
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", task, " slot ", other), kWait))
      << record_.Commands();
  Worker(other)->RunDone(task);
  absl::StatusOr<TaskOutcome> outcome = record_.AwaitAnswer(task, kWait);
  EXPECT_TRUE(outcome.ok()) << outcome.status();
}

// Requeued once only: a placement that kills its worker must not kill one after another. The
// second death fails the task (unrun) and the GPU goes on to the next one.
TEST_F(InputsArrivingTest, ASecondWorkerDeathBeforeItsRunFailsTheTask) {
  auto arrival = std::make_shared<InputsArrival>();
  const uint64_t task = Submit("a", arrival);
  ASSERT_TRUE(record_.AwaitCommand("Prepare a ", kWait)) << record_.Commands();
  const int first = SlotOf("Prepare a ");
  ASSERT_GE(first, 0);
  const int second = 1 - first;
  Worker(first)->Die("killed by the test");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Prepare a slot ", second), kWait))
      << record_.Commands();
  Worker(second)->Die("killed by the test again");
  absl::StatusOr<TaskOutcome> outcome = record_.AwaitAnswer(task, kWait);
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kUnavailable) << outcome.status();
  EXPECT_TRUE(absl::StrContains(outcome.status().message(), "killed by the test again"))
      << outcome.status();
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", task, " ")));
  arrival->End(absl::OkStatus());  // too late: nothing runs it
  Settle();
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", task, " ")));
}

TEST_F(InputsArrivingTest, InputsThatNeverArriveFailAQueuedTaskWithoutASwitch) {
  const uint64_t running = Submit("a");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", running, " "), kWait));
  auto arrival = std::make_shared<InputsArrival>();
  const uint64_t queued = Submit("b", arrival);
  Settle();
  arrival->End(absl::UnavailableError("the client went away"));
  absl::StatusOr<TaskOutcome> failed = record_.AwaitAnswer(queued, kWait);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  Worker(SlotOf(absl::StrCat("Run ", running, " ")))->RunDone(running);
  EXPECT_TRUE(record_.AwaitAnswer(running, kWait).ok());
  Settle();
  EXPECT_FALSE(record_.Sent("Prepare b ")) << "no switch for inputs that will never come";
}

TEST_F(InputsArrivingTest, InputsAlreadyInWhenItsTurnComesRunAtOnce) {
  auto arrival = std::make_shared<InputsArrival>();
  arrival->End(absl::OkStatus());
  const uint64_t task = Submit("a", arrival);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", task, " "), kWait)) << record_.Commands();
  Worker(SlotOf(absl::StrCat("Run ", task, " ")))->RunDone(task);
  absl::StatusOr<TaskOutcome> outcome = record_.AwaitAnswer(task, kWait);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_GT(outcome->timeline.inputs_ns, 0);
  EXPECT_LE(outcome->timeline.inputs_ns, outcome->timeline.placed_ns);
}

// A client that trickles its payload holds the GPU only for the hold while another task could
// run: it yields unrun, the ready task runs, and the trickler runs once its bytes are in.
class InputsHoldTest : public InputsArrivingTest {
 protected:
  void SetUp() override {
    inputs_hold_ = absl::Milliseconds(50);
    base::SetLogSink(sink_);
    InputsArrivingTest::SetUp();
  }
  void TearDown() override {
    InputsArrivingTest::TearDown();
    base::SetLogSink(std::make_shared<base::FdLogSink>());
  }
  std::shared_ptr<base::MemoryLogSink> sink_ = std::make_shared<base::MemoryLogSink>();
};

TEST_F(InputsHoldTest, ATricklingTaskYieldsToAReadyTaskAfterItsHoldAndRunsOnceItsInputsAreIn) {
  auto arrival = std::make_shared<InputsArrival>();
  const uint64_t trickling = Submit("a", arrival);
  ASSERT_TRUE(record_.AwaitCommand("Prepare a ", kWait)) << record_.Commands();
  const absl::Time ready_submitted = absl::Now();
  const uint64_t ready = Submit("b");
  // The ready task runs while the trickler's bytes are still arriving, once its hold is over.
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", ready, " "), kWait)) << record_.Commands();
  EXPECT_GE(absl::Now() - ready_submitted, absl::Milliseconds(40)) << "the trickler kept its hold";
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", trickling, " ")));
  ASSERT_TRUE(sink_->AwaitEvent("task_yields_gpu",
                                {absl::StrCat("task=", trickling), absl::StrCat("to_task=", ready)},
                                kWait));
  EXPECT_NE(sink_->Events("task_yields_gpu")[0].find("held_ms="), std::string::npos);
  auto status = scheduler_->Query(trickling);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state, TaskState::kQueued) << "back in the queue, not failed";
  Worker(SlotOf(absl::StrCat("Run ", ready, " ")))->RunDone(ready);
  ASSERT_TRUE(record_.AwaitAnswer(ready, kWait).ok());
  Settle();
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", trickling, " "))) << "it ran without its inputs";

  // Its bytes come in: it is placed again and runs like any task.
  arrival->End(absl::OkStatus());
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", trickling, " "), kWait))
      << record_.Commands();
  Worker(SlotOf(absl::StrCat("Run ", trickling, " ")))->RunDone(trickling);
  absl::StatusOr<TaskOutcome> outcome = record_.AwaitAnswer(trickling, kWait);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(record_.AwaitAnswer(trickling, kWait)->task_id, trickling);
}

TEST_F(InputsHoldTest, WithNothingElseWaitingATricklingTaskKeepsTheGpu) {
  auto arrival = std::make_shared<InputsArrival>();
  const uint64_t trickling = Submit("a", arrival);
  ASSERT_TRUE(record_.AwaitCommand("Prepare a ", kWait)) << record_.Commands();
  absl::SleepFor(absl::Milliseconds(150));  // three holds: nothing waits, nothing yields
  Settle();
  EXPECT_TRUE(sink_->Events("task_yields_gpu").empty());
  arrival->End(absl::OkStatus());
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", trickling, " "), kWait));
  Worker(SlotOf(absl::StrCat("Run ", trickling, " ")))->RunDone(trickling);
  EXPECT_TRUE(record_.AwaitAnswer(trickling, kWait).ok());
}

TEST_F(InputsHoldTest, ACancelOfAYieldedTaskStillArrivingAnswersIt) {
  auto arrival = std::make_shared<InputsArrival>();
  const uint64_t trickling = Submit("a", arrival);
  ASSERT_TRUE(record_.AwaitCommand("Prepare a ", kWait)) << record_.Commands();
  const uint64_t ready = Submit("b");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", ready, " "), kWait)) << record_.Commands();
  ASSERT_TRUE(scheduler_->Cancel(trickling).ok());
  absl::StatusOr<TaskOutcome> cancelled = record_.AwaitAnswer(trickling, kWait);
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  Worker(SlotOf(absl::StrCat("Run ", ready, " ")))->RunDone(ready);
  EXPECT_TRUE(record_.AwaitAnswer(ready, kWait).ok());
  arrival->End(absl::OkStatus());
  Settle();
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", trickling, " ")));
}

// A task that yielded while its switch was still in flight (here: its optimizer state's
// restore, held) and whose bytes then never come is answered when that switch ends, not put back
// in the queue to wait behind every task ranked before it.
TEST_F(InputsHoldTest, AYieldedTaskWhoseInputsFailBeforeItsSwitchEndsIsAnsweredThen) {
  HoldRestores();
  auto arrival = std::make_shared<InputsArrival>();
  TaskSpec spec;
  spec.model = "a";
  spec.kind = TaskKind::kTraining;
  spec.iterations = 10;
  spec.inputs_arrival = arrival;
  auto id = std::make_shared<std::atomic<uint64_t>>(0);
  absl::StatusOr<uint64_t> trickling =
      scheduler_->Submit(std::move(spec), [this, id](const absl::StatusOr<TaskOutcome>& outcome) {
        record_.Answer(id->load(), outcome);
      });
  ASSERT_TRUE(trickling.ok()) << trickling.status();
  id->store(*trickling);
  ASSERT_TRUE(record_.AwaitCommand("Prepare a ", kWait)) << record_.Commands();
  const uint64_t ready = Submit("b");  // an inference: it ranks before the training task
  ASSERT_TRUE(sink_->AwaitEvent("task_yields_gpu", {absl::StrCat("task=", *trickling)}, kWait));
  arrival->End(absl::UnavailableError("the client went away"));
  Settle();
  OpenRestores();
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", ready, " "), kWait)) << record_.Commands();
  // Answered before the ready task ends: it did not go back to the queue behind it.
  absl::StatusOr<TaskOutcome> failed = record_.AwaitAnswer(*trickling, absl::Seconds(2));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "inputs never arrived"))
      << failed.status();
  Worker(SlotOf(absl::StrCat("Run ", ready, " ")))->RunDone(ready);
  EXPECT_TRUE(record_.AwaitAnswer(ready, kWait).ok());
  Settle();
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", *trickling, " ")));
  EXPECT_EQ(OptimizerStates(), 0u);
}

// With no room kept for resident optimizer state (--weights-cache=off does the same), a preempted
// run's state goes to host memory and comes back from there.
class StateThroughHostTest : public InputsArrivingTest {
 protected:
  StateThroughHostTest() { resident_state_bytes_ = 0; }
};

TEST_F(StateThroughHostTest,
       ASlowStateRestoreBlocksNothingAndAPreemptedRunResumesFromItsExactState) {
  ASSERT_GT(catalog_->Find("a").value()->optimizer_slot_bytes, 0u);
  HoldRestores();
  const uint64_t training = SubmitTraining("a", 10);
  ASSERT_TRUE(record_.AwaitCommand("Prepare a ", kWait)) << record_.Commands();
  // The restore is held off the loop: the loop still answers, and the Run waits.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(scheduler_->Snapshot(absl::Seconds(2)).ok());
  auto status = scheduler_->Query(training);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state, TaskState::kSwitching);
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", training, " ")))
      << "the Run went out before the state was restored";
  OpenRestores();
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait))
      << record_.Commands();
  const int slot = SlotOf(absl::StrCat("Run ", training, " "));
  const Record::RunState first = record_.LastRun(training);
  ASSERT_GT(first.optimizer_bytes, 0u);
  EXPECT_EQ(first.first_iteration, 0u);

  // The worker trains: the state changes in place. Then an inference preempts it.
  std::vector<std::byte> trained(first.optimizer_bytes);
  for (size_t i = 0; i < trained.size(); ++i) trained[i] = std::byte((i * 13 + 5) & 0xff);
  ASSERT_TRUE(daemon_->arena().CopyFromHost(first.optimizer_offset, trained).ok());
  const uint64_t inference = Submit("a");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Stop slot ", slot), kWait)) << record_.Commands();
  Worker(slot)->RunDone(training, 3, /*stopped_early=*/true);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " "), kWait))
      << record_.Commands();
  // The preempted run's state is saved (off the loop) and its area freed; scribble where it was.
  ASSERT_TRUE(Eventually([&] { return OptimizerStates() == 0; }));
  std::vector<std::byte> junk(first.optimizer_bytes, std::byte{0x5a});
  ASSERT_TRUE(daemon_->arena().CopyFromHost(first.optimizer_offset, junk).ok());
  HoldRestores();
  Worker(SlotOf(absl::StrCat("Run ", inference, " ")))->RunDone(inference);
  ASSERT_TRUE(record_.AwaitAnswer(inference, kWait).ok());

  // It resumes: its state is restored (off the loop again) before its Run, byte for byte.
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Prepare a slot ", slot), kWait, 3))
      << record_.Commands();
  ASSERT_TRUE(scheduler_->Snapshot(absl::Seconds(2)).ok());
  EXPECT_FALSE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), absl::ZeroDuration(), 2));
  OpenRestores();
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " slot ", slot), kWait, 2))
      << record_.Commands();
  const Record::RunState resumed = record_.LastRun(training);
  ASSERT_EQ(resumed.first_iteration, 3u) << record_.Commands();
  ASSERT_EQ(resumed.optimizer_bytes, first.optimizer_bytes);
  std::vector<std::byte> seen(resumed.optimizer_bytes);
  ASSERT_TRUE(daemon_->arena().CopyToHost(resumed.optimizer_offset, seen).ok());
  EXPECT_EQ(seen, trained) << "the resumed run does not train on the state it left";
  Worker(slot)->RunDone(training, 10);
  absl::StatusOr<TaskOutcome> done = record_.AwaitAnswer(training, kWait);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->iterations_done, 10u);
  Settle();
  EXPECT_EQ(OptimizerStates(), 0u);
}

TEST_F(InputsArrivingTest, ACancelDuringTheRestoreFreesNothingUnderItAndTheNextTaskRuns) {
  HoldRestores();
  const uint64_t training = SubmitTraining("a", 10);
  ASSERT_TRUE(record_.AwaitCommand("Prepare a ", kWait)) << record_.Commands();
  Settle();
  // Its room is taken at once (on the loop), the copy into it waits off the loop.
  EXPECT_EQ(OptimizerStates(), 1u);
  ASSERT_TRUE(scheduler_->Cancel(training).ok());
  const uint64_t next = Submit("b");
  Settle();
  // The GPU stays held while the restore is in flight: nothing may reuse what it writes. A task
  // placed ahead, apart from it (another worker, its own region), runs meanwhile.
  const int training_slot = record_.LastSlot("Prepare a ");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", next, " "), kWait)) << record_.Commands();
  const int next_slot = SlotOf(absl::StrCat("Run ", next, " "));
  EXPECT_NE(next_slot, training_slot);
  Worker(next_slot)->RunDone(next);
  EXPECT_TRUE(record_.AwaitAnswer(next, kWait).ok());
  EXPECT_EQ(record_.AwaitAnswer(training, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kUnknown)
      << "answered before its restore ended";
  EXPECT_EQ(OptimizerStates(), 1u) << "its room was freed under the restore";
  OpenRestores();
  absl::StatusOr<TaskOutcome> cancelled = record_.AwaitAnswer(training, kWait);
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", training, " ")));
  Settle();
  EXPECT_TRUE(Eventually([&] { return OptimizerStates() == 0; }))
      << "the cancelled run's room was freed after its restore";
}

// Placement at arrival (issue 29, item 4): an inference that preempts a training run is placed
// at once, on the standby worker and in a region of its own, its copy started and its Run sent
// while the old tenant is still stopping: nothing of it waits for that tenant's answer.
class PlaceAtArrivalTest : public InputsArrivingTest {};

TEST_F(PlaceAtArrivalTest, APreemptingInferenceRunsAndIsAnsweredWhileTheTrainingStops) {
  const uint64_t training = SubmitTraining("a", 1000);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait))
      << record_.Commands();
  const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
  const uint64_t inference = Submit("b");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Stop slot ", trainer), kWait))
      << record_.Commands();
  // Placed and sent its Run before the training answered: on the other worker, its copy under
  // way or done.
  const int standby = 1 - trainer;
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Prepare b slot ", standby), kWait))
      << record_.Commands();
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " slot ", standby), kWait))
      << record_.Commands();
  // It finishes and is answered while the training has still not answered its Stop.
  Worker(standby)->RunDone(inference);
  absl::StatusOr<TaskOutcome> done = record_.AwaitAnswer(inference, kWait);
  ASSERT_TRUE(done.ok()) << done.status();
  const SwitchTimeline& t = done->timeline;
  EXPECT_GT(t.stop_sent_ns, 0);
  EXPECT_GE(t.placed_ns, t.stop_sent_ns);
  EXPECT_EQ(t.old_stopped_ns, 0) << "answered before the old tenant stopped";
  EXPECT_GT(t.drained_ns, 0) << "no copy phases";
  absl::StatusOr<TaskStatus> still = scheduler_->Query(training);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->state, TaskState::kRunning) << "the training has not answered yet";
  // The training stops, and resumes where it stopped.
  Worker(trainer)->RunDone(training, 7, /*stopped_early=*/true);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait, 2))
      << record_.Commands();
  EXPECT_EQ(record_.LastRun(training).first_iteration, 7u);
  CancelRunningTraining(training, 8);
}

// Placed ahead, its Run out, an inference answers after the old tenant stopped as well: it is
// then the running task, and its breakdown has the old tenant's stop. A cancel meanwhile leaves
// it to finish, as a running inference batch is left.
TEST_F(PlaceAtArrivalTest, ATaskPlacedAheadThatOutlastsTheStopBecomesTheRunningOne) {
  const uint64_t training = SubmitTraining("a", 1000);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait));
  const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
  const uint64_t inference = Submit("b");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " slot ", 1 - trainer), kWait))
      << record_.Commands();
  ASSERT_TRUE(scheduler_->Cancel(inference).ok());
  Worker(trainer)->RunDone(training, 4, /*stopped_early=*/true);
  Settle();
  EXPECT_EQ(record_.AwaitAnswer(inference, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kUnknown)
      << "a running inference batch is not cut by a cancel";
  // The training waits for the inference, which holds the GPU now.
  EXPECT_FALSE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), absl::ZeroDuration(), 2));
  Worker(1 - trainer)->RunDone(inference);
  absl::StatusOr<TaskOutcome> done = record_.AwaitAnswer(inference, kWait);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_GE(done->timeline.old_stopped_ns, done->timeline.placed_ns);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait, 2))
      << record_.Commands();
  EXPECT_EQ(record_.LastRun(training).first_iteration, 4u);
  CancelRunningTraining(training, 5);
}

// Its Run went out: the death of its worker fails it, as a running task's does, and the training
// goes on once it has stopped.
TEST_F(PlaceAtArrivalTest, TheDeathOfTheWorkerItRunsAheadOnFailsItAndTheTrainingGoesOn) {
  const uint64_t training = SubmitTraining("a", 1000);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait));
  const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
  const uint64_t inference = Submit("b");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " slot ", 1 - trainer), kWait))
      << record_.Commands();
  Worker(1 - trainer)->Die("crashed");
  absl::StatusOr<TaskOutcome> failed = record_.AwaitAnswer(inference, kWait);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "crashed")) << failed.status();
  Worker(trainer)->RunDone(training, 2, /*stopped_early=*/true);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait, 2))
      << record_.Commands();
  EXPECT_EQ(record_.LastRun(training).first_iteration, 2u);
  CancelRunningTraining(training, 3);
}

// Issue 29 item 6: a preempted training task leaves its trained weights and its optimizer state
// where they are (its region, its arena area), unsaved: nothing is copied when it stops, an
// inference of the same model runs on those weights at once, and its next run resumes on them
// with no copy at all. They are saved only when it ends (or its region is evicted, below).
TEST_F(PlaceAtArrivalTest, APreemptedTrainingResumesOnItsResidentWeightsAndStateWithNoCopy) {
  auto sink = std::make_shared<base::MemoryLogSink>();
  base::SetLogSink(sink);
  HoldCheckpoints();  // a stop that waited for a checkpoint would hang here
  const uint64_t training = SubmitTraining("a", 1000);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait));
  const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
  const Record::RunState first = record_.LastRun(training);
  ASSERT_GT(first.optimizer_bytes, 0u);
  // The worker trains: weights and optimizer state change in place.
  std::optional<ResidentModel> region = CopiedRegionOf("a");
  ASSERT_TRUE(region.has_value());
  const memdaemon::StoredModel& stored = *catalog_->Find("a").value()->stored;
  const uint64_t weight_bytes = stored.total_bytes();
  std::vector<std::byte> weights(weight_bytes), state(first.optimizer_bytes);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = std::byte((i * 29 + 3) & 0xff);
  for (size_t i = 0; i < state.size(); ++i) state[i] = std::byte((i * 13 + 5) & 0xff);
  ASSERT_TRUE(daemon_->arena().CopyFromHost(region->offset, weights).ok());
  ASSERT_TRUE(daemon_->arena().CopyFromHost(first.optimizer_offset, state).ok());
  const uint64_t generation = stored.generation();

  const uint64_t inference = Submit("b");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Stop slot ", trainer), kWait));
  Worker(trainer)->RunDone(training, 5, /*stopped_early=*/true);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " "), kWait))
      << record_.Commands();
  absl::StatusOr<TaskStatus> waiting;
  ASSERT_TRUE(Eventually([&] {
    waiting = scheduler_->Query(training);
    return waiting.ok() && waiting->state == TaskState::kQueued;
  }));
  EXPECT_EQ(waiting->state, TaskState::kQueued);
  EXPECT_EQ(waiting->worker_pid, 0);
  EXPECT_EQ(waiting->iterations_done, 5u);
  // Nothing went back to the pinned store; the region says whose unsaved weights it holds.
  EXPECT_EQ(stored.generation(), generation);
  std::optional<ResidentModel> kept = RegionOf("a");
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->unsaved_task, training);
  EXPECT_EQ(kept->offset, region->offset);
  EXPECT_EQ(OptimizerStates(), 1u) << "the state stays in the arena";

  // An inference of the same model runs on them at once: a hit, no copy, no checkpoint.
  const uint64_t misses = scheduler_->Snapshot(kWait)->cache.misses;
  const uint64_t same_model = Submit("a");
  Worker(record_.LastSlot(absl::StrCat("Run ", inference, " ")))->RunDone(inference);
  ASSERT_TRUE(record_.AwaitAnswer(inference, kWait).ok());
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", same_model, " "), kWait))
      << record_.Commands();
  Worker(record_.LastSlot(absl::StrCat("Run ", same_model, " ")))->RunDone(same_model);
  ASSERT_TRUE(record_.AwaitAnswer(same_model, kWait).ok());

  // The training resumes on them: the same area, byte for byte, and nothing copied.
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait, 2))
      << record_.Commands();
  const Record::RunState resumed = record_.LastRun(training);
  EXPECT_EQ(resumed.first_iteration, 5u);
  EXPECT_EQ(resumed.optimizer_offset, first.optimizer_offset);
  std::vector<std::byte> seen_state(state.size()), seen_weights(weights.size());
  ASSERT_TRUE(daemon_->arena().CopyToHost(resumed.optimizer_offset, seen_state).ok());
  ASSERT_TRUE(daemon_->arena().CopyToHost(region->offset, seen_weights).ok());
  EXPECT_EQ(seen_state, state);
  EXPECT_EQ(seen_weights, weights);
  EXPECT_EQ(scheduler_->Snapshot(kWait)->cache.misses, misses);
  EXPECT_EQ(stored.generation(), generation);
  // Its area was the one kept, not a copy back from host memory into the same place.
  EXPECT_TRUE(sink->AwaitEvent("task_state_restored",
                               {absl::StrCat("task=", training), "resident=1"}, kWait));
  base::SetLogSink(std::make_shared<base::FdLogSink>());

  // It ends (cancelled): its weights are saved as any stop saves them, and then it is answered.
  ASSERT_TRUE(scheduler_->Cancel(training).ok());
  Worker(record_.LastSlot(absl::StrCat("Run ", training, " ")))->RunDone(training, 6, true);
  Settle();
  EXPECT_EQ(record_.AwaitAnswer(training, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kUnknown)
      << "answered before its weights were saved";
  OpenCheckpoints();
  EXPECT_EQ(record_.AwaitAnswer(training, kWait).status().code(), absl::StatusCode::kCancelled);
  EXPECT_GT(stored.generation(), generation);
  EXPECT_EQ(std::memcmp(stored.host_bytes(), weights.data(), weight_bytes), 0);
  EXPECT_EQ(RegionOf("a")->unsaved_task, 0u);
  EXPECT_TRUE(Eventually([&] { return OptimizerStates() == 0; }));
}

// A task whose unsaved weights were lost on the GPU (a worker died mid-run on the model) fails
// with DataLoss rather than resume from the older pinned weights.
TEST_F(PlaceAtArrivalTest, ATrainingWhoseUnsavedWeightsWereLostFailsRatherThanResume) {
  const uint64_t training = SubmitTraining("a", 1000);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait));
  const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
  const uint64_t inference = Submit("b");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Stop slot ", trainer), kWait));
  Worker(trainer)->RunDone(training, 5, /*stopped_early=*/true);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " "), kWait));
  // Its answer may wait for its copy's end: the weights are kept once it is handled.
  ASSERT_TRUE(Eventually([&] {
    std::optional<ResidentModel> r = RegionOf("a");
    return r && r->unsaved_task == training;
  }));
  // An idle worker's death (the trainer's, now idle) writes nothing: the weights stay.
  Worker(trainer)->Die("an idle worker crashed");
  Settle();
  ASSERT_TRUE(RegionOf("a").has_value());
  EXPECT_EQ(RegionOf("a")->unsaved_task, training);
  // A worker that dies mid-run on the model may have written them: they are gone.
  const uint64_t same_model = Submit("a");
  const int other = record_.LastSlot(absl::StrCat("Run ", inference, " "));
  Worker(other)->RunDone(inference);
  ASSERT_TRUE(record_.AwaitAnswer(inference, kWait).ok());
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", same_model, " "), kWait))
      << record_.Commands();
  Worker(record_.LastSlot(absl::StrCat("Run ", same_model, " ")))->Die("crashed mid-run");
  EXPECT_FALSE(record_.AwaitAnswer(same_model, kWait).ok());
  absl::StatusOr<TaskOutcome> lost = record_.AwaitAnswer(training, kWait);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kDataLoss) << lost.status();
  EXPECT_TRUE(absl::StrContains(lost.status().message(), "were lost")) << lost.status();
  EXPECT_FALSE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), absl::ZeroDuration(), 2))
      << "it resumed on weights that are not its own";
  EXPECT_TRUE(Eventually([&] { return OptimizerStates() == 0; }));
}

TEST_F(PlaceAtArrivalTest, ACancelWhileItsCheckpointIsWrittenEndsTheTrainingOnceWritten) {
  HoldCheckpoints();
  const uint64_t training = SubmitTraining("a", 1000);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait));
  const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
  const uint64_t inference = Submit("b");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Stop slot ", trainer), kWait));
  Worker(trainer)->RunDone(training, 5, /*stopped_early=*/true);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " "), kWait));
  ASSERT_TRUE(scheduler_->Cancel(training).ok());
  Settle();
  EXPECT_EQ(record_.AwaitAnswer(training, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kUnknown)
      << "answered before its checkpoint was written";
  OpenCheckpoints();
  absl::StatusOr<TaskOutcome> cancelled = record_.AwaitAnswer(training, kWait);
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  EXPECT_TRUE(absl::StrContains(cancelled.status().message(), "after 5 iterations"))
      << cancelled.status();
  Worker(record_.LastSlot(absl::StrCat("Run ", inference, " ")))->RunDone(inference);
  ASSERT_TRUE(record_.AwaitAnswer(inference, kWait).ok());
  Settle();
  EXPECT_FALSE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), absl::ZeroDuration(), 2))
      << "a cancelled run was requeued";
}

// A model registered with pin_resident is copied in once the workers loaded it, with no task:
// its first task copies nothing (issue 29: pinned at registration, not at its first task).
TEST_F(InputsArrivingTest, AModelPinnedAtRegistrationIsResidentBeforeItsFirstTask) {
  registry::ModelRequest request{"pinned", "tiny_mlp", "", 1, "auto"};
  request.pin_resident = true;
  absl::StatusOr<registry::EntryRef> entry = catalog_->Register(request);
  ASSERT_TRUE(entry.ok()) << entry.status();
  absl::Notification loaded;
  absl::Status load_status;
  scheduler_->AddModel(*entry, [&](const LoadOutcome& outcome) {
    load_status = outcome.status;
    loaded.Notify();
  });
  for (int slot = 0; slot < kWorkers; ++slot) {
    ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("LoadModel pinned slot ", slot), kWait))
        << record_.Commands();
    Worker(slot)->Loaded("pinned");
  }
  ASSERT_TRUE(loaded.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(load_status.ok()) << load_status;
  bool resident = false;
  for (int i = 0; i < 200 && !resident; ++i) {
    Settle();
    resident = scheduler_->ResidentModels().contains("pinned");
    if (!resident) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(resident);
  EXPECT_FALSE(record_.Sent("Prepare pinned ")) << "no task, no worker involved";
  const uint64_t task = Submit("pinned");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", task, " "), kWait)) << record_.Commands();
  Worker(record_.LastSlot(absl::StrCat("Run ", task, " ")))->RunDone(task);
  absl::StatusOr<TaskOutcome> done = record_.AwaitAnswer(task, kWait);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->switch_time, absl::ZeroDuration()) << "its first task copied the weights";
  EXPECT_EQ(done->timeline.drained_ns, 0);
}

// A tenant told to stop that goes silent (SIGSTOPped: no heartbeat) while a task placed ahead
// waits is killed after the short stopping bound, not the 10 s silence watchdog, and the task
// placed ahead runs.
class SilentStopperTest : public InputsArrivingTest {
 protected:
  SilentStopperTest() { stopping_silence_ = absl::Milliseconds(300); }
};

TEST_F(SilentStopperTest, ATaskPlacedAheadIsNotDelayedByASilentTenantWhichIsKilled) {
  const uint64_t training = SubmitTraining("a", 1000);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait));
  const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
  const uint64_t inference = Submit("b");
  // The trainer never answers its Stop and sends nothing; the inference runs regardless.
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " slot ", 1 - trainer), kWait))
      << record_.Commands();
  Worker(1 - trainer)->RunDone(inference);
  EXPECT_TRUE(record_.AwaitAnswer(inference, kWait).ok());
  // A task that cannot be placed ahead (a training) waits in the queue behind it: the silent
  // tenant is killed for it at the stopping bound, not the (here hour-long) silence watchdog,
  // and it runs.
  const uint64_t after = SubmitTraining("b", 10);
  absl::StatusOr<TaskOutcome> killed = record_.AwaitAnswer(training, kWait);
  ASSERT_FALSE(killed.ok());
  EXPECT_TRUE(absl::StrContains(killed.status().message(), "went silent")) << killed.status();
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", after, " slot ", 1 - trainer), kWait))
      << record_.Commands();
  Worker(1 - trainer)->RunDone(after, 10);
  EXPECT_TRUE(record_.AwaitAnswer(after, kWait).ok());
}

// Issue 29, item 7: an eviction shows in the trace, on the copy track, with the model it made
// room for.
class OneModelCacheTest : public InputsArrivingTest {
 protected:
  OneModelCacheTest() { one_model_cache_ = true; }
};

TEST_F(OneModelCacheTest, AnEvictionShowsInTheTrace) {
  for (const char* model : {"a", "b"}) {
    const uint64_t task = Submit(model);
    ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", task, " "), kWait)) << record_.Commands();
    Worker(record_.LastSlot(absl::StrCat("Run ", task, " ")))->RunDone(task);
    ASSERT_TRUE(record_.AwaitAnswer(task, kWait).ok());
  }
  const std::string trace =
      telemetry_->trace().ChromeJson(absl::Minutes(5), base::MonotonicNowNs());
  EXPECT_TRUE(absl::StrContains(trace, "\"evict a\"")) << trace;
  EXPECT_TRUE(absl::StrContains(trace, "\"for\":\"b\"")) << trace;
}

// Unsaved training weights whose region another model needs are written back first (off the
// loop, the region held), the other model waiting meanwhile; the training then resumes from the
// pinned store, which now holds exactly what it trained.
TEST_F(OneModelCacheTest, UnsavedWeightsAreWrittenBackBeforeTheirRegionIsTaken) {
  HoldCheckpoints();
  // Plain SGD: no optimizer state, only the weights need the room.
  const uint64_t training =
      SubmitTraining("a", 1000, 0, absl::InfiniteFuture(), api::TrainerOptions{.momentum = 0});
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait));
  const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
  std::optional<ResidentModel> region = CopiedRegionOf("a");
  ASSERT_TRUE(region.has_value());
  const memdaemon::StoredModel& stored = *catalog_->Find("a").value()->stored;
  std::vector<std::byte> weights(stored.total_bytes());
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = std::byte((i * 31 + 7) & 0xff);
  ASSERT_TRUE(daemon_->arena().CopyFromHost(region->offset, weights).ok());
  const uint64_t generation = stored.generation();

  const uint64_t inference = Submit("b");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Stop slot ", trainer), kWait));
  Worker(trainer)->RunDone(training, 4, /*stopped_early=*/true);
  Settle();
  // "b" has room only where "a"'s unsaved weights are: it waits for their write-back.
  EXPECT_FALSE(record_.Sent("Prepare b ")) << record_.Commands();
  EXPECT_EQ(scheduler_->Query(inference)->state, TaskState::kQueued);
  EXPECT_EQ(stored.generation(), generation);
  OpenCheckpoints();
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " "), kWait))
      << record_.Commands();
  EXPECT_GT(stored.generation(), generation);
  EXPECT_EQ(std::memcmp(stored.host_bytes(), weights.data(), weights.size()), 0);
  Worker(record_.LastSlot(absl::StrCat("Run ", inference, " ")))->RunDone(inference);
  ASSERT_TRUE(record_.AwaitAnswer(inference, kWait).ok());
  // It resumes on the weights it trained, copied back in from the pinned store.
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait, 2))
      << record_.Commands();
  EXPECT_EQ(record_.LastRun(training).first_iteration, 4u);
  std::vector<std::byte> seen(weights.size());
  EXPECT_TRUE(Eventually([&] {
    std::optional<ResidentModel> back = RegionOf("a");
    return back && !back->copying && daemon_->arena().CopyToHost(back->offset, seen).ok() &&
           seen == weights;
  }));
  CancelRunningTraining(training, 5);
}

// Optimizer state lives in the weights pool (issue 29 item 1): a pool with room for one model and
// one training run's state holds "a" and its run's state; once "a"'s run is preempted, "b" has
// room only where its kept state is, which goes to host memory (its weights stay unsaved), and
// the task resumes from exactly that state in a room taken again.
class OneModelAndStateTest : public InputsArrivingTest {
 protected:
  OneModelAndStateTest() {
    one_model_cache_ = true;
    state_room_ = true;
  }
};

TEST_F(OneModelAndStateTest, AKeptStateGoesToHostMemoryWhenThePoolNeedsItsRoomAndComesBackExactly) {
  auto sink = std::make_shared<base::MemoryLogSink>();
  base::SetLogSink(sink);
  const uint64_t training = SubmitTraining("a", 1000);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait))
      << record_.Commands();
  const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
  const Record::RunState first = record_.LastRun(training);
  ASSERT_GT(first.optimizer_bytes, 0u);
  EXPECT_EQ(OptimizerStates(), 1u);
  std::optional<ResidentModel> region = CopiedRegionOf("a");
  ASSERT_TRUE(region.has_value());
  // Its state's room is in the weights pool, apart from the model's region.
  EXPECT_TRUE(first.optimizer_offset >= region->offset + region->bytes ||
              first.optimizer_offset + first.optimizer_bytes <= region->offset);
  const memdaemon::StoredModel& stored = *catalog_->Find("a").value()->stored;
  const uint64_t generation = stored.generation();
  std::vector<std::byte> state(first.optimizer_bytes);
  for (size_t i = 0; i < state.size(); ++i) state[i] = std::byte((i * 13 + 5) & 0xff);
  ASSERT_TRUE(daemon_->arena().CopyFromHost(first.optimizer_offset, state).ok());

  const uint64_t inference = Submit("b");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Stop slot ", trainer), kWait));
  Worker(trainer)->RunDone(training, 4, /*stopped_early=*/true);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " "), kWait))
      << record_.Commands();
  EXPECT_TRUE(
      sink->AwaitEvent("optimizer_state_written", {absl::StrCat("task=", training)}, kWait));
  EXPECT_EQ(OptimizerStates(), 0u);
  // "a"'s trained weights stayed where they were, unsaved: only the state made room.
  EXPECT_EQ(stored.generation(), generation);
  std::optional<ResidentModel> kept = RegionOf("a");
  ASSERT_TRUE(kept.has_value()) << absl::StrJoin(sink->Lines(), "\n");
  EXPECT_EQ(kept->unsaved_task, training) << absl::StrJoin(sink->Lines(), "\n");
  // Whatever "b" does with that room, the saved state is not it.
  std::vector<std::byte> junk(first.optimizer_bytes, std::byte{0x5a});
  ASSERT_TRUE(daemon_->arena().CopyFromHost(first.optimizer_offset, junk).ok());
  Worker(record_.LastSlot(absl::StrCat("Run ", inference, " ")))->RunDone(inference);
  ASSERT_TRUE(record_.AwaitAnswer(inference, kWait).ok());

  // It resumes: its state comes back from host memory, byte for byte ("b" evicted for its room).
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait, 2))
      << record_.Commands();
  const Record::RunState resumed = record_.LastRun(training);
  EXPECT_EQ(resumed.first_iteration, 4u);
  ASSERT_EQ(resumed.optimizer_bytes, first.optimizer_bytes);
  std::vector<std::byte> seen(resumed.optimizer_bytes);
  ASSERT_TRUE(daemon_->arena().CopyToHost(resumed.optimizer_offset, seen).ok());
  EXPECT_EQ(seen, state);
  EXPECT_TRUE(sink->AwaitEvent("task_state_restored",
                               {absl::StrCat("task=", training), "resident=0"}, kWait));
  base::SetLogSink(std::make_shared<base::FdLogSink>());
  CancelRunningTraining(training, 5);
  EXPECT_TRUE(Eventually([&] { return OptimizerStates() == 0; }));
}

// A training run whose weights and optimizer state together exceed the pool is refused with the
// reason; the pool has room for either alone.
TEST_F(OneModelCacheTest, ATrainingRunWhoseStateDoesNotFitBesideItsWeightsIsRefusedWithTheReason) {
  const uint64_t training = SubmitTraining("a", 10);
  absl::StatusOr<TaskOutcome> refused = record_.AwaitAnswer(training, kWait);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "optimizer state")) << refused.status();
  EXPECT_EQ(OptimizerStates(), 0u);
  // Nothing of it is left behind: an inference of "a" runs.
  const uint64_t inference = Submit("a");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " "), kWait))
      << record_.Commands();
  Worker(record_.LastSlot(absl::StrCat("Run ", inference, " ")))->RunDone(inference);
  EXPECT_TRUE(record_.AwaitAnswer(inference, kWait).ok());
}

// A preempted task's unsaved weights are written back before another training task trains the
// same model (should that run fail, they would go with the region), and a preempted task that
// misses its deadline while queued is answered once its weights are saved.
class UnsavedWeightsTest : public InputsArrivingTest {
 protected:
  UnsavedWeightsTest() { policy_ = Policy::kPriority; }
  // Runs `training` on "a", writes `weights` into its region as its training would, and has an
  // inference of "b" preempt it; returns the inference's slot, its Run out and unanswered.
  int PreemptWithTrainedWeights(uint64_t training, const std::vector<std::byte>& weights,
                                uint64_t* inference) {
    EXPECT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait));
    const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
    std::optional<ResidentModel> region = CopiedRegionOf("a");
    EXPECT_TRUE(region.has_value());
    if (!region) return -1;
    EXPECT_TRUE(daemon_->arena().CopyFromHost(region->offset, weights).ok());
    *inference = Submit("b");
    EXPECT_TRUE(record_.AwaitCommand(absl::StrCat("Stop slot ", trainer), kWait));
    Worker(trainer)->RunDone(training, 5, /*stopped_early=*/true);
    EXPECT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", *inference, " "), kWait));
    EXPECT_TRUE(Eventually([&] {
      std::optional<ResidentModel> r = RegionOf("a");
      return r && r->unsaved_task == training;
    }));
    return record_.LastSlot(absl::StrCat("Run ", *inference, " "));
  }
  std::vector<std::byte> Trained(int salt) {
    std::vector<std::byte> w(catalog_->Find("a").value()->stored->total_bytes());
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::byte((i * 17 + salt) & 0xff);
    return w;
  }
  const memdaemon::StoredModel& StoredA() { return *catalog_->Find("a").value()->stored; }
};

TEST_F(UnsavedWeightsTest, AnotherTrainingOfTheModelWaitsForTheirWriteBack) {
  const uint64_t first = SubmitTraining("a", 1000);
  const std::vector<std::byte> weights = Trained(3);
  uint64_t inference = 0;
  const int inference_slot = PreemptWithTrainedWeights(first, weights, &inference);
  ASSERT_GE(inference_slot, 0);
  HoldCheckpoints();
  // A second training of "a", ranked first, is next once the inference is done.
  const uint64_t second = SubmitTraining("a", 1000, /*priority=*/5);
  Worker(inference_slot)->RunDone(inference);
  ASSERT_TRUE(record_.AwaitAnswer(inference, kWait).ok());
  Settle();
  EXPECT_FALSE(record_.Sent(absl::StrCat("Run ", second, " "))) << record_.Commands();
  EXPECT_EQ(scheduler_->Query(second)->state, TaskState::kQueued);
  OpenCheckpoints();
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", second, " "), kWait)) << record_.Commands();
  // It trains on the first task's weights, now saved; the first one resumes on them later.
  EXPECT_EQ(std::memcmp(StoredA().host_bytes(), weights.data(), weights.size()), 0);
  EXPECT_EQ(RegionOf("a")->unsaved_task, 0u);
  CancelRunningTraining(second, 1);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", first, " "), kWait, 2))
      << record_.Commands();
  EXPECT_EQ(record_.LastRun(first).first_iteration, 5u);
  CancelRunningTraining(first, 6);
}

TEST_F(UnsavedWeightsTest, ADeadlineMissedWhileQueuedAnswersOnceTheWeightsAreSaved) {
  // Long enough that it is preempted well before (a loaded machine included).
  const absl::Time deadline = absl::Now() + absl::Milliseconds(1500);
  const uint64_t training = SubmitTraining("a", 1000, /*priority=*/0, deadline);
  const std::vector<std::byte> weights = Trained(9);
  uint64_t inference = 0;
  const int inference_slot = PreemptWithTrainedWeights(training, weights, &inference);
  ASSERT_GE(inference_slot, 0);
  HoldCheckpoints();
  // Queued behind the inference (still running) past its deadline: its weights are written
  // back first, and it is answered then.
  absl::SleepFor(deadline - absl::Now() + absl::Milliseconds(200));
  Settle();
  EXPECT_EQ(record_.AwaitAnswer(training, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kUnknown)
      << "answered before its weights were saved";
  OpenCheckpoints();
  absl::StatusOr<TaskOutcome> missed = record_.AwaitAnswer(training, kWait);
  EXPECT_EQ(missed.status().code(), absl::StatusCode::kDeadlineExceeded) << missed.status();
  EXPECT_TRUE(absl::StrContains(missed.status().message(), "after 5 iterations (weights saved)"))
      << missed.status();
  EXPECT_EQ(std::memcmp(StoredA().host_bytes(), weights.data(), weights.size()), 0);
  Worker(inference_slot)->RunDone(inference);
  EXPECT_TRUE(record_.AwaitAnswer(inference, kWait).ok());
  EXPECT_TRUE(Eventually([&] { return OptimizerStates() == 0; }));
}

// Issue 29 item 1 through the scheduler: pinned models that leave no window for a model the
// cache could hold are moved, the placement taking one's region and the scheduler copying it in
// again elsewhere, its pin kept.
class PinnedMoveTest : public InputsArrivingTest {
 protected:
  PinnedMoveTest() {
    tweak_options_ = [this](SchedulerOptions& options) {
      // A tiny_cnn's region (s) measured on a catalog of its own, a tiny_mlp's (B) on "a": the
      // cache holds 2s + B, so pins at 0 and 2s leave only B - s at the end.
      ModelCatalog sizer(daemon_.get(), 16 << 20, models::InspectInProcess());
      auto cnn = sizer.Register({"sizer", "tiny_cnn", "", 1, "auto"});
      ASSERT_TRUE(cnn.ok()) << cnn.status();
      mlp_ = WeightsCache::RegionBytes(catalog_->Find("a").value()->stored->total_bytes());
      cnn_ = WeightsCache::RegionBytes((*cnn)->stored->total_bytes());
      options.weights_cache_bytes = 2 * cnn_ + mlp_;
    };
  }
  // Registers `name` at run time (`pinned`: pin_resident) and has every worker load it.
  void AddAtRunTime(const std::string& name, const std::string& zoo, bool pinned) {
    registry::ModelRequest request{name, zoo, "", 1, "auto"};
    request.pin_resident = pinned;
    absl::StatusOr<registry::EntryRef> entry = catalog_->Register(request);
    ASSERT_TRUE(entry.ok()) << entry.status();
    absl::Notification loaded;
    scheduler_->AddModel(*entry, [&](const LoadOutcome&) { loaded.Notify(); });
    for (int slot = 0; slot < kWorkers; ++slot) {
      ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("LoadModel ", name, " slot ", slot), kWait))
          << record_.Commands();
      Worker(slot)->Loaded(name);
    }
    ASSERT_TRUE(loaded.WaitForNotificationWithTimeout(kWait));
  }
  void Infer(const std::string& model) {
    const uint64_t task = Submit(model);
    ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", task, " "), kWait)) << record_.Commands();
    Worker(record_.LastSlot(absl::StrCat("Run ", task, " ")))->RunDone(task);
    absl::StatusOr<TaskOutcome> done = record_.AwaitAnswer(task, kWait);
    ASSERT_TRUE(done.ok()) << done.status();
  }
  uint64_t mlp_ = 0, cnn_ = 0;
};

TEST_F(PinnedMoveTest, APinnedModelMovesForAModelThePinsLeftNoWindowFor) {
  ASSERT_GT(mlp_, cnn_) << "the scenario needs the tiny_mlp larger";
  // p1 (pinned) at [0, s), x at [s, 2s), p2 (pinned) at [2s, 3s), B - s free at the end.
  AddAtRunTime("p1", "tiny_cnn", /*pinned=*/true);
  ASSERT_TRUE(CopiedRegionOf("p1").has_value());
  AddAtRunTime("x", "tiny_cnn", /*pinned=*/false);
  Infer("x");
  AddAtRunTime("p2", "tiny_cnn", /*pinned=*/true);
  std::optional<ResidentModel> p2 = CopiedRegionOf("p2");
  ASSERT_TRUE(p2.has_value());
  const uint64_t p1_offset = RegionOf("p1")->offset;
  ASSERT_EQ(p2->offset, p1_offset + 2 * cnn_) << "the layout this test needs";
  // "big" fits only over p2's region: p2 moves, and is copied in again apart from it.
  AddAtRunTime("big", "tiny_mlp", /*pinned=*/false);
  Infer("big");
  std::optional<ResidentModel> big = CopiedRegionOf("big");
  ASSERT_TRUE(big.has_value());
  std::optional<ResidentModel> moved = CopiedRegionOf("p2");
  ASSERT_TRUE(moved.has_value()) << "the moved pinned model was not copied in again";
  EXPECT_TRUE(moved->pinned);
  EXPECT_NE(moved->offset, p2->offset);
  EXPECT_TRUE(moved->offset + moved->bytes <= big->offset ||
              moved->offset >= big->offset + big->bytes);
  EXPECT_EQ(RegionOf("p1")->offset, p1_offset);
  EXPECT_FALSE(RegionOf("x").has_value()) << "no room is left for it";
  // Its next task is a hit.
  const uint64_t misses = scheduler_->Snapshot(kWait)->cache.misses;
  Infer("p2");
  EXPECT_EQ(scheduler_->Snapshot(kWait)->cache.misses, misses);
}

// Compaction: the cache holds one tiny_cnn (s) and one tiny_mlp (B > s), s + B in all.
class CompactionTest : public PinnedMoveTest {
 protected:
  CompactionTest() {
    auto sized = tweak_options_;
    tweak_options_ = [this, sized](SchedulerOptions& options) {
      sized(options);
      options.weights_cache_bytes = cnn_ + mlp_;
    };
  }
  void Unload(const std::string& model) {
    absl::Notification dropped;
    scheduler_->DropModel(model, [&](absl::Status status) {
      EXPECT_TRUE(status.ok()) << status;
      dropped.Notify();
    });
    ASSERT_TRUE(dropped.WaitForNotificationWithTimeout(kWait));
  }
};

TEST_F(CompactionTest, AnIdleGpuMovesAModelToMergeFreeSpaceSoALargerOneFitsWithNoEviction) {
  ASSERT_GT(mlp_, cnn_) << "the scenario needs the tiny_mlp larger";
  AddAtRunTime("m1", "tiny_cnn", /*pinned=*/false);
  Infer("m1");
  AddAtRunTime("m2", "tiny_cnn", /*pinned=*/false);
  Infer("m2");
  std::optional<ResidentModel> m1 = CopiedRegionOf("m1"), m2 = CopiedRegionOf("m2");
  ASSERT_TRUE(m1.has_value() && m2.has_value());
  ASSERT_EQ(m2->offset, m1->offset + cnn_) << "the layout this test needs";
  // m1 gone: s free where it was and B - s at the end, neither room for a tiny_mlp ("a", the
  // fixture's, registered and not resident).
  Unload("m1");
  // The GPU is idle: m2 moves, on the device, and is resident where it went.
  std::optional<ResidentModel> moved_to;
  ASSERT_TRUE(Eventually([&] {
    moved_to = RegionOf("m2");
    return moved_to && !moved_to->copying && moved_to->offset != m2->offset;
  })) << "m2 did not move";
  absl::StatusOr<GpuSnapshot> before = scheduler_->Snapshot(kWait);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->cache.moves, 1u);
  // Its next task is a hit on the moved region, bound there.
  Infer("m2");
  EXPECT_EQ(scheduler_->Snapshot(kWait)->cache.misses, before->cache.misses);
  EXPECT_EQ(record_.PreparedAt("m2"), moved_to->offset);
  // The tiny_mlp fits in the merged room: nothing evicted, m2 still resident.
  AddAtRunTime("big", "tiny_mlp", /*pinned=*/false);
  Infer("big");
  ASSERT_TRUE(CopiedRegionOf("big").has_value());
  EXPECT_EQ(scheduler_->Snapshot(kWait)->cache.evictions, before->cache.evictions);
  EXPECT_TRUE(RegionOf("m2").has_value());
}

// The baseline (--place-at-arrival=false): nothing is placed until the old tenant has answered.
class PlaceWhenFreeTest : public InputsArrivingTest {
 protected:
  PlaceWhenFreeTest() { place_at_arrival_ = false; }
};

TEST_F(PlaceWhenFreeTest, APreemptingInferenceIsPlacedOnlyOnceTheTrainingAnswered) {
  const uint64_t training = SubmitTraining("a", 1000);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait));
  const int trainer = SlotOf(absl::StrCat("Run ", training, " "));
  const uint64_t inference = Submit("b");
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Stop slot ", trainer), kWait));
  Settle();
  EXPECT_FALSE(record_.Sent("Prepare b ")) << record_.Commands();
  Worker(trainer)->RunDone(training, 3, /*stopped_early=*/true);
  ASSERT_TRUE(record_.AwaitCommand("Prepare b ", kWait)) << record_.Commands();
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", inference, " "), kWait));
  Worker(SlotOf(absl::StrCat("Run ", inference, " ")))->RunDone(inference);
  absl::StatusOr<TaskOutcome> done = record_.AwaitAnswer(inference, kWait);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_GE(done->timeline.placed_ns, done->timeline.old_stopped_ns);
  EXPECT_GT(done->timeline.old_stopped_ns, 0);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", training, " "), kWait, 2));
  CancelRunningTraining(training, 4);
}

// A fill run that lives across bubbles (issue 30 item 1): its pause after each bubble's close is
// judged from its bell, and it is stopped through its bell as well as by message.
class ResidentFillTest : public InputsArrivingTest {
 protected:
  static constexpr absl::Duration kGrace = absl::Milliseconds(10);

  // A synthetic resident fill run woken by `bell`, started on a worker.
  uint64_t StartResident(const std::shared_ptr<BubbleBell>& bell) {
    bell->Open(base::MonotonicNowNs() + absl::ToInt64Nanoseconds(absl::Seconds(10)),
               base::MonotonicNowNs() + absl::ToInt64Nanoseconds(absl::Seconds(10)));
    TaskSpec spec;
    spec.model = "synthetic";
    spec.iterations = 1000;
    FillRunSpec fill;
    fill.bubble_end_ns = base::MonotonicNowNs() + absl::ToInt64Nanoseconds(absl::Seconds(10));
    fill.step = absl::Milliseconds(1);
    fill.synthetic = true;
    fill.synthetic_step = absl::Milliseconds(1);
    fill.bell = bell;
    spec.regions.push_back(bell->region());
    spec.fill = std::move(fill);
    auto id = std::make_shared<PendingId>();
    const uint64_t task = scheduler_->SubmitFill(
        std::move(spec), [this, id](const absl::StatusOr<TaskOutcome>& outcome) {
          record_.Answer(id->Get(), outcome);
        });
    id->Set(task);
    EXPECT_TRUE(record_.AwaitCommand(absl::StrCat("Run ", task, " "), kWait)) << record_.Commands();
    return task;
  }
  // A resident run on a new bell of its own, started; its page as the worker writes it.
  struct Started {
    std::shared_ptr<BubbleBell> bell;
    fill::BellLayout* page = nullptr;
    uint64_t task = 0;
  };
  Started StartOnNewBell() {
    Started started;
    absl::StatusOr<std::shared_ptr<BubbleBell>> bell = BubbleBell::Create();
    EXPECT_TRUE(bell.ok()) << bell.status();
    if (!bell.ok()) return started;
    started.bell = *std::move(bell);
    started.page = started.bell->page_for_test();
    started.task = StartResident(started.bell);
    return started;
  }
  // The main job's bubble ends now: the bell is closed and the scheduler told, as the fill
  // manager does.
  void CloseBubble(BubbleBell& bell) {
    const int64_t now = base::MonotonicNowNs();
    bell.Close(now);
    const BubbleBell::Report r = bell.Read();
    scheduler_->EndBubble(kGrace,
                          GpuScheduler::ResidentClose{bell.opens(), r.late_starts,
                                                      r.stepping ? r.last_step_start_ns : 0, now});
  }
  void OpenBubble(BubbleBell& bell) {
    const int64_t end = base::MonotonicNowNs() + 1'000'000'000;
    bell.Open(end, end);
  }
  // Past the pause check's due time, every event handled.
  void PastGrace() {
    absl::SleepFor(kGrace * 3);
    Settle();
    absl::SleepFor(kGrace);
    Settle();
  }
  void ExpectKilledForNotPausing(uint64_t task) {
    absl::StatusOr<TaskOutcome> killed = record_.AwaitAnswer(task, kWait);
    ASSERT_FALSE(killed.ok());
    EXPECT_TRUE(absl::StrContains(killed.status().message(), "did not pause")) << killed.status();
  }
  bool Answered(uint64_t task) {
    absl::StatusOr<TaskOutcome> answer = record_.AwaitAnswer(task, absl::ZeroDuration());
    return answer.ok() || !absl::StrContains(answer.status().message(), "was not answered");
  }
};

TEST_F(ResidentFillTest, ARunThatPausedOrCutItsStepIsLeftAndOneSteppingOnIsKilled) {
  const Started r = StartOnNewBell();
  ASSERT_NE(r.bell, nullptr);
  BubbleBell& bell = *r.bell;
  fill::BellLayout& page = *r.page;
  const uint64_t task = r.task;
  // Paused at the close: left alone, no message sent.
  page.stepping.store(0);
  CloseBubble(bell);
  PastGrace();
  EXPECT_FALSE(record_.Sent("Stop"));
  EXPECT_FALSE(Answered(task));
  // In a step at the close, which it cut; a new bubble opened, and its next step runs there.
  OpenBubble(bell);
  page.stepping.store(1);
  page.last_step_start_ns.store(base::MonotonicNowNs());
  CloseBubble(bell);
  page.last_step_start_ns.store(base::MonotonicNowNs() + 1);
  OpenBubble(bell);
  PastGrace();
  EXPECT_FALSE(Answered(task));
  // A worker that scribbles on pswitchd's half of the page cannot hide from the check.
  page.seq.store(0);
  page.stop.store(0);
  // Still stepping a grace after a close, no bubble since: killed, with the reason.
  page.last_step_start_ns.store(base::MonotonicNowNs());
  CloseBubble(bell);
  ExpectKilledForNotPausing(task);
}

// The step it was in at the close still running a grace later is killed though bubbles open
// meanwhile (one that cannot be cut); so is one that began a step with no bubble open.
TEST_F(ResidentFillTest, AnUncutStepOrAStepBegunWithNoBubbleOpenIsKilledThoughBubblesOpen) {
  for (const bool late_start : {false, true}) {
    SCOPED_TRACE(late_start ? "a step begun with no bubble open" : "an uncut step");
    const Started r = StartOnNewBell();
    ASSERT_NE(r.bell, nullptr);
    BubbleBell& bell = *r.bell;
    fill::BellLayout& page = *r.page;
    const uint64_t task = r.task;
    page.stepping.store(late_start ? 0 : 1);
    page.last_step_start_ns.store(base::MonotonicNowNs());
    CloseBubble(bell);
    if (late_start) {
      page.late_starts.store(page.late_starts.load() + 1);
      page.stepping.store(1);
      page.last_step_start_ns.store(base::MonotonicNowNs());
    }
    OpenBubble(bell);
    ExpectKilledForNotPausing(task);
  }
}

// Idle again by the check, but it began a step well after the close with no bubble open since:
// not paused, whatever its page says of the step now.
TEST_F(ResidentFillTest, AStepBegunWellAfterTheCloseWithNoBubbleOpenIsKilled) {
  const Started r = StartOnNewBell();
  ASSERT_NE(r.bell, nullptr);
  BubbleBell& bell = *r.bell;
  fill::BellLayout& page = *r.page;
  const uint64_t task = r.task;
  page.stepping.store(0);
  CloseBubble(bell);
  page.last_step_start_ns.store(base::MonotonicNowNs() + absl::ToInt64Nanoseconds(kGrace));
  ExpectKilledForNotPausing(task);
}

TEST_F(ResidentFillTest, AStoppedResidentRunIsToldByItsBellAndByMessage) {
  const Started r = StartOnNewBell();
  ASSERT_NE(r.bell, nullptr);
  const BubbleBell& bell = *r.bell;
  const uint64_t task = r.task;
  const int slot = record_.LastSlot(absl::StrCat("Run ", task, " "));
  scheduler_->StopFill(task);
  ASSERT_TRUE(record_.AwaitCommand(absl::StrCat("Stop slot ", slot), kWait)) << record_.Commands();
  EXPECT_TRUE(bell.stopped()) << "a run waiting on its bell would not see the message";
  Worker(slot)->RunDone(task, 12, /*stopped_early=*/true);
  absl::StatusOr<TaskOutcome> done = record_.AwaitAnswer(task, kWait);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->stopped_early);
  EXPECT_EQ(done->iterations_done, 12u);
}

}  // namespace
}  // namespace pswitch::controller
