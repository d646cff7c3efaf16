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

TEST_F(TrainingStateTest, StateTheArenaCannotHoldIsRefused) {
  auto state = TrainingState::Begin(daemon_.get(), &checkpoints_, 4, CheckpointKey::Task(4),
                                    128ull << 20);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(OptimizerLeases(), 0u);
}

}  // namespace
}  // namespace pswitch::controller
