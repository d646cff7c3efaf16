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
    Add("c", 3);
    Add("big", 4, /*layers=*/9, /*bytes=*/(1 << 20) + (1 << 18));
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

  // The weights pool is [4 MiB, 4 MiB + pool_bytes) of the arena; `cache` off: one model at a
  // time at its start (the single region).
  std::unique_ptr<Switcher> MakeSwitcher(absl::Duration drain_timeout = absl::Seconds(30),
                                         bool cache = false, uint64_t pool_bytes = 32 << 20) {
    WeightsCacheOptions pool;
    pool.pool_offset = kPool;
    pool.pool_bytes = pool_bytes;
    pool.flag_count = memdaemon::kReadyFlagCount;
    pool.enabled = cache;
    return std::make_unique<Switcher>(SwitcherOptions{0, pool, drain_timeout},
                                      &daemon_->transmitter(), pool_.get(), loop_,
                                      [this](uint64_t task, uint32_t, const absl::Status& copied) {
                                        if (copied.ok()) transmitted_.push_back(task);
                                      });
  }

  // A synthetic model of `layers` layers and about `bytes`, in groups of two.
  void Add(const std::string& name, uint32_t seed, int layers = 8, uint64_t bytes = 1 << 20) {
    models_.push_back(memdaemon::MakeSyntheticModel(name, layers, bytes, seed));
    auto stored = daemon_->weights().Register(models_.back()->model);
    ASSERT_TRUE(stored.ok()) << stored.status();
    CatalogEntry& entry = entries_[name];
    entry.request.name = name;
    entry.stored = *stored;
    entry.plan = *grouping::EveryKPlan(layers, 2);
    entry.group_last_layer.clear();
    for (int last = 1; last < layers + 1; last += 2) {
      entry.group_last_layer.push_back(static_cast<uint32_t>(std::min(last, layers - 1)));
    }
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
  bool RegionHolds(const std::string& name, uint64_t offset = kPool) {
    const memdaemon::StoredModel& model = *entries_.at(name).stored;
    std::vector<std::byte> seen(model.total_bytes());
    EXPECT_TRUE(daemon_->arena().CopyToHost(offset, seen).ok());
    return std::memcmp(seen.data(), model.host_bytes(), seen.size()) == 0;
  }
  static constexpr uint64_t kPool = 4 << 20;
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
  void OnWorkerDied(int slot, const absl::Status&, bool killed, bool) override {
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
  const std::string prepare = absl::StrCat(100 + first->slot, " Prepare a epoch ",
                                           first->transmission->epoch(), " at ", kPool, " flags 0");
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
                                           b->transmission->epoch(), " at ", kPool, " flags 0"));
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

TEST_F(SwitcherTest, WithTheCacheModelsStaySideBySideAndANewCopyWaitsForNoOne) {
  auto switcher = MakeSwitcher(absl::Seconds(30), /*cache=*/true);
  const int a = RunA(*switcher);
  ASSERT_GE(a, 0);
  const ResidentModel* a_region = switcher->cache().Find("a");
  ASSERT_NE(a_region, nullptr);
  const uint64_t a_offset = a_region->offset;
  const uint32_t a_epoch = a_region->epoch;
  // "a"'s worker is still busy (no RunDone): "b" goes elsewhere in the pool, so nobody is
  // stopped and its copy starts at once.
  SwitchTimeline timeline;
  commands_.clear();
  auto b = switcher->Place(2, entries_.at("b"), timeline);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->slot, a);
  EXPECT_EQ(timeline.stop_sent_ns, 0);
  EXPECT_EQ(
      std::count_if(commands_.begin(), commands_.end(),
                    [](const std::string& c) { return c.find(" Stop ") != std::string::npos; }),
      0);
  ASSERT_TRUE(RunUntil([&] { return transmitted_.size() == 2; })) << "no drain to wait for";
  ASSERT_NE(b->weights_offset, a_offset);
  EXPECT_TRUE(RegionHolds("a", a_offset)) << "a's weights untouched";
  EXPECT_TRUE(RegionHolds("b", b->weights_offset));
  const ResidentModel* b_region = switcher->cache().Find("b");
  ASSERT_NE(b_region, nullptr);
  EXPECT_NE(b_region->flag_base, a_region->flag_base) << "each model gates on its own flags";
  // "a" again: a hit on a free worker that has it, told where it is and under which epoch.
  FakeWorker* a_worker = workers_[static_cast<uint32_t>(a)];
  a_worker->RunDone(1);
  Drain();
  commands_.clear();
  auto again = switcher->Place(3, entries_.at("a"), timeline);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->transmission, nullptr) << "nothing copied";
  EXPECT_EQ(again->weights_offset, a_offset);
  ASSERT_FALSE(commands_.empty());
  EXPECT_EQ(commands_.back(), absl::StrCat(100 + again->slot, " Prepare a epoch ", a_epoch, " at ",
                                           a_offset, " flags ", a_region->flag_base));
  EXPECT_EQ(switcher->cache().stats().hits, 1u);
  EXPECT_EQ(switcher->cache().stats().misses, 2u);
}

