#include "controller/worker_pool.h"

#include <deque>
#include <functional>
#include <map>
#include <thread>

#include "absl/synchronization/notification.h"
#include "base/status.h"
#include "controller/fake_worker.h"
#include "gtest/gtest.h"
#include "proto/framing.h"
#include "proto/wire_status.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {
namespace {

using Outlook = WorkerPool::Outlook;

class WorkerPoolTest : public ::testing::Test, public WorkerPool::Listener {
 protected:
  // Events are posted to the loop; the test runs them by hand.
  void Drain() { loop_->io().restart(), loop_->io().poll(); }

  std::unique_ptr<WorkerPool> MakePool(int workers, bool spawn_fails = false,
                                       absl::Duration suspect_after = absl::Seconds(1)) {
    WorkerPoolOptions options;
    options.workers = workers;
    options.silence_timeout = absl::Seconds(1);
    options.suspect_after = suspect_after;
    options.launch = [this, spawn_fails](uint32_t id, WorkerProcess::EventHandler handler)
        -> absl::StatusOr<std::unique_ptr<WorkerLink>> {
      if (spawn_fails) return absl::InternalError("no worker binary");
      auto worker = std::make_unique<FakeWorker>(next_pid_++, std::move(handler), &commands_);
      workers_[id] = worker.get();
      return std::unique_ptr<WorkerLink>(std::move(worker));
    };
    options.models = [this] { return models_; };
    options.release_drain = [this](uint32_t slot, uint32_t promised) {
      released_.push_back({slot, promised});
    };
    return std::make_unique<WorkerPool>(std::move(options), loop_, this);
  }

  void Ready(int slot) { workers_[slot]->Ready(slot); }
  void Loaded(int slot, const std::string& model, absl::Status status = absl::OkStatus(),
              int64_t infer_step_ns = 0, int64_t train_step_ns = 0) {
    workers_[slot]->Loaded(model, status, infer_step_ns, train_step_ns);
  }
  void RunDone(int slot, uint64_t task) { workers_[slot]->RunDone(task); }
  // Brings every slot up with every model loaded.
  void BringUp(int workers) {
    for (int i = 0; i < workers; ++i) Ready(i);
    Drain();
    for (int i = 0; i < workers; ++i) {
      for (const WorkerModel& m : models_) Loaded(i, m.name);
    }
    Drain();
  }

  void OnRunDone(int slot, const proto::RunDone& done) override {
    runs_done_.push_back({slot, done.task_id()});
  }
  void OnDrained(int, uint64_t, const proto::Drained&) override {}
  void OnWorkerDied(int slot, const absl::Status& why, bool killed, bool) override {
    deaths_.push_back({slot, std::string(why.message()), killed});
    if (on_death_) on_death_();
  }

