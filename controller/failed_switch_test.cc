// Issue 26, item 6: what a failed or unfinished switch may not do. A copy that stalls on the
// device keeps counting as in flight and gets its undrained tenant killed at once; the
// scheduler's loop never waits for a copy's end; and a training run that failed, or whose
// weights' copy did not complete, never overwrites the master weights in the pinned store.
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "controller/fake_worker.h"
#include "controller/switcher.h"
#include "controller/training_state.h"
#include "gpu/internal/job_ticket.h"
#include "grouping/baselines.h"
#include "gtest/gtest.h"
#include "memdaemon/arena_layout.h"
#include "memdaemon/host_test_daemon.h"
#include "memdaemon/synthetic_model.h"
#include "proto/framing.h"

namespace pswitch::controller {

using registry::CatalogEntry;

namespace {

// A ticket that remembers the longest anyone was prepared to wait on it.
class RecordingTicket : public gpu::internal::JobTicket {
 public:
  using JobTicket::JobTicket;
  absl::StatusOr<std::vector<gpu::GroupTiming>> Wait(absl::Duration timeout) override {
    longest_wait = std::max(longest_wait, timeout);
    return JobTicket::Wait(timeout);
  }
  absl::Duration longest_wait = absl::ZeroDuration();
};

// A copy engine whose jobs the test ends by hand, as a CUDA engine's stream would: a job can
// stall (fail with its work still queued on the device) long before it finishes.
class ManualCopyEngine : public gpu::CopyEngine {
 public:
  absl::StatusOr<std::shared_ptr<gpu::CopyTicket>> Submit(gpu::CopyJob job) override {
    auto ticket = std::make_shared<RecordingTicket>(job.groups.size(), std::move(job.on_finished),
                                                    std::move(job.on_stalled));
    tickets.push_back(ticket);
    return ticket;
  }
  std::vector<std::shared_ptr<RecordingTicket>> tickets;
};

class FailedSwitchTest : public ::testing::Test, public WorkerPool::Listener {
 protected:
  void SetUp() override {
    auto daemon = memdaemon::HostTestDaemon();
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    transmitter_ = std::make_unique<memdaemon::Transmitter>(
        &engine_, &daemon_->ready_flags(), &daemon_->drain_flags(), daemon_->arena().size_bytes());
    Add("a", 1);
    Add("b", 2);
  }
  void TearDown() override {
    // Jobs still open end before the loop and switcher go (their callbacks post to the loop).
    for (auto& ticket : engine_.tickets) {
      if (!ticket->finished()) ticket->Finish(absl::CancelledError("test over"));
    }
  }