TEST_F(SwitcherTest, WithTheCacheAnEvictionOverABusyTenantsRegionWaitsForItsDrain) {
  // A pool for one synthetic model: "b" evicts "a", whose worker is still busy.
  const uint64_t one_model = WeightsCache::RegionBytes(entries_.at("a").stored->total_bytes());
  auto switcher = MakeSwitcher(absl::Seconds(30), /*cache=*/true, one_model);
  const int a = RunA(*switcher);
  ASSERT_GE(a, 0);
  SwitchTimeline timeline;
  auto b = switcher->Place(2, entries_.at("b"), timeline);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT(timeline.stop_sent_ns, 0);
  EXPECT_EQ(switcher->cache().Find("a"), nullptr) << "evicted";
  EXPECT_EQ(switcher->cache().stats().evictions, 1u);
  const absl::Time until = absl::Now() + absl::Milliseconds(100);
  RunUntil([&] { return absl::Now() >= until; });
  EXPECT_EQ(b->transmission->groups_done(), 0u) << "not a byte before the old tenant drains";
  ASSERT_TRUE(daemon_->drain_flags().Store(static_cast<uint32_t>(a), 1).ok());
  ASSERT_TRUE(RunUntil([&] { return transmitted_.size() == 2; }));
  EXPECT_TRUE(RegionHolds("b"));
}

TEST_F(SwitcherTest, AWorkersDeathUntrustsOnlyTheModelItLastRan) {
  auto switcher = MakeSwitcher(absl::Seconds(30), /*cache=*/true);
  const int a = RunA(*switcher);
  ASSERT_GE(a, 0);
  workers_[static_cast<uint32_t>(a)]->RunDone(1);
  Drain();
  SwitchTimeline timeline;
  auto b = switcher->Place(2, entries_.at("b"), timeline);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(RunUntil([&] { return transmitted_.size() == 2; }));
  // An idle worker had nothing in flight: its death leaves what it last ran.
  switcher->SlotDied(a, /*was_busy=*/false);
  EXPECT_TRUE(switcher->Holds("a"));
  switcher->SlotDied(b->slot, /*was_busy=*/true);
  EXPECT_FALSE(switcher->Holds("b")) << "a half-finished step may have touched it";
  EXPECT_TRUE(switcher->Holds("a"));
}

TEST_F(SwitcherTest, NewerPinnedWeightsThanTheResidentCopyAreCopiedAgain) {
  auto switcher = MakeSwitcher(absl::Seconds(30), /*cache=*/true);
  const int a = RunA(*switcher);
  ASSERT_GE(a, 0);
  workers_[static_cast<uint32_t>(a)]->RunDone(1);
  Drain();
  // A training run on another GPU checkpointed "a": the copy here is of an older generation.
  entries_.at("a").stored->NewGeneration();
  SwitchTimeline timeline;
  auto again = switcher->Place(2, entries_.at("a"), timeline);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->transmission, nullptr) << "not served from the stale copy";
  ASSERT_TRUE(RunUntil([&] { return transmitted_.size() == 2; }));
  ASSERT_NE(switcher->cache().Find("a"), nullptr);
  EXPECT_EQ(switcher->cache().Find("a")->generation, entries_.at("a").stored->generation());
}