  struct Death {
    int slot;
    std::string why;
    bool killed;
  };
  std::shared_ptr<EventLoop> loop_ = std::make_shared<EventLoop>([] {});
  std::vector<WorkerModel> models_ = {{"a", "tiny_mlp", {}, {}, 1024},
                                      {"b", "tiny_cnn", {}, {}, 2048}};
  std::map<uint32_t, FakeWorker*> workers_;
  pid_t next_pid_ = 100;
  std::vector<std::string> commands_;
  std::vector<std::pair<uint32_t, uint32_t>> released_;
  std::vector<std::pair<int, uint64_t>> runs_done_;
  std::vector<Death> deaths_;
  std::function<void()> on_death_;  // runs on the loop after each death is recorded
};

flatbuffers::FlatBufferBuilder EmptyRun() {
  flatbuffers::FlatBufferBuilder run;
  proto::Finish(run, proto::CreateWorkerCommand(run, 0, proto::WorkerCommandBody::NONE, 0));
  return run;
}

std::shared_ptr<const dataplane::TransferRegion> Staging(uint64_t bytes) {
  auto region = dataplane::TransferRegion::NewStaging(bytes, "alice");
  EXPECT_TRUE(region.ok()) << region.status();
  return *region;
}

TEST_F(WorkerPoolTest, AWorkerIsFreeOnlyOnceItAnnouncedItselfAndLoadedTheCatalog) {
  auto pool = MakePool(2);
  pool->Start();
  EXPECT_EQ(pool->ForModel("a", nullptr), Outlook::kLater);
  Ready(0);
  Drain();
  // Announced: it was sent the whole catalog, in order, and is loading.
  EXPECT_EQ(commands_, (std::vector<std::string>{"100 LoadModel a", "100 LoadModel b"}));
  EXPECT_FALSE(pool->Free(0));
  Loaded(0, "a");
  Drain();
  EXPECT_FALSE(pool->Free(0));  // still loading b
  Loaded(0, "b");
  Drain();
  EXPECT_TRUE(pool->Usable(0, "a"));
  EXPECT_TRUE(pool->Usable(0, "b"));
  EXPECT_EQ(pool->ForModel("b", nullptr), Outlook::kNow);
  // Slot 1 is still starting: the pool as a whole is not ready.
  EXPECT_FALSE(pool->AwaitReady(absl::ZeroDuration()));
  Ready(1);
  Drain();
  Loaded(1, "a");
  Loaded(1, "b");
  Drain();
  EXPECT_TRUE(pool->AwaitReady(absl::ZeroDuration()));
}

TEST_F(WorkerPoolTest, AModelWhoseLoadFailedEverywhereCanNeverRun) {
  auto pool = MakePool(1);
  pool->Start();
  Ready(0);
  Drain();
  Loaded(0, "a", absl::InternalError("bad weights"));
  Loaded(0, "b");
  Drain();
  absl::Status never;
  EXPECT_EQ(pool->ForModel("a", &never), Outlook::kNever);
  EXPECT_EQ(never.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->ForModel("b", nullptr), Outlook::kNow);
}

TEST_F(WorkerPoolTest, ARegistrationWaitsForEveryLiveWorkerAndADeathCountsAsAnAnswer) {
  auto pool = MakePool(3);
  pool->Start();
  BringUp(3);
  commands_.clear();
  std::optional<LoadOutcome> registered;
  pool->AddModel({"c", "tiny_mlp", {}, {}, 512}, [&](const LoadOutcome& o) { registered = o; });
  // The last free worker is held back for tasks meanwhile.
  EXPECT_EQ(commands_, (std::vector<std::string>{"100 LoadModel c", "101 LoadModel c"}));
  EXPECT_FALSE(pool->AwaitReady(absl::ZeroDuration()));  // loads in flight
  Loaded(0, "c", absl::OkStatus(), /*infer_step_ns=*/4'000'000, /*train_step_ns=*/9'000'000);
  Drain();
  EXPECT_FALSE(registered.has_value());
  workers_[1]->Die("killed by signal 9");
  Drain();
  ASSERT_TRUE(registered.has_value());
  EXPECT_TRUE(registered->status.ok()) << registered->status;
  EXPECT_EQ(registered->infer_step, absl::Milliseconds(4));
  EXPECT_EQ(registered->train_step, absl::Milliseconds(9));
  ASSERT_EQ(deaths_.size(), 1u);
  EXPECT_EQ(deaths_[0].slot, 1);
  EXPECT_FALSE(deaths_[0].killed);
  // Nothing else loads now: the held-back worker's turn.
  EXPECT_EQ(commands_.back(), "102 LoadModel c");
}

// A task arriving while a model loads (and warms up) on the workers finds one of them free.
TEST_F(WorkerPoolTest, WhileAModelLoadsOneFreeWorkerStaysFreeForTasks) {
  auto pool = MakePool(2);
  pool->Start();
  BringUp(2);
  commands_.clear();
  std::optional<LoadOutcome> registered;
  pool->AddModel({"c", "tiny_mlp", {}, {}, 512}, [&](const LoadOutcome& o) { registered = o; });
  EXPECT_EQ(commands_, (std::vector<std::string>{"100 LoadModel c"}));
  EXPECT_FALSE(pool->Free(0));
  EXPECT_TRUE(pool->Usable(1, "a"));
  EXPECT_EQ(pool->ForModel("b", nullptr), Outlook::kNow);
  ASSERT_TRUE(pool->SendRun(1, 7, EmptyRun()).ok());  // the task takes the held-back worker
  Loaded(0, "c");
  Drain();
  ASSERT_TRUE(registered.has_value()) << "waited for the held-back worker";
  EXPECT_TRUE(registered->status.ok());
  // It loads the model once no other worker is loading (after its run, in command order).
  EXPECT_EQ(commands_.back(), "101 LoadModel c");
  EXPECT_TRUE(pool->Usable(0, "c"));
  RunDone(1, 7);
  Loaded(1, "c");
  Drain();
  EXPECT_TRUE(pool->Usable(1, "c"));
}

TEST_F(WorkerPoolTest, AnUnloadDropsAHeldBackLoad) {
  auto pool = MakePool(2);
  pool->Start();
  BringUp(2);
  commands_.clear();
  pool->AddModel({"c", "tiny_mlp", {}, {}, 512}, [](const LoadOutcome&) {});
  pool->RemoveModel("c");
  Loaded(0, "c");
  Drain();
  EXPECT_EQ(commands_, (std::vector<std::string>{"100 LoadModel c", "100 DropModel"}));
  EXPECT_FALSE(pool->Usable(0, "c"));
  EXPECT_FALSE(pool->Usable(1, "c"));
}

// A worker in the middle of a (possibly hours-long) run loads a new model after it; the
// registration completes on the idle workers' answers and does not wait for that run.
TEST_F(WorkerPoolTest, ARegistrationDoesNotWaitForABusyWorker) {
  auto pool = MakePool(2);
  pool->Start();
  BringUp(2);
  flatbuffers::FlatBufferBuilder run;
  proto::Finish(run, proto::CreateWorkerCommand(run, 0, proto::WorkerCommandBody::NONE, 0));
  ASSERT_TRUE(pool->SendRun(0, 7, run).ok());
  commands_.clear();
  std::optional<absl::Status> registered;
  pool->AddModel({"c", "tiny_mlp", {}, {}, 512},
                 [&](const LoadOutcome& o) { registered = o.status; });
  EXPECT_EQ(commands_.size(), 2u) << "the busy worker is sent the load too";
  Loaded(1, "c");
  Drain();
  ASSERT_TRUE(registered.has_value()) << "waited for the busy worker";
  EXPECT_TRUE(registered->ok()) << *registered;
  EXPECT_EQ(pool->UsableOther("c", -1), 1);
  EXPECT_FALSE(pool->Usable(0, "c"));
}

TEST_F(WorkerPoolTest, RunsMakeAWorkerBusyUntilItsRunDone) {
  auto pool = MakePool(2);
  pool->Start();
  BringUp(2);
  flatbuffers::FlatBufferBuilder run;
  proto::Finish(run, proto::CreateWorkerCommand(run, 0, proto::WorkerCommandBody::NONE, 0));
  ASSERT_TRUE(pool->SendRun(0, 7, run).ok());
  EXPECT_FALSE(pool->Idle(0));
  EXPECT_EQ(pool->UsableOther("a", 1), -1);  // 0 is busy, 1 is excluded
  EXPECT_EQ(pool->UsableOther("a", 0), 1);
  EXPECT_EQ(pool->FreeSlot(0), 1);
  RunDone(0, 7);
  Drain();
  EXPECT_TRUE(pool->Idle(0));
  EXPECT_EQ(pool->FreeSlot(0), 0);  // the preferred one, now free
  EXPECT_EQ(runs_done_, (std::vector<std::pair<int, uint64_t>>{{0, 7}}));
}

TEST_F(WorkerPoolTest, DrainValuesCountOnAcrossProcessesAndADeathReleasesThePromisedOne) {
  auto pool = MakePool(1);
  pool->Start();
  BringUp(1);
  EXPECT_EQ(pool->SendStop(0), 1u);
  EXPECT_EQ(pool->SendStop(0), 2u);
  workers_[0]->Die("exited with status 1");
  Drain();
  // Nothing of the dead process is in flight: whoever waits for drain value 2 may go on.
  EXPECT_EQ(released_, (std::vector<std::pair<uint32_t, uint32_t>>{{0, 2}}));
  // A worker that had been serving is replaced at once, and its next drain value counts on.
  EXPECT_EQ(workers_[0]->pid(), 101);
  BringUp(1);
  EXPECT_EQ(pool->SendStop(0), 3u);
}

TEST_F(WorkerPoolTest, AKilledWorkersDeathCarriesTheKillReason) {
  auto pool = MakePool(1);
  pool->Start();
  BringUp(1);
  FakeWorker* worker = workers_[0];
  pool->Kill(0, "killed: it did not pause");
  EXPECT_EQ(worker->kills, 1);
  worker->Die("killed by signal 9");
  Drain();
  ASSERT_EQ(deaths_.size(), 1u);
  EXPECT_TRUE(deaths_[0].killed);
  EXPECT_EQ(deaths_[0].why, "killed: it did not pause");
  // The replacement starts clean: its own death is not a kill.
  BringUp(1);
  workers_[0]->Die("exited with status 1");
  Drain();
  ASSERT_EQ(deaths_.size(), 2u);
  EXPECT_FALSE(deaths_[1].killed);
}

TEST_F(WorkerPoolTest, AWorkerThatCannotStartIsRetriedWithBackOffAndThenGivenUpOn) {
  auto pool = MakePool(1, /*spawn_fails=*/true);
  pool->Start();
  absl::Status never;
  for (int attempt = 1; attempt < RespawnBackoff::kMaxStartFailures; ++attempt) {
    ASSERT_NE(pool->NextRespawn(), absl::InfiniteFuture());
    EXPECT_EQ(pool->ForModel("a", &never), Outlook::kLater);
    absl::SleepFor(pool->NextRespawn() - absl::Now() + absl::Milliseconds(1));
    pool->RespawnDue();
  }
  EXPECT_EQ(pool->ForModel("a", &never), Outlook::kNever);
  EXPECT_EQ(never.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(never.message().find("no worker binary"), absl::string_view::npos);
  // Shutting down, nothing is respawned any more.
  pool->StopRespawning();
  EXPECT_EQ(pool->NextRespawn(), absl::InfiniteFuture());
}

// The watchdog: a ready worker that goes silent (SIGSTOP, a wedged process) is killed; one still
// starting (it may be setting up a device) is not judged by heartbeats.
TEST_F(WorkerPoolTest, AReadyWorkerThatGoesSilentIsKilled) {
  auto pool = MakePool(2);
  pool->Start();
  EXPECT_EQ(pool->NextSilenceDeadline(), absl::InfiniteFuture());  // none announced yet
  Ready(0);
  Loaded(0, "a");
  Loaded(0, "b");
  Drain();
  const absl::Time deadline = pool->NextSilenceDeadline();
  ASSERT_NE(deadline, absl::InfiniteFuture());
  EXPECT_LE(deadline, absl::Now() + absl::Seconds(1));
  pool->KillSilent(deadline - absl::Milliseconds(100));
  EXPECT_EQ(workers_[0]->kills, 0);
  pool->KillSilent(deadline + absl::Milliseconds(1));
  EXPECT_EQ(workers_[0]->kills, 1);
  EXPECT_EQ(workers_[1]->kills, 0);  // still starting
  // Killed once: it is not judged again while its death is on its way.
  EXPECT_EQ(pool->NextSilenceDeadline(), absl::InfiniteFuture());
  workers_[0]->Die("killed by signal 9");
  Drain();
  ASSERT_EQ(deaths_.size(), 1u);
  EXPECT_TRUE(deaths_[0].killed);
  EXPECT_NE(deaths_[0].why.find("no heartbeat"), std::string::npos) << deaths_[0].why;
}

// A worker that has missed a few heartbeats gets no new task (a SIGSTOPped standby once took the
// task after the one its stopped neighbour failed), and is usable again once heard.
TEST_F(WorkerPoolTest, ASuspectlySilentWorkerGetsNoNewTaskUntilHeardAgain) {
  auto pool = MakePool(1, /*spawn_fails=*/false, /*suspect_after=*/absl::Milliseconds(50));
  pool->Start();
  BringUp(1);
  absl::Status never;
  EXPECT_TRUE(pool->Usable(0, "a"));
  absl::SleepFor(absl::Milliseconds(80));
  EXPECT_FALSE(pool->Usable(0, "a"));
  EXPECT_EQ(pool->ForModel("a", &never), Outlook::kLater);
  workers_[0]->Heartbeat();
  Drain();
  EXPECT_TRUE(pool->Usable(0, "a"));
}

// A Run's regions are mapped (with their fds) before it, once per worker process: a second Run
// on the same region sends no MapRegion, a new process maps it again.
TEST_F(WorkerPoolTest, ARegionIsMappedBeforeTheFirstRunThatUsesItOncePerProcess) {
  auto pool = MakePool(1);
  pool->Start();
  BringUp(1);
  auto region = Staging(8192);
  commands_.clear();
  ASSERT_TRUE(pool->SendRun(0, 7, EmptyRun(), {region}).ok());
  const std::string map = absl::StrCat("100 MapRegion ", region->id(), " 8192 fd");
  EXPECT_EQ(commands_, (std::vector<std::string>{map, "100 NONE"}));
  EXPECT_TRUE(pool->Maps(0, region->id()));
  RunDone(0, 7);
  Drain();
  commands_.clear();
  ASSERT_TRUE(pool->SendRun(0, 8, EmptyRun(), {region}).ok());
  EXPECT_EQ(commands_, (std::vector<std::string>{"100 NONE"}));
  // A worker that dies maps nothing: its replacement is sent the region again.
  workers_[0]->Die("killed by signal 9");
  Drain();
  BringUp(1);
  EXPECT_FALSE(pool->Maps(0, region->id()));
  commands_.clear();
  ASSERT_TRUE(pool->SendRun(0, 9, EmptyRun(), {region}).ok());
  EXPECT_EQ(commands_, (std::vector<std::string>{
                           absl::StrCat("101 MapRegion ", region->id(), " 8192 fd"), "101 NONE"}));
}

// A MapRegion the worker could not carry out is forgotten: the next Run naming the region sends
// it again, where before the region stayed "mapped" in pswitchd's record and every later Run on
// that worker failed with "region N is not mapped in this worker" (seen once on the H100).
TEST_F(WorkerPoolTest, ARegionWhoseMapFailedInTheWorkerIsMappedAgainBeforeTheNextRun) {
  auto pool = MakePool(1);
  pool->Start();
  BringUp(1);
  auto region = Staging(8192);
  commands_.clear();
  ASSERT_TRUE(pool->SendRun(0, 7, EmptyRun(), {region}).ok());
  const std::string map = absl::StrCat("100 MapRegion ", region->id(), " 8192 fd");
  EXPECT_EQ(commands_, (std::vector<std::string>{map, "100 NONE"}));
  workers_[0]->RegionMapFailed(region->id(), absl::InternalError("cudaHostRegister: busy"));
  Drain();
  EXPECT_FALSE(pool->Maps(0, region->id()));
  RunDone(0, 7);
  Drain();
  commands_.clear();
  ASSERT_TRUE(pool->SendRun(0, 8, EmptyRun(), {region}).ok());
  EXPECT_EQ(commands_, (std::vector<std::string>{map, "100 NONE"}));
  EXPECT_TRUE(pool->Maps(0, region->id()));
}

// Once nothing holds a region (its task ended, its table let go), each worker that maps it is
// told to unmap it: at the next heartbeat, or before the next Run.
TEST_F(WorkerPoolTest, AnExpiredRegionIsUnmappedAtTheNextHeartbeatOrRun) {
  auto pool = MakePool(2);
  pool->Start();
  BringUp(2);
  auto kept = Staging(4096);
  auto region = Staging(4096);
  const uint64_t id = region->id();
  ASSERT_TRUE(pool->SendRun(0, 7, EmptyRun(), {region, kept}).ok());
  ASSERT_TRUE(pool->SendRun(1, 8, EmptyRun(), {region}).ok());
  RunDone(0, 7);
  RunDone(1, 8);
  workers_[0]->Heartbeat();
  Drain();
  commands_.clear();
  region.reset();  // the last holder lets go
  workers_[0]->Heartbeat();
  Drain();
  EXPECT_EQ(commands_, (std::vector<std::string>{absl::StrCat("100 UnmapRegion ", id)}));
  EXPECT_FALSE(pool->Maps(0, id));
  EXPECT_TRUE(pool->Maps(0, kept->id()));  // still held
  commands_.clear();
  ASSERT_TRUE(pool->SendRun(1, 9, EmptyRun(), {}).ok());
  EXPECT_EQ(commands_,
            (std::vector<std::string>{absl::StrCat("101 UnmapRegion ", id), "101 NONE"}));
  // Sent once: nothing more to unmap.
  commands_.clear();
  pool->SweepRegions();
  EXPECT_TRUE(commands_.empty());
}

TEST_F(WorkerPoolTest, AWorkerMapsABoundedNumberOfRegions) {
  auto pool = MakePool(1);
  pool->Start();
  BringUp(1);
  // CUDA IPC regions need no fd: a thousand of them cost nothing to make.
  std::vector<std::shared_ptr<const dataplane::TransferRegion>> regions;
  for (size_t i = 0; i <= RegionMappings::kMaxMappedRegions; ++i) {
    auto region = dataplane::TransferRegion::FromCudaIpc(std::string(64, 'h'), 0, 4096, "alice");
    ASSERT_TRUE(region.ok()) << region.status();
    regions.push_back(*region);
  }
  commands_.clear();
  // Only a task that alone needs more regions than a worker maps is refused, naming the bound.
  absl::Status refused = pool->SendRun(0, 7, EmptyRun(), regions);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("1025 transfer regions"), absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("at most 1024"), absl::string_view::npos) << refused;
  EXPECT_TRUE(commands_.empty()) << "nothing is sent for a task that cannot be mapped";
  EXPECT_TRUE(pool->Idle(0));
  regions.pop_back();
  ASSERT_TRUE(pool->SendRun(0, 7, EmptyRun(), regions).ok());
  EXPECT_EQ(commands_.size(), RegionMappings::kMaxMappedRegions + 1);
  EXPECT_EQ(commands_.front().find("100 MapRegion "), 0u);
  EXPECT_EQ(commands_.front().find(" fd"), std::string::npos);  // CUDA IPC: no fd
}

std::vector<std::shared_ptr<const dataplane::TransferRegion>> IpcRegions(size_t n,
                                                                         const std::string& owner) {
  std::vector<std::shared_ptr<const dataplane::TransferRegion>> regions;
  for (size_t i = 0; i < n; ++i) {
    auto region = dataplane::TransferRegion::FromCudaIpc(std::string(64, 'h'), 0, 4096, owner);
    EXPECT_TRUE(region.ok()) << region.status();
    regions.push_back(*region);
  }
  return regions;
}

// The worker's bound is shared by every principal: alice's many regions, all still registered
// (held), must not make bob's task fail. Alice's least recently used mappings give way, unmapped
// before bob's are mapped, and the worker never maps more than the bound.
TEST_F(WorkerPoolTest, OnePrincipalsRegionsNeverCrowdOutAnothersTask) {
  auto pool = MakePool(1);
  pool->Start();
  BringUp(1);
  const size_t kMax = RegionMappings::kMaxMappedRegions;
  auto alice = IpcRegions(kMax, "alice");  // held, as a RegionTable holds registered regions
  uint64_t task = 10;
  for (size_t i = 0; i < kMax; i += 64) {  // alice's tasks, 64 regions each
    std::vector<std::shared_ptr<const dataplane::TransferRegion>> some(
        alice.begin() + static_cast<ptrdiff_t>(i), alice.begin() + static_cast<ptrdiff_t>(i + 64));
    ASSERT_TRUE(pool->SendRun(0, task, EmptyRun(), some).ok());
    RunDone(0, task++);
    Drain();
  }
  // Alice uses her first region again: it is now her most recently used.
  ASSERT_TRUE(pool->SendRun(0, task, EmptyRun(), {alice[0]}).ok());
  RunDone(0, task++);
  Drain();
  commands_.clear();
  auto bob = IpcRegions(2, "bob");
  absl::Status sent = pool->SendRun(0, task, EmptyRun(), {bob[0]});
  ASSERT_TRUE(sent.ok()) << sent;
  RunDone(0, task++);
  Drain();
  ASSERT_EQ(commands_.size(), 3u);
  EXPECT_EQ(commands_[0], absl::StrCat("100 UnmapRegion ", alice[1]->id()));  // her LRU
  EXPECT_EQ(commands_[1].find(absl::StrCat("100 MapRegion ", bob[0]->id())), 0u) << commands_[1];
  EXPECT_EQ(commands_[2].find("100 NONE"), 0u) << commands_[2];
  EXPECT_TRUE(pool->Maps(0, alice[0]->id()));
  EXPECT_FALSE(pool->Maps(0, alice[1]->id()));
  // Bob's next region again displaces alice's (she holds the most), never bob's first.
  ASSERT_TRUE(pool->SendRun(0, task, EmptyRun(), {bob[1]}).ok());
  RunDone(0, task++);
  Drain();
  EXPECT_TRUE(pool->Maps(0, bob[0]->id()));
  EXPECT_TRUE(pool->Maps(0, bob[1]->id()));
  EXPECT_FALSE(pool->Maps(0, alice[2]->id()));
  // Alice's evicted region is mapped again when she needs it: her task does not fail either.
  commands_.clear();
  ASSERT_TRUE(pool->SendRun(0, task, EmptyRun(), {alice[1]}).ok());
  EXPECT_TRUE(pool->Maps(0, alice[1]->id()));
  EXPECT_TRUE(pool->Maps(0, bob[0]->id()));
  EXPECT_TRUE(pool->Maps(0, bob[1]->id()));
}

// A worker whose unread backlog is past its bound is killed at once, and the send fails with
// the reason: the scheduler fails the task with it.
TEST_F(WorkerPoolTest, AWorkerWhoseBacklogIsFullIsKilledAndTheRunFails) {
  auto pool = MakePool(1);
  pool->Start();
  BringUp(1);
  FakeWorker* worker = workers_[0];
  worker->send_error = absl::ResourceExhaustedError("the worker has not taken its commands");
  absl::Status sent = pool->SendRun(0, 7, EmptyRun(), {Staging(4096)});
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(sent.message().find("killed: the worker has not taken"), absl::string_view::npos)
      << sent;
  EXPECT_TRUE(pool->Idle(0));  // no run went out
  EXPECT_EQ(worker->kills, 1);
  worker->Die("killed by signal 9");
  Drain();
  ASSERT_EQ(deaths_.size(), 1u);
  EXPECT_TRUE(deaths_[0].killed);
  EXPECT_NE(deaths_[0].why.find("has not taken its commands"), std::string::npos) << deaths_[0].why;
}

// The watchdog also judges commands left unread: a worker that took none of them for the
// silence timeout is killed, though it still sends heartbeats (its reader may be wedged alone).
TEST_F(WorkerPoolTest, AWorkerThatLeavesItsCommandsUnreadIsKilledByTheWatchdog) {
  auto pool = MakePool(1);
  pool->Start();
  BringUp(1);
  const absl::Time unsent = absl::Now();
  workers_[0]->unsent_since = unsent;
  workers_[0]->Heartbeat();
  Drain();
  EXPECT_EQ(pool->NextSilenceDeadline(), unsent + absl::Seconds(1));
  pool->KillSilent(unsent + absl::Milliseconds(999));
  EXPECT_EQ(workers_[0]->kills, 0);
  pool->KillSilent(unsent + absl::Seconds(1));
  EXPECT_EQ(workers_[0]->kills, 1);
  workers_[0]->Die("killed by signal 9");
  Drain();
  ASSERT_EQ(deaths_.size(), 1u);
  EXPECT_TRUE(deaths_[0].killed);
  EXPECT_NE(deaths_[0].why.find("took none of its commands"), std::string::npos) << deaths_[0].why;
}

// End to end with a real process that never reads its control socket: the loop sends it large
// commands and stays responsive (the next handler runs at once; a blocking send would hang the
// loop forever), and the watchdog kills the worker.
TEST_F(WorkerPoolTest, AProcessThatStopsReadingNeverBlocksTheLoopAndIsKilled) {
  WorkerPoolOptions options;
  options.workers = 1;
  options.silence_timeout = absl::Seconds(30);
  options.launch =
      [](uint32_t id,
         WorkerProcess::EventHandler handler) -> absl::StatusOr<std::unique_ptr<WorkerLink>> {
    PSWITCH_ASSIGN_OR_RETURN(
        auto process, WorkerProcess::SpawnCommand(id, {"/bin/sh", "-c", "exec sleep 60", "sh"},
                                                  std::move(handler)));
    return std::unique_ptr<WorkerLink>(std::move(process));
  };
  options.models = [] { return std::vector<WorkerModel>(); };
  options.release_drain = [](uint32_t, uint32_t) {};
  auto pool = std::make_unique<WorkerPool>(std::move(options), loop_, this);
  std::thread loop_thread([this] { loop_->Run(); });

  flatbuffers::FlatBufferBuilder big;
  auto load = proto::CreateLoadModel(big, big.CreateString(std::string(4 << 20, 'x')),
                                     big.CreateString("tiny_mlp"));
  proto::Finish(
      big, proto::CreateWorkerCommand(big, 0, proto::WorkerCommandBody::LoadModel, load.Union()));
  absl::Notification flooded, answered, died;
  std::vector<absl::Status> sends;
  absl::Time deadline;
  on_death_ = [&] { died.Notify(); };
  loop_->Post([&] {
    pool->Start();
    // 32 MiB, against a socket buffer of a few hundred kilobytes that no one reads.
    for (int i = 0; i < 8; ++i) sends.push_back(pool->Send(0, big));
    deadline = pool->NextSilenceDeadline();
    flooded.Notify();
  });
  loop_->Post([&] { answered.Notify(); });  // another command, handled promptly
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(20)))
      << "the loop blocked on a worker that does not read";
  ASSERT_TRUE(flooded.HasBeenNotified());
  for (const absl::Status& sent : sends) EXPECT_TRUE(sent.ok()) << sent;
  ASSERT_NE(deadline, absl::InfiniteFuture()) << "the watchdog does not see the backlog";
  loop_->Post([&] { pool->KillSilent(deadline); });
  ASSERT_TRUE(died.WaitForNotificationWithTimeout(absl::Seconds(20)));
  absl::Notification stopped;
  loop_->Post([&] {
    pool->StopRespawning();
    pool->Close();
    stopped.Notify();
    loop_->Stop();
  });
  loop_thread.join();
  ASSERT_TRUE(stopped.HasBeenNotified());
  ASSERT_EQ(deaths_.size(), 1u);
  EXPECT_TRUE(deaths_[0].killed);
  EXPECT_NE(deaths_[0].why.find("took none of its commands"), std::string::npos) << deaths_[0].why;
}

TEST_F(WorkerPoolTest, CloseShutsEveryWorkerDownAndReleasesItsDrain) {
  auto pool = MakePool(2);
  pool->Start();
  BringUp(2);
  EXPECT_EQ(pool->SendStop(1), 1u);
  pool->Close();
  EXPECT_EQ(released_, (std::vector<std::pair<uint32_t, uint32_t>>{{0, 0}, {1, 1}}));
  EXPECT_FALSE(pool->AwaitReady(absl::ZeroDuration()));
  EXPECT_TRUE(deaths_.empty());  // a shutdown is no death to report
}

}  // namespace
}  // namespace pswitch::controller
