#include "controller/training_state.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "memdaemon/host_test_daemon.h"
#include "memdaemon/synthetic_model.h"

namespace pswitch::controller {
namespace {

class TrainingStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = memdaemon::HostTestDaemon();
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
  }
  std::vector<std::byte> Pattern(uint64_t bytes, int salt) {
    std::vector<std::byte> v(bytes);
    for (uint64_t i = 0; i < bytes; ++i) v[i] = std::byte((i * 7 + salt) & 0xff);
    return v;
  }
  size_t OptimizerLeases() const {
    size_t n = 0;
    for (const memdaemon::Lease& l : daemon_->leases().List()) {
      n += l.owner.ends_with("-optimizer") ? 1 : 0;
    }
    return n;
  }
  std::unique_ptr<memdaemon::MemDaemon> daemon_;
  StateCheckpoints checkpoints_;
};

TEST_F(TrainingStateTest, APreemptedRunsOptimizerStateComesBackExactlyAndAFinishedOneIsDropped) {
  constexpr uint64_t kBytes = 1 << 20;
  const CheckpointKey key = CheckpointKey::FillJob(3);
  auto first = TrainingState::Begin(daemon_.get(), &checkpoints_, 9, key, kBytes);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ((*first)->optimizer_bytes(), kBytes);
  EXPECT_EQ(OptimizerLeases(), 1u);
  const std::vector<std::byte> trained = Pattern(kBytes, 1);
  ASSERT_TRUE(daemon_->arena().CopyFromHost((*first)->optimizer_offset(), trained).ok());
  ASSERT_TRUE((*first)->EndOptimizer(/*keep=*/true).ok());
  EXPECT_EQ((*first)->optimizer_bytes(), 0u);  // the lease went

  auto resumed = TrainingState::Begin(daemon_.get(), &checkpoints_, 10, key, kBytes);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  std::vector<std::byte> seen(kBytes);
  ASSERT_TRUE(daemon_->arena().CopyToHost((*resumed)->optimizer_offset(), seen).ok());
  EXPECT_EQ(seen, trained);
  ASSERT_TRUE((*resumed)->EndOptimizer(/*keep=*/false).ok());
  EXPECT_EQ(checkpoints_.Take(key), nullptr);  // nothing kept for a finished run
  EXPECT_EQ(OptimizerLeases(), 0u);
}

TEST_F(TrainingStateTest, AStatelessRunHasNoAreaAndItsWeightsStillGoBackToTheStore) {
  auto model = memdaemon::MakeSyntheticModel("m", 4, 1 << 20, 5);
  auto stored = daemon_->weights().Register(model->model);
  ASSERT_TRUE(stored.ok()) << stored.status();
  auto state = TrainingState::Begin(daemon_.get(), &checkpoints_, 1, CheckpointKey::Task(1), 0);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ((*state)->optimizer_bytes(), 0u);
  const uint64_t bytes = (*stored)->total_bytes();
  const std::vector<std::byte> trained = Pattern(bytes, 2);
  ASSERT_TRUE(daemon_->arena().CopyFromHost(8 << 20, trained).ok());
  ASSERT_TRUE((*state)->SaveWeights(8 << 20, **stored).ok());
  EXPECT_EQ(std::memcmp((*stored)->host_bytes(), trained.data(), bytes), 0);
}

// Issue 29 item 6: a preempted task's area stays in the arena and its next run takes it as it is;
// a fill job's still goes to host memory (its next bubble may be on another GPU).
TEST_F(TrainingStateTest, APreemptedTasksStateStaysResidentAndItsNextRunCopiesNothing) {
  constexpr uint64_t kBytes = 1 << 20;
  ResidentStates resident(&checkpoints_, UINT64_MAX);
  const CheckpointKey key = CheckpointKey::Task(5);
  auto first = TrainingState::Begin(daemon_.get(), &checkpoints_, 5, key, kBytes, &resident);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE((*first)->restored_resident());
  const uint64_t offset = (*first)->optimizer_offset();
  const std::vector<std::byte> trained = Pattern(kBytes, 3);
  ASSERT_TRUE(daemon_->arena().CopyFromHost(offset, trained).ok());
  ASSERT_TRUE((*first)->EndOptimizer(/*keep=*/true).ok());
  EXPECT_EQ(resident.kept(), 1u);
  EXPECT_EQ(OptimizerLeases(), 1u) << "kept in the arena";
  EXPECT_EQ(checkpoints_.Take(key), nullptr) << "nothing went to host memory";

  auto resumed = TrainingState::Begin(daemon_.get(), &checkpoints_, 5, key, kBytes, &resident);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_TRUE((*resumed)->restored_resident());
  EXPECT_EQ((*resumed)->optimizer_offset(), offset);
  std::vector<std::byte> seen(kBytes);
  ASSERT_TRUE(daemon_->arena().CopyToHost(offset, seen).ok());
  EXPECT_EQ(seen, trained);
  EXPECT_EQ(resident.kept(), 0u);
  ASSERT_TRUE((*resumed)->EndOptimizer(/*keep=*/false).ok());
  EXPECT_EQ(OptimizerLeases(), 0u);

  const CheckpointKey fill = CheckpointKey::FillJob(5);
  auto bubble = TrainingState::Begin(daemon_.get(), &checkpoints_, 6, fill, kBytes, &resident);
  ASSERT_TRUE(bubble.ok()) << bubble.status();
  ASSERT_TRUE((*bubble)->EndOptimizer(/*keep=*/true).ok());
  EXPECT_EQ(resident.kept(), 0u);
  EXPECT_NE(checkpoints_.Take(fill), nullptr);
  EXPECT_EQ(OptimizerLeases(), 0u);
}

