#include "proto/framing.h"
#include "controller/switcher.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "controller/fake_worker.h"
#include "grouping/baselines.h"
#include "gtest/gtest.h"
#include "memdaemon/arena_layout.h"
#include "memdaemon/host_test_daemon.h"
#include "memdaemon/synthetic_model.h"

namespace pswitch::controller {

using registry::CatalogEntry;

namespace {

// Real transmissions (host memdaemon, in-process) under fake workers: the test plays the
// workers, including an old tenant that drains late or never.
class SwitcherTest : public ::testing::Test, public WorkerPool::Listener {
 protected:
  void SetUp() override {
    auto daemon = memdaemon::HostTestDaemon();
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);

    WorkerPoolOptions pool;
    pool.workers = 3;
    pool.launch = [this](uint32_t id, WorkerProcess::EventHandler handler)
        -> absl::StatusOr<std::unique_ptr<WorkerLink>> {
      auto worker = std::make_unique<FakeWorker>(100 + id, std::move(handler), &commands_);
      workers_[id] = worker.get();
      return std::unique_ptr<WorkerLink>(std::move(worker));
    };
    pool.models = [this] {
      std::vector<WorkerModel> models;
      for (const auto& [name, entry] : entries_) models.push_back({name, "synthetic", {}, {}, 0});
      return models;
    };
    pool.release_drain = [this](uint32_t slot, uint32_t promised) {
      daemon_->ReleaseDrain(slot, promised);
    };
    Add("a", 1);
    Add("b", 2);
    pool_ = std::make_unique<WorkerPool>(std::move(pool), loop_, this);
    pool_->Start();
    for (auto& [slot, worker] : workers_) worker->Ready(static_cast<int>(slot));
    Drain();
    for (auto& [slot, worker] : workers_) {
      for (const auto& [name, entry] : entries_) worker->Loaded(name);
    }
    Drain();
    ASSERT_TRUE(pool_->AwaitReady(absl::ZeroDuration()));
  }

  std::unique_ptr<Switcher> MakeSwitcher(absl::Duration drain_timeout = absl::Seconds(30)) {
    return std::make_unique<Switcher>(
        SwitcherOptions{0, /*region_offset=*/4 << 20, drain_timeout}, &daemon_->transmitter(),
        pool_.get(), loop_, [this](uint64_t task, const absl::Status& copied) {
          if (copied.ok()) transmitted_.push_back(task);
        });
  }

  void Add(const std::string& name, uint32_t seed) {
    models_.push_back(memdaemon::MakeSyntheticModel(name, 8, 1 << 20, seed));
    auto stored = daemon_->weights().Register(models_.back()->model);
    ASSERT_TRUE(stored.ok()) << stored.status();
    CatalogEntry& entry = entries_[name];
    entry.request.name = name;
    entry.stored = *stored;
    entry.plan = *grouping::EveryKPlan(8, 2);
    entry.group_last_layer = {1, 3, 5, 7};
  }

  void Drain() {
    loop_->io().restart();
    loop_->io().poll();
  }
  // Runs the loop until `done` or 10 s.
  template <typename Done>
  bool RunUntil(Done done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!done() && absl::Now() < deadline) {
      loop_->io().restart();
      loop_->io().run_for(std::chrono::milliseconds(10));
    }
    return done();
  }
  bool RegionHolds(const std::string& name) {
    const memdaemon::StoredModel& model = *entries_.at(name).stored;
    std::vector<std::byte> seen(model.total_bytes());
    EXPECT_TRUE(daemon_->arena().CopyToHost(4 << 20, seen).ok());
    return std::memcmp(seen.data(), model.host_bytes(), seen.size()) == 0;
  }
  // Places task 1 of model "a" and runs it, as the scheduler would, once its model is in place:
  // the slot it runs on.
  int RunA(Switcher& switcher) {
    SwitchTimeline timeline;
    auto a = switcher.Place(1, entries_.at("a"), timeline);
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return -1;
    flatbuffers::FlatBufferBuilder b;
    proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::NONE, 0));
    EXPECT_TRUE(pool_->SendRun(a->slot, 1, b).ok());
    EXPECT_TRUE(RunUntil([&] { return transmitted_.size() == 1; }));
    return a->slot;
  }

  void OnRunDone(int, const proto::RunDone&) override {}
  void OnDrained(int, uint64_t, const proto::Drained&) override {}
  void OnWorkerDied(int slot, const absl::Status&, bool killed) override {
    deaths_.push_back({slot, killed});
  }

  std::shared_ptr<EventLoop> loop_ = std::make_shared<EventLoop>([] {});
  std::unique_ptr<memdaemon::MemDaemon> daemon_;
  std::vector<std::unique_ptr<memdaemon::SyntheticModel>> models_;
  std::map<std::string, CatalogEntry> entries_;
  std::map<uint32_t, FakeWorker*> workers_;
  std::vector<std::string> commands_;
  std::unique_ptr<WorkerPool> pool_;
  std::vector<uint64_t> transmitted_;
  std::vector<std::pair<int, bool>> deaths_;
};

