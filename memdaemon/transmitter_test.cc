#include "memdaemon/transmitter.h"

#include <algorithm>
#include <cstring>

#include "gpu/internal/job_ticket.h"
#include "grouping/baselines.h"
#include "gtest/gtest.h"
#include "memdaemon/memdaemon.h"
#include "memdaemon/synthetic_model.h"

namespace pswitch::memdaemon {
namespace {

grouping::GroupPlan EveryK(int layers, int k) { return *grouping::EveryKPlan(layers, k); }

class TransmitterTest : public ::testing::Test {
 protected:
  void Open(double bandwidth = 0) {
    MemDaemonOptions options;
    options.arena_bytes = 64 << 20;
    options.device.copy_bandwidth_bytes_per_s = bandwidth;
    auto daemon = MemDaemon::Create(options);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
  }
  const StoredModel* Register(const std::string& name, uint32_t layers, uint64_t bytes,
                              uint32_t seed) {
    models_.push_back(MakeSyntheticModel(name, layers, bytes, seed));
    auto stored = daemon_->weights().Register(models_.back()->model);
    EXPECT_TRUE(stored.ok()) << stored.status();
    return *stored;
  }
  // True when the arena region at `offset` holds exactly `model`'s host bytes.
  bool RegionHolds(uint64_t offset, const StoredModel& model) {
    std::vector<std::byte> seen(model.total_bytes());
    EXPECT_TRUE(daemon_->arena().CopyToHost(offset, seen).ok());
    return std::memcmp(seen.data(), model.host_bytes(), seen.size()) == 0;
  }