  void StartPool() {
    WorkerPoolOptions pool;
    pool.workers = 3;
    pool.launch =
        [this](uint32_t id,
               WorkerProcess::EventHandler handler) -> absl::StatusOr<std::unique_ptr<WorkerLink>> {
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
    pool_ = std::make_unique<WorkerPool>(std::move(pool), loop_, this);
    pool_->Start();
    for (auto& [slot, worker] : workers_) worker->Ready(static_cast<int>(slot));
    Drain();
    for (auto& [slot, worker] : workers_) {
      for (const auto& [name, entry] : entries_) worker->Loaded(name);
    }
    Drain();
    ASSERT_TRUE(pool_->AwaitReady(absl::ZeroDuration()));
    WeightsCacheOptions weights;
    weights.pool_offset = kRegion;
    weights.pool_bytes = 16 << 20;
    weights.flag_count = memdaemon::kReadyFlagCount;
    weights.enabled = false;  // the single region these tests check byte for byte
    switcher_ = std::make_unique<Switcher>(
        SwitcherOptions{0, weights, absl::Seconds(30)}, transmitter_.get(), pool_.get(), loop_,
        [this](uint64_t task, uint32_t, const absl::Status& copied) {
          ended_.emplace_back(task, copied);
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
  std::vector<std::byte> Pattern(uint64_t bytes, int salt) {
    std::vector<std::byte> v(bytes);
    for (uint64_t i = 0; i < bytes; ++i) v[i] = std::byte((i * 7 + salt) & 0xff);
    return v;
  }
  // The switch that brought `model` in, as the scheduler holds it, ended by hand with `status`.
  std::shared_ptr<memdaemon::Transmission> Transmission(const std::string& model,
                                                        absl::Status status) {
    auto ticket = std::make_shared<gpu::internal::JobTicket>(4, nullptr);
    if (status.code() != absl::StatusCode::kUnknown) ticket->Finish(status);
    memdaemon::TransmitRequest request;
    request.model = entries_.at(model).stored;
    request.groups = entries_.at(model).plan;
    request.weights_offset = kRegion;
    transmission_tickets_.push_back(ticket);
    return std::make_shared<memdaemon::Transmission>(1, std::move(request), ticket,
                                                     &daemon_->ready_flags());
  }

  void OnRunDone(int, const proto::RunDone&) override {}
  void OnDrained(int, uint64_t, const proto::Drained&) override {}
  void OnWorkerDied(int, const absl::Status&, bool, bool) override {}

  static constexpr uint64_t kRegion = 32 << 20;  // clear of the leases the tests take
  // An optimizer state's room, as the weights pool would give it: clear of the model's region.
  static constexpr memdaemon::StateArea::Room kStateRoom{48 << 20, 4096};
  std::shared_ptr<EventLoop> loop_ = std::make_shared<EventLoop>([] {});
  std::unique_ptr<memdaemon::MemDaemon> daemon_;
  ManualCopyEngine engine_;
  std::unique_ptr<memdaemon::Transmitter> transmitter_;
  std::vector<std::unique_ptr<memdaemon::SyntheticModel>> models_;
  std::map<std::string, CatalogEntry> entries_;
  std::map<uint32_t, FakeWorker*> workers_;
  std::vector<std::string> commands_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<Switcher> switcher_;
  std::vector<uint64_t> transmitted_;
  std::vector<std::pair<uint64_t, absl::Status>> ended_;  // every copy end reported, in order
  std::vector<std::shared_ptr<gpu::internal::JobTicket>> transmission_tickets_;
  StateCheckpoints checkpoints_;
};

// Item 2: the tenant that never drained is killed when the copy stalls (its stream may wait on
// a flag no one writes), and the copy counts as in flight until the device is done with it, so
// an unload cannot free the pinned weights under a queued copy.
TEST_F(FailedSwitchTest, AStalledCopyKillsItsUndrainedTenantAndStaysInFlightUntilItEnds) {
  StartPool();
  SwitchTimeline timeline;
  auto a = switcher_->Place(1, entries_.at("a"), timeline);
  ASSERT_TRUE(a.ok()) << a.status();
  engine_.tickets[0]->Finish(absl::OkStatus());
  flatbuffers::FlatBufferBuilder run;
  proto::Finish(run, proto::CreateWorkerCommand(run, 0, proto::WorkerCommandBody::NONE, 0));
  ASSERT_TRUE(pool_->SendRun(a->slot, 1, run).ok());  // a's worker is busy
  Drain();
  ASSERT_EQ(transmitted_, std::vector<uint64_t>{1});
  FakeWorker* old_tenant = workers_[static_cast<uint32_t>(a->slot)];

  auto b = switcher_->Place(2, entries_.at("b"), timeline);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(engine_.tickets.size(), 2u);
  engine_.tickets[1]->Stall(absl::DeadlineExceededError("previous tenant did not drain"));
  Drain();
  EXPECT_EQ(old_tenant->kills, 1) << "killed on the stall, not at the copy's end";
  EXPECT_TRUE(switcher_->Copying("b")) << "the device still reads b's pinned weights";
  EXPECT_FALSE(switcher_->Holds("b"));

  engine_.tickets[1]->Finish(absl::DeadlineExceededError("previous tenant did not drain"));
  Drain();
  EXPECT_FALSE(switcher_->Copying("b"));
  EXPECT_FALSE(switcher_->Holds("b"));
  EXPECT_EQ(old_tenant->kills, 1) << "killed once: its slot may hold a fresh worker by now";
  EXPECT_EQ(transmitted_.size(), 1u);
}

// Item 3 (and item 1's "a timeout is no success"): the loop never waits for a copy's end when
// a task answers; a copy still running gives no phases and does not make the region trusted.
TEST_F(FailedSwitchTest, ATaskAnsweredWhileItsCopyRunsIsHandledWithoutWaiting) {
  StartPool();
  SwitchTimeline timeline;
  auto a = switcher_->Place(1, entries_.at("a"), timeline);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::Duration copy_time = absl::ZeroDuration();
  absl::Status answered =
      switcher_->Completed(1, "a", *a->transmission, /*task_ok=*/true, timeline, copy_time);
  EXPECT_TRUE(answered.ok()) << answered;
  EXPECT_FALSE(a->transmission->finished());
  EXPECT_EQ(engine_.tickets[0]->longest_wait, absl::ZeroDuration()) << "the loop waited";
  EXPECT_EQ(copy_time, absl::ZeroDuration());
  EXPECT_EQ(timeline.first_group_ready_ns, 0);
  EXPECT_TRUE(timeline.group_copies.empty());
  EXPECT_TRUE(switcher_->Copying("a"));

  // The copy then fails: the region is not trusted, whatever the task said.
  engine_.tickets[0]->Finish(absl::InternalError("copy failed"));
  Drain();
  EXPECT_FALSE(switcher_->Holds("a"));
  EXPECT_FALSE(switcher_->Copying("a"));
  EXPECT_TRUE(transmitted_.empty());
}

// Item 6, Completed without a wait: a task whose worker answered before the copy engine
// retired its copy (the host backend's observer often lags the worker) is answered once the
// Switcher reports the copy's end, and its answer then carries every phase of the copy. The
// end is reported once, only when the copy ended, and only after Copying() stopped counting it.
TEST_F(FailedSwitchTest, ACopyThatEndsAfterItsTaskAnsweredReportsItsEndAndThenHasItsPhases) {
  StartPool();
  SwitchTimeline timeline;
  timeline.arrival_ns = 1000;
  auto a = switcher_->Place(1, entries_.at("a"), timeline);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(engine_.tickets.size(), 1u);
  // The worker saw every group's flag; the engine has not retired the job yet.
  const int64_t start = 5000;
  for (size_t g = 0; g < 4; ++g) {
    engine_.tickets[0]->RecordGroup(
        g, gpu::GroupTiming{start + static_cast<int64_t>(g) * 100,
                            start + static_cast<int64_t>(g) * 100 + 80, 2 << 20});
  }
  Drain();
  EXPECT_FALSE(a->transmission->finished());
  EXPECT_TRUE(ended_.empty()) << "no end reported before the copy ended";
  EXPECT_TRUE(switcher_->Copying("a"));

  engine_.tickets[0]->Finish(absl::OkStatus());
  EXPECT_TRUE(ended_.empty()) << "the end is handled on the loop, not on the copy thread";
  Drain();
  ASSERT_EQ(ended_.size(), 1u);
  EXPECT_EQ(ended_[0].first, 1u);
  EXPECT_TRUE(ended_[0].second.ok()) << ended_[0].second;
  EXPECT_FALSE(switcher_->Copying("a")) << "the end comes after the copy stopped counting";

  // What the scheduler does with the answer it held: the copy's phases are all there.
  absl::Duration copy_time = absl::ZeroDuration();
  absl::Status answered =
      switcher_->Completed(1, "a", *a->transmission, /*task_ok=*/true, timeline, copy_time);
  EXPECT_TRUE(answered.ok()) << answered;
  EXPECT_EQ(engine_.tickets[0]->longest_wait, absl::ZeroDuration()) << "the loop waited";
  EXPECT_EQ(copy_time, absl::Nanoseconds(3 * 100 + 80));
  EXPECT_EQ(timeline.drained_ns, start);
  EXPECT_EQ(timeline.first_group_ready_ns, start + 80);
  EXPECT_EQ(timeline.last_group_ready_ns, start + 380);
  ASSERT_EQ(timeline.group_copies.size(), 4u);
  EXPECT_EQ(timeline.group_copies[2], std::make_pair(start + 200, start + 280));
  EXPECT_TRUE(switcher_->Holds("a"));
  EXPECT_EQ(ended_.size(), 1u) << "reported once";
}

// The same wait when the copy fails: a stall is not its end (the device still works on it), the
// failure that ends it is reported with its reason, and the held answer fails with it.
TEST_F(FailedSwitchTest, ACopyThatFailsAfterItsTaskAnsweredReportsWhyAndFailsTheAnswer) {
  StartPool();
  SwitchTimeline timeline;
  auto a = switcher_->Place(1, entries_.at("a"), timeline);
  ASSERT_TRUE(a.ok()) << a.status();
  engine_.tickets[0]->Stall(absl::DeadlineExceededError("the copy stream is stuck"));
  Drain();
  EXPECT_TRUE(ended_.empty()) << "a stalled copy has not ended";
  EXPECT_TRUE(switcher_->Copying("a"));

  engine_.tickets[0]->Finish(absl::UnavailableError("device lost"));
  Drain();
  ASSERT_EQ(ended_.size(), 1u);
  EXPECT_EQ(ended_[0].first, 1u);
  EXPECT_EQ(ended_[0].second.code(), absl::StatusCode::kUnavailable) << ended_[0].second;
  EXPECT_NE(ended_[0].second.message().find("device lost"), absl::string_view::npos);
  EXPECT_FALSE(switcher_->Holds("a")) << "the region is untrusted before the end is reported";
  EXPECT_TRUE(transmitted_.empty());

  absl::Duration copy_time = absl::ZeroDuration();
  absl::Status answered =
      switcher_->Completed(1, "a", *a->transmission, /*task_ok=*/true, timeline, copy_time);
  EXPECT_EQ(answered.code(), absl::StatusCode::kUnavailable) << answered;
  EXPECT_EQ(copy_time, absl::ZeroDuration());
  EXPECT_TRUE(timeline.group_copies.empty());
}

// Item 1: a failed run (a gate or epoch mismatch, any error) leaves the master weights alone,
// and drops its optimizer state rather than keeping what it half-trained.
TEST_F(FailedSwitchTest, AFailedTrainingRunNeverOverwritesTheMasterWeights) {
  const memdaemon::StoredModel& model = *entries_.at("a").stored;
  const std::vector<std::byte> master(model.host_bytes(), model.host_bytes() + model.total_bytes());
  ASSERT_TRUE(daemon_->arena().CopyFromHost(kRegion, Pattern(model.total_bytes(), 3)).ok());
  auto state = TrainingState::Begin(daemon_.get(), &checkpoints_, 7, CheckpointKey::Task(7), 4096,
                                    kStateRoom);
  ASSERT_TRUE(state.ok()) << state.status();
  TrainingState::Ending ending;
  ending.run_ok = false;
  ending.trained = true;
  ending.transmission = Transmission("a", absl::OkStatus());
  ending.region_offset = kRegion;
  ending.model = &model;
  ending.keep_optimizer = true;
  bool kept = true;
  EXPECT_TRUE((*state)->End(ending, kept).ok());
  EXPECT_FALSE(kept);
  EXPECT_EQ(std::memcmp(model.host_bytes(), master.data(), master.size()), 0);
  EXPECT_EQ(checkpoints_.Take(CheckpointKey::Task(7)), nullptr);
}

// Item 1: a run that succeeded on a copy that failed, or that has not ended within its bound
// (the old 200 ms wait that timed out counted as success), saves nothing either.
TEST_F(FailedSwitchTest, ARunOnACopyThatDidNotCompleteSavesNothing) {
  const memdaemon::StoredModel& model = *entries_.at("a").stored;
  const std::vector<std::byte> master(model.host_bytes(), model.host_bytes() + model.total_bytes());
  ASSERT_TRUE(daemon_->arena().CopyFromHost(kRegion, Pattern(model.total_bytes(), 4)).ok());
  for (absl::Status copy : {absl::InternalError("copy failed"), absl::UnknownError("running")}) {
    auto state = TrainingState::Begin(daemon_.get(), &checkpoints_, 8, CheckpointKey::Task(8), 0);
    ASSERT_TRUE(state.ok()) << state.status();
    TrainingState::Ending ending;
    ending.run_ok = true;
    ending.trained = true;
    // kUnknown stands for a copy that never ends.
    ending.transmission = Transmission("a", copy);
    ending.copy_timeout = absl::Milliseconds(20);
    ending.region_offset = kRegion;
    ending.model = &model;
    bool kept = true;
    absl::Status saved = (*state)->End(ending, kept);
    EXPECT_FALSE(saved.ok()) << copy;
    EXPECT_NE(saved.message().find("weights not saved"), absl::string_view::npos) << saved;
    EXPECT_EQ(std::memcmp(model.host_bytes(), master.data(), master.size()), 0) << copy;
  }
}

TEST_F(FailedSwitchTest, ASuccessfulRunSavesItsWeightsOnceItsCopyEndedAndKeepsItsState) {
  const memdaemon::StoredModel& model = *entries_.at("a").stored;
  const std::vector<std::byte> trained = Pattern(model.total_bytes(), 5);
  ASSERT_TRUE(daemon_->arena().CopyFromHost(kRegion, trained).ok());
  auto state = TrainingState::Begin(daemon_.get(), &checkpoints_, 9, CheckpointKey::Task(9), 4096,
                                    kStateRoom);
  ASSERT_TRUE(state.ok()) << state.status();
  TrainingState::Ending ending;
  ending.run_ok = true;
  ending.trained = true;
  ending.transmission = Transmission("a", absl::OkStatus());
  ending.region_offset = kRegion;
  ending.model = &model;
  ending.keep_optimizer = true;
  bool kept = false;
  ASSERT_TRUE((*state)->End(ending, kept).ok());
  EXPECT_TRUE(kept);
  EXPECT_EQ(std::memcmp(model.host_bytes(), trained.data(), trained.size()), 0);
  EXPECT_NE(checkpoints_.Take(CheckpointKey::Task(9)), nullptr);
}

}  // namespace
}  // namespace pswitch::controller