// Issue 29 item 1: pinned models scattered over the pool leave no window for a model the pool's
// free bytes could hold. One of them moves: the placement takes its region, and it is copied in
// again elsewhere, apart from the new model, behind the new model's copy.
TEST_F(SwitcherTest, PinnedModelsThatFragmentThePoolAreMovedRatherThanRefuseAModel) {
  // Regions of r bytes (a, b and c are as large); the pool holds 3.5 r.
  const uint64_t r = WeightsCache::RegionBytes(entries_.at("a").stored->total_bytes());
  const uint64_t big_bytes = WeightsCache::RegionBytes(entries_.at("big").stored->total_bytes());
  ASSERT_GT(big_bytes, r);
  ASSERT_LE(big_bytes, r + r / 2);
  auto switcher = MakeSwitcher(absl::Seconds(30), /*cache=*/true,
                               /*pool_bytes=*/WeightsCache::RegionBytes(3 * r + r / 2));
  // a (pinned) at [0, r), b at [r, 2r), c (pinned) at [2r, 3r); b goes: holes of r and r / 2.
  switcher->Pin("a", true);
  ASSERT_TRUE(switcher->Preload(entries_.at("a"), {}).ok());
  ASSERT_TRUE(switcher->Preload(entries_.at("b"), {}).ok());
  switcher->Pin("c", true);
  ASSERT_TRUE(switcher->Preload(entries_.at("c"), {}).ok());
  ASSERT_TRUE(RunUntil([&] { return transmitted_.size() == 3; }));
  switcher->Unloaded("b");
  const uint64_t a_offset = switcher->cache().Find("a")->offset;
  ASSERT_EQ(switcher->cache().Find("c")->offset, kPool + 2 * r);
  // "big": larger than either hole, smaller than the 1.5 r they make.
  // The owner copies the moved model in again when told (posted, after the placement).
  std::vector<std::string> moved;
  switcher->set_on_pinned_moved([&](const std::string& model, const std::string& for_model) {
    EXPECT_EQ(for_model, "big");
    moved.push_back(model);
    EXPECT_TRUE(switcher->Preload(entries_.at(model), {for_model}).ok());
  });
  SwitchTimeline timeline;
  auto big = switcher->Place(1, entries_.at("big"), timeline);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(switcher->cache().Find("c"), nullptr);
  EXPECT_TRUE(moved.empty()) << "told only once the placement is done";
  ASSERT_TRUE(RunUntil([&] { return transmitted_.size() == 5; }));
  EXPECT_EQ(moved, std::vector<std::string>{"c"}) << "moving a leaves it no room elsewhere";
  const ResidentModel* c = switcher->cache().Find("c");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->pinned) << "its pin holds at its new place";
  EXPECT_GE(c->offset, big->weights_offset + big_bytes);
  EXPECT_TRUE(RegionHolds("big", big->weights_offset));
  EXPECT_TRUE(RegionHolds("c", c->offset));
  EXPECT_EQ(switcher->cache().Find("a")->offset, a_offset);
  EXPECT_TRUE(RegionHolds("a", a_offset));
}

// A compaction move frees its source in the cache at once, but its copy reads it until it ends,
// and an optimizer state's room is written at once (not behind the copy engine): no state takes
// room while a move runs; a training task waits for it.
TEST_F(SwitcherTest, NoOptimizerStateTakesRoomWhileAMoveOnTheDeviceIsUnderWay) {
  auto switcher = MakeSwitcher(absl::Seconds(30), /*cache=*/true);
  const int a = RunA(*switcher);
  ASSERT_GE(a, 0);
  workers_[static_cast<uint32_t>(a)]->RunDone(1);
  Drain();
  const ResidentModel* region = switcher->cache().Find("a");
  ASSERT_NE(region, nullptr);
  const RegionMove move{"a", region->offset, region->offset + region->bytes, region->bytes};
  ASSERT_TRUE(switcher->Move(entries_.at("a"), move).ok());
  ASSERT_TRUE(switcher->MoveInFlight());
  const CheckpointKey state = CheckpointKey::Task(9);
  EXPECT_EQ(switcher->ReserveState(state, 4096, "b").status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(switcher->WaitsForRoom(entries_.at("b"), 4096, state).waits);
  EXPECT_FALSE(switcher->WaitsForRoom(entries_.at("b")).waits) << "weights wait for no move";
  ASSERT_TRUE(RunUntil([&] { return !switcher->MoveInFlight(); }));
  EXPECT_FALSE(switcher->WaitsForRoom(entries_.at("b"), 4096, state).waits);
  absl::StatusOr<uint64_t> room = switcher->ReserveState(state, 4096, "b");
  ASSERT_TRUE(room.ok()) << room.status();
  EXPECT_TRUE(RegionHolds("a", move.to)) << "the move's copy read its source whole";
}

TEST_F(SwitcherTest, ACopyTheTransmitterRefusesLeavesNoReservationBehind) {
  auto switcher = MakeSwitcher(absl::Seconds(30), /*cache=*/true);
  CatalogEntry bad = entries_.at("b");
  bad.plan = {{0, 2}};  // covers 3 of its 8 layers: the transmitter refuses it
  SwitchTimeline timeline;
  auto refused = switcher->Place(1, bad, timeline);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_TRUE(switcher->cache().List().empty());
  EXPECT_FALSE(switcher->Holds("b"));
}

}  // namespace
}  // namespace pswitch::controller