  std::unique_ptr<MemDaemon> daemon_;
  std::vector<std::unique_ptr<SyntheticModel>> models_;
};

TEST_F(TransmitterTest, PlansMustCoverLayersContiguously) {
  Open();
  const StoredModel* model = Register("m", 10, 1 << 20, 1);
  std::vector<grouping::GroupPlan> bad = {
      {},                        // no groups
      {{0, 4}, {6, 9}},          // gap
      {{0, 4}, {4, 9}},          // overlap
      {{0, 4}, {5, 8}},          // stops short
      {{0, 4}, {5, 10}},         // runs past the end
      {{1, 9}},                  // does not start at 0
      {{0, 4}, {5, 3}, {4, 9}},  // reversed range
  };
  for (const auto& groups : bad) {
    auto started = daemon_->transmitter().Start(TransmitRequest{model, groups, 2 << 20});
    EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument) << groups.size();
    EXPECT_NE(started.status().message().find("model 'm'"), absl::string_view::npos);
  }
  auto outside = daemon_->transmitter().Start(TransmitRequest{model, EveryK(10, 5), 63 << 20});
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(TransmitterTest, TracesCoverEveryGroupAndTheBytesLand) {
  Open();
  const StoredModel* model = Register("m", 60, 8 << 20, 3);
  auto t = daemon_->transmitter().Start(TransmitRequest{model, EveryK(60, 7), 2 << 20, 100});
  ASSERT_TRUE(t.ok()) << t.status();
  auto traces = (*t)->Wait(absl::Seconds(60));
  ASSERT_TRUE(traces.ok()) << traces.status();
  ASSERT_EQ(traces->size(), 9u);
  uint64_t bytes = 0;
  for (size_t g = 0; g < traces->size(); ++g) {
    EXPECT_EQ((*traces)[g].layers.first, g * 7);
    EXPECT_TRUE(daemon_->ready_flags().WaitReady(100 + g, (*t)->epoch(), absl::Seconds(1)).ok());
    bytes += (*traces)[g].bytes;
  }
  // Every byte of the region's whole pages, the padding between groups and after the last
  // included, once.
  EXPECT_EQ(bytes, model->padded_bytes());
  EXPECT_TRUE(RegionHolds(2 << 20, *model));
}

TEST_F(TransmitterTest, AMoveCopiesTheRegionOnTheDeviceAndNeverOntoItself) {
  Open();
  const StoredModel* model = Register("m", 30, 4 << 20, 5);
  auto first = daemon_->transmitter().Start(TransmitRequest{model, EveryK(30, 7), 2 << 20, 10});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->Wait(absl::Seconds(60)).ok());
  // Whatever the store holds now, the move reads the region: its bytes, not the store's.
  std::vector<std::byte> marked(model->total_bytes());
  ASSERT_TRUE(daemon_->arena().CopyToHost(2 << 20, marked).ok());
  marked[12345] = std::byte{0x5a};
  ASSERT_TRUE(daemon_->arena().CopyFromHost(2 << 20, marked).ok());
  TransmitRequest move{model, EveryK(30, 7), 32 << 20, 10};
  move.source_offset = 2 << 20;
  auto moved = daemon_->transmitter().Start(move);
  ASSERT_TRUE(moved.ok()) << moved.status();
  auto traces = (*moved)->Wait(absl::Seconds(60));
  ASSERT_TRUE(traces.ok()) << traces.status();
  std::vector<std::byte> seen(model->total_bytes());
  ASSERT_TRUE(daemon_->arena().CopyToHost(32 << 20, seen).ok());
  EXPECT_EQ(seen, marked);
  for (size_t g = 0; g < traces->size(); ++g) {
    EXPECT_TRUE(daemon_->ready_flags().WaitReady(10 + g, (*moved)->epoch(), absl::Seconds(1)).ok());
  }
  // Onto itself, or partly so: refused before anything is queued.
  TransmitRequest overlapping{model, EveryK(30, 7), (2 << 20) + 4096, 10};
  overlapping.source_offset = 2 << 20;
  EXPECT_EQ(daemon_->transmitter().Start(overlapping).status().code(),
            absl::StatusCode::kInvalidArgument);
  TransmitRequest outside{model, EveryK(30, 7), 2 << 20, 10};
  outside.source_offset = 63 << 20;
  EXPECT_EQ(daemon_->transmitter().Start(outside).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(TransmitterTest, StaleFlagsFromThePreviousSwitchNeverReleaseTheNext) {
  Open();
  const StoredModel* a = Register("a", 20, 2 << 20, 1);
  const StoredModel* b = Register("b", 20, 2 << 20, 2);
  const uint64_t region = 2 << 20;
  auto first = daemon_->transmitter().Start(TransmitRequest{a, EveryK(20, 4), region});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->Wait(absl::Seconds(60)).ok());
  ASSERT_TRUE(RegionHolds(region, *a));
  // Every flag now holds a's epoch; a consumer of the next switch must not pass on it.
  uint32_t next_epoch = (*first)->epoch() + 2;
  for (uint32_t g = 0; g < 5; ++g) {
    EXPECT_EQ(daemon_->ready_flags().WaitReady(g, next_epoch, absl::Milliseconds(5)).code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  auto second = daemon_->transmitter().Start(TransmitRequest{b, EveryK(20, 4), region});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)->epoch(), next_epoch);
  for (uint32_t g = 0; g < 5; ++g) {
    EXPECT_TRUE(daemon_->ready_flags().WaitReady(g, next_epoch, absl::Seconds(5)).ok());
  }
  ASSERT_TRUE((*second)->Wait(absl::Seconds(60)).ok());
  EXPECT_TRUE(RegionHolds(region, *b));
}

TEST_F(TransmitterTest, ANewerSwitchSupersedesAndReleasesTheOldWaiters) {
  Open(/*bandwidth=*/200e6);  // 16 MiB takes ~84 ms
  const StoredModel* slow = Register("slow", 64, 16 << 20, 5);
  const StoredModel* next = Register("next", 8, 1 << 20, 6);
  auto old = daemon_->transmitter().Start(TransmitRequest{slow, EveryK(64, 1), 2 << 20});
  ASSERT_TRUE(old.ok());
  ASSERT_TRUE(daemon_->ready_flags().WaitReady(0, (*old)->epoch(), absl::Seconds(5)).ok());
  // Into the region the old copy is writing (the single region, or an evicted one).
  auto newer = daemon_->transmitter().Start(TransmitRequest{next, EveryK(8, 2), 8 << 20, 1000});
  ASSERT_TRUE(newer.ok());
  EXPECT_EQ((*old)->Wait(absl::Seconds(60)).status().code(), absl::StatusCode::kCancelled);
  size_t done = (*old)->groups_done();
  EXPECT_LT(done, 64u);
  // A worker still waiting on the old switch's last group is released, told it is stale.
  EXPECT_EQ(daemon_->ready_flags().WaitReady(63, (*old)->epoch(), absl::Seconds(1)).code(),
            absl::StatusCode::kAborted);
  // ...and the retire value does not release the newer epoch's waiters on the same flags.
  EXPECT_EQ(daemon_->ready_flags().WaitReady(63, (*newer)->epoch(), absl::Milliseconds(5)).code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE((*newer)->Wait(absl::Seconds(60)).ok());
  EXPECT_TRUE(RegionHolds(8 << 20, *next));
}

// With the weights cache, a copy into another region belongs to another resident model (a task
// may be computing on it): it is not cancelled, and the new copy follows it in order.
TEST_F(TransmitterTest, ACopyIntoAnotherRegionLetsTheOneInFlightFinish) {
  Open(/*bandwidth=*/200e6);
  const StoredModel* slow = Register("slow", 64, 16 << 20, 5);
  const StoredModel* next = Register("next", 8, 1 << 20, 6);
  auto old = daemon_->transmitter().Start(TransmitRequest{slow, EveryK(64, 1), 2 << 20});
  ASSERT_TRUE(old.ok());
  ASSERT_TRUE(daemon_->ready_flags().WaitReady(0, (*old)->epoch(), absl::Seconds(5)).ok());
  auto newer = daemon_->transmitter().Start(TransmitRequest{next, EveryK(8, 2), 32 << 20, 1000});
  ASSERT_TRUE(newer.ok());
  auto old_traces = (*old)->Wait(absl::Seconds(60));
  ASSERT_TRUE(old_traces.ok()) << old_traces.status();
  auto new_traces = (*newer)->Wait(absl::Seconds(60));
  ASSERT_TRUE(new_traces.ok()) << new_traces.status();
  EXPECT_TRUE(RegionHolds(2 << 20, *slow));
  EXPECT_TRUE(RegionHolds(32 << 20, *next));
  EXPECT_GE(new_traces->front().copy_start_ns, old_traces->back().ready_ns);
}

TEST_F(TransmitterTest, GroupsOfOnlyParameterFreeLayersArePublishedToo) {
  Open();
  // conv, relu, pool, conv: the relu+pool group has no bytes but its flag still gates compute.
  std::vector<std::byte> w1(1000, std::byte{1}), w2(3000, std::byte{2});
  ModelBytes model{"with-empty",
                   {{"conv1", {{"conv1.weight", w1}}},
                    {"relu", {}},
                    {"pool", {}},
                    {"conv2", {{"conv2.weight", w2}}}}};
  auto stored = daemon_->weights().Register(model);
  ASSERT_TRUE(stored.ok()) << stored.status();
  grouping::GroupPlan groups = {{0, 0}, {1, 2}, {3, 3}};
  // Whatever the memory held before, in its padding between tensors and past its last one.
  ASSERT_EQ((*stored)->padded_bytes(), 4096u);
  ASSERT_TRUE(daemon_->arena().Fill(2 << 20, 4096, 0xAB).ok());
  auto t = daemon_->transmitter().Start(TransmitRequest{*stored, groups, 2 << 20, 7});
  ASSERT_TRUE(t.ok()) << t.status();
  auto traces = (*t)->Wait(absl::Seconds(60));
  ASSERT_TRUE(traces.ok()) << traces.status();
  EXPECT_EQ((*traces)[0].bytes, 1000u);
  EXPECT_EQ((*traces)[1].bytes, 0u);
  // conv2 at 1024 (3000 bytes), with the padding before it and zeros to the page's end: nothing
  // of an earlier owner stays in a page a worker is given.
  EXPECT_EQ((*traces)[2].bytes, 4096u - 1000u);
  std::vector<std::byte> page(4096);
  ASSERT_TRUE(daemon_->arena().CopyToHost(2 << 20, page).ok());
  EXPECT_EQ(std::memcmp(page.data(), (*stored)->host_bytes(), page.size()), 0);
  EXPECT_EQ(std::count(page.begin(), page.end(), std::byte{0xAB}), 0);
  for (uint32_t g = 0; g < 3; ++g) {
    EXPECT_TRUE(daemon_->ready_flags().WaitReady(7 + g, (*t)->epoch(), absl::Seconds(1)).ok());
  }
  EXPECT_TRUE(RegionHolds(2 << 20, **stored));
}

TEST_F(TransmitterTest, WaitsForThePreviousTenantToDrain) {
  Open();
  const StoredModel* model = Register("m", 8, 1 << 20, 9);
  TransmitRequest request{model, EveryK(8, 8), 2 << 20};
  request.drain = DrainCondition{3, 77, absl::Milliseconds(30)};
  auto stuck = daemon_->transmitter().Start(request);
  ASSERT_TRUE(stuck.ok());
  auto failed = (*stuck)->Wait(absl::Seconds(60));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(failed.status().message().find("did not drain"), absl::string_view::npos);
  // Its waiters are released as superseded rather than left hanging.
  EXPECT_EQ(daemon_->ready_flags().WaitReady(0, (*stuck)->epoch(), absl::Seconds(1)).code(),
            absl::StatusCode::kAborted);

  ASSERT_TRUE(daemon_->drain_flags().Store(3, 77).ok());
  request.drain->timeout = absl::Seconds(5);
  auto ok = daemon_->transmitter().Start(request);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE((*ok)->Wait(absl::Seconds(60)).ok());
  EXPECT_TRUE(RegionHolds(2 << 20, *model));
}

TEST_F(TransmitterTest, TellsItsOwnerOnceWhenTheCopyEndsHoweverItEnds) {
  Open();
  const StoredModel* model = Register("m", 8, 1 << 20, 9);
  absl::Mutex mu;
  int calls = 0;
  bool finished_when_called = false;
  std::shared_ptr<Transmission> current;
  TransmitRequest request{model, EveryK(8, 4), 2 << 20};
  request.on_finished = [&] {
    absl::MutexLock lock(&mu);
    ++calls;
    finished_when_called = current != nullptr && current->finished();
  };
  {
    // Held while Start returns, so the callback sees `current` (the copy may already be done).
    absl::MutexLock lock(&mu);
    auto done = daemon_->transmitter().Start(request);
    ASSERT_TRUE(done.ok()) << done.status();
    current = *done;
  }
  ASSERT_TRUE(current->Wait(absl::Seconds(60)).ok());
  {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(
                            +[](int* c) { return *c == 1; }, &calls),
                        absl::Seconds(10));
    EXPECT_EQ(calls, 1);
    EXPECT_TRUE(finished_when_called);
    calls = 0;
  }

  // A copy that fails (its previous tenant never drains) is reported the same way.
  request.drain = DrainCondition{2, 5, absl::Milliseconds(20)};
  {
    absl::MutexLock lock(&mu);
    auto stuck = daemon_->transmitter().Start(request);
    ASSERT_TRUE(stuck.ok()) << stuck.status();
    current = *stuck;
  }
  EXPECT_EQ(current->Wait(absl::Seconds(60)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::MutexLock lock(&mu);
  mu.AwaitWithTimeout(absl::Condition(+[](int* c) { return *c == 1; }, &calls),
                      absl::Seconds(10));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(finished_when_called);
}

// A copy engine whose jobs the test ends by hand, as a CUDA engine's stream would: a job can
// stall (fail with its work still queued on the device) long before it finishes.
class ManualCopyEngine : public gpu::CopyEngine {
 public:
  absl::StatusOr<std::shared_ptr<gpu::CopyTicket>> Submit(gpu::CopyJob job) override {
    auto ticket = std::make_shared<gpu::internal::JobTicket>(
        job.groups.size(), std::move(job.on_finished), std::move(job.on_stalled));
    tickets.push_back(ticket);
    return ticket;
  }
  std::vector<std::shared_ptr<gpu::internal::JobTicket>> tickets;
};

// Issue 26, item 2: after a copy timed out with its drain wait, copies and flag writes still
// queued, the flags are not retired to E + 1 until the device is done: a late write of E must
// not land on top of E + 1 (which would release the next waiter on E as if the group were in).
TEST_F(TransmitterTest, AStalledCopyIsRetiredOnlyOnceTheDeviceIsDoneWithIt) {
  Open();
  const StoredModel* model = Register("m", 8, 1 << 20, 9);
  ManualCopyEngine engine;
  Transmitter transmitter(&engine, &daemon_->ready_flags(), &daemon_->drain_flags(),
                          daemon_->arena().size_bytes());
  TransmitRequest request{model, EveryK(8, 4), 2 << 20};
  absl::Status stall_seen;
  int ends = 0;
  request.on_stalled = [&](const absl::Status& why) { stall_seen = why; };
  request.on_finished = [&] { ++ends; };
  auto t = transmitter.Start(request);
  ASSERT_TRUE(t.ok()) << t.status();
  const uint32_t epoch = (*t)->epoch();
  gpu::FlagArray& flags = daemon_->ready_flags();

  engine.tickets[0]->Stall(absl::DeadlineExceededError("previous tenant did not drain"));
  EXPECT_TRUE(absl::IsDeadlineExceeded(stall_seen)) << stall_seen;
  EXPECT_TRUE((*t)->stalled());
  EXPECT_FALSE((*t)->finished()) << "its pinned sources are still read";
  auto early = (*t)->Wait(absl::ZeroDuration());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(early.status().message().find("stalled"), absl::string_view::npos) << early.status();
  EXPECT_EQ(*flags.Load(0), 0u) << "nothing retired while the device may still write";
  EXPECT_EQ(ends, 0);

  // The killed tenant's drain is released; the queued copy and flag write of group 0 run.
  ASSERT_TRUE(flags.Store(0, epoch).ok());
  engine.tickets[0]->Finish(absl::DeadlineExceededError("previous tenant did not drain"));
  EXPECT_EQ(ends, 1);
  EXPECT_EQ((*t)->Wait(absl::ZeroDuration()).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE((*t)->finished());
  // Retired after the late write: every waiter on this epoch is released as superseded.
  for (uint32_t g = 0; g < 2; ++g) {
    EXPECT_EQ(*flags.Load(g), epoch + 1) << "group " << g;
    EXPECT_EQ(flags.WaitReady(g, epoch, absl::Seconds(1)).code(), absl::StatusCode::kAborted);
  }
}

}  // namespace
}  // namespace pswitch::memdaemon