// Kept areas give way: beyond the budget, and when a new area does not fit, the oldest goes to
// host memory, byte for byte, and its task's next run is filled from there.
TEST_F(TrainingStateTest, KeptStatesGoToHostMemoryWhenTheBudgetOrTheArenaNeedsTheRoom) {
  constexpr uint64_t kBytes = 1 << 20;
  ResidentStates resident(&checkpoints_, kBytes);  // room for one
  std::vector<std::vector<std::byte>> trained;
  for (uint64_t task = 1; task <= 2; ++task) {
    auto state = TrainingState::Begin(daemon_.get(), &checkpoints_, task, CheckpointKey::Task(task),
                                      kBytes, &resident);
    ASSERT_TRUE(state.ok()) << state.status();
    trained.push_back(Pattern(kBytes, static_cast<int>(task)));
    ASSERT_TRUE(daemon_->arena().CopyFromHost((*state)->optimizer_offset(), trained.back()).ok());
    ASSERT_TRUE((*state)->EndOptimizer(/*keep=*/true).ok());
  }
  // Over the budget: task 1's (the oldest) went to host memory; task 2's stays.
  EXPECT_EQ(resident.kept(), 1u);
  EXPECT_EQ(resident.kept_bytes(), kBytes);
  EXPECT_EQ(OptimizerLeases(), 1u);
  std::unique_ptr<gpu::HostBuffer> saved = checkpoints_.Take(CheckpointKey::Task(1));
  ASSERT_NE(saved, nullptr);
  ASSERT_EQ(saved->size_bytes(), kBytes);
  EXPECT_EQ(std::memcmp(saved->data(), trained[0].data(), kBytes), 0);
  checkpoints_.Put(CheckpointKey::Task(1), std::move(saved));

  // The arena is full but for what task 2's kept area holds: a new run takes its room.
  ResidentStates roomy(&checkpoints_, UINT64_MAX);
  auto kept = resident.Take(CheckpointKey::Task(2));
  ASSERT_TRUE(kept.ok() && *kept != nullptr);
  roomy.Keep(CheckpointKey::Task(2), std::move(*kept));
  std::vector<memdaemon::Lease> fillers;
  while (daemon_->leases().largest_free_bytes() > 0) {
    auto filler = daemon_->leases().Acquire("filler", daemon_->leases().largest_free_bytes());
    ASSERT_TRUE(filler.ok()) << filler.status();
    fillers.push_back(*filler);
  }
  auto third =
      TrainingState::Begin(daemon_.get(), &checkpoints_, 3, CheckpointKey::Task(3), kBytes, &roomy);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(roomy.kept(), 0u);
  (*third).reset();
  // Task 2 resumes from host memory, exactly where it was.
  auto second =
      TrainingState::Begin(daemon_.get(), &checkpoints_, 2, CheckpointKey::Task(2), kBytes, &roomy);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE((*second)->restored_resident());
  std::vector<std::byte> seen(kBytes);
  ASSERT_TRUE(daemon_->arena().CopyToHost((*second)->optimizer_offset(), seen).ok());
  EXPECT_EQ(seen, trained[1]);
  (*second).reset();
  for (const memdaemon::Lease& filler : fillers) {
    ASSERT_TRUE(daemon_->leases().Release(filler.offset, "filler").ok());
  }
  // A dropped task's kept area goes with it.
  auto seventh =
      TrainingState::Begin(daemon_.get(), &checkpoints_, 7, CheckpointKey::Task(7), kBytes, &roomy);
  ASSERT_TRUE(seventh.ok()) << seventh.status();
  ASSERT_TRUE((*seventh)->EndOptimizer(/*keep=*/true).ok());
  EXPECT_EQ(OptimizerLeases(), 1u);
  roomy.Drop(CheckpointKey::Task(7));
  EXPECT_EQ(roomy.kept(), 0u);
  EXPECT_EQ(OptimizerLeases(), 0u);
}

TEST_F(TrainingStateTest, StateTheArenaCannotHoldIsRefused) {
  auto state = TrainingState::Begin(daemon_.get(), &checkpoints_, 4, CheckpointKey::Task(4),
                                    128ull << 20);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(OptimizerLeases(), 0u);
}

}  // namespace
}  // namespace pswitch::controller