TEST_F(SwitcherTest, AResidentModelRunsOnItsActiveWorkerWithNothingMoved) {
  auto switcher = MakeSwitcher();
  SwitchTimeline timeline;
  auto first = switcher->Place(1, entries_.at("a"), timeline);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_NE(first->transmission, nullptr);
  EXPECT_EQ(timeline.stop_sent_ns, 0);  // nobody was there to stop
  ASSERT_TRUE(RunUntil([&] { return !transmitted_.empty(); }));
  EXPECT_EQ(transmitted_, std::vector<uint64_t>{1});
  EXPECT_TRUE(RegionHolds("a"));
  EXPECT_TRUE(switcher->Holds("a"));

  auto again = switcher->Place(2, entries_.at("a"), timeline);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->slot, first->slot);
  EXPECT_EQ(again->transmission, nullptr);
  // Both placements told their worker which groups to wait for, under the switch's epoch.
  const std::string prepare =
      absl::StrCat(100 + first->slot, " Prepare a epoch ", first->transmission->epoch());
  EXPECT_EQ(std::count(commands_.begin(), commands_.end(), prepare), 2);
}

TEST_F(SwitcherTest, ABusyTenantIsStoppedAndTheCopyWaitsForItsDrain) {
  auto switcher = MakeSwitcher();
  const int a = RunA(*switcher);
  ASSERT_GE(a, 0);
  SwitchTimeline timeline;
  auto b = switcher->Place(2, entries_.at("b"), timeline);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->slot, a);  // a standby takes it while the active one drains
  EXPECT_GT(timeline.stop_sent_ns, 0);
  EXPECT_EQ(commands_.back(), absl::StrCat(100 + b->slot, " Prepare b epoch ",
                                           b->transmission->epoch()));
  EXPECT_NE(std::find(commands_.begin(), commands_.end(), absl::StrCat(100 + a, " Stop 1")),
            commands_.end());
  // Not a byte moves before the old tenant drains.
  const absl::Time until = absl::Now() + absl::Milliseconds(100);
  RunUntil([&] { return absl::Now() >= until; });
  EXPECT_EQ(transmitted_.size(), 1u);
  EXPECT_EQ(b->transmission->groups_done(), 0u);
  ASSERT_TRUE(daemon_->drain_flags().Store(static_cast<uint32_t>(a), 1).ok());
  ASSERT_TRUE(RunUntil([&] { return transmitted_.size() == 2; }));
  EXPECT_TRUE(RegionHolds("b"));
  EXPECT_TRUE(switcher->Holds("b"));
  EXPECT_FALSE(switcher->Holds("a"));
  EXPECT_TRUE(deaths_.empty());
}

TEST_F(SwitcherTest, ATenantThatNeverDrainsIsKilledAndTheRegionIsNotTrusted) {
  auto switcher = MakeSwitcher(absl::Milliseconds(50));
  const int a = RunA(*switcher);
  ASSERT_GE(a, 0);
  FakeWorker* old_tenant = workers_[static_cast<uint32_t>(a)];
  SwitchTimeline timeline;
  auto b = switcher->Place(2, entries_.at("b"), timeline);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(RunUntil([&] { return old_tenant->kills == 1; }));
  EXPECT_EQ(transmitted_.size(), 1u);  // b never arrived
  EXPECT_FALSE(switcher->Holds("b"));
  // Its death releases the drain and a fresh worker takes the slot.
  old_tenant->Die("killed by signal 9");
  Drain();
  ASSERT_EQ(deaths_.size(), 1u);
  EXPECT_EQ(deaths_[0], std::make_pair(a, true));
}

TEST_F(SwitcherTest, APlanWithMoreGroupsThanReadyFlagsIsRefusedBeforeAnyoneIsStopped) {
  auto switcher = MakeSwitcher();
  ASSERT_GE(RunA(*switcher), 0);
  SwitchTimeline timeline;
  CatalogEntry huge = entries_.at("b");
  huge.plan.assign(memdaemon::kReadyFlagCount + 1, huge.plan[0]);
  commands_.clear();
  auto refused = switcher->Place(2, huge, timeline);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(commands_.empty());
  EXPECT_TRUE(switcher->Holds("a"));
}

}  // namespace
}  // namespace pswitch::controller
