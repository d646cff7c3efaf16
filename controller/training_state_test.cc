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
  std::vector<std::byte> Read(uint64_t offset, uint64_t bytes) {
    std::vector<std::byte> seen(bytes);
    EXPECT_TRUE(daemon_->arena().CopyToHost(offset, seen).ok());
    return seen;
  }
  // Rooms in the arena as the weights cache would give them (any range of it: the test daemon
  // has no other tenant).
  static constexpr memdaemon::StateArea::Room kRoomA{4 << 20, 2 << 20};
  static constexpr memdaemon::StateArea::Room kRoomB{8 << 20, 2 << 20};
  std::unique_ptr<memdaemon::MemDaemon> daemon_;
  StateCheckpoints checkpoints_;
};

TEST_F(TrainingStateTest, APreemptedRunsOptimizerStateComesBackExactlyAndAFinishedOneIsDropped) {
  constexpr uint64_t kBytes = 1 << 20;
  const CheckpointKey key = CheckpointKey::FillJob(3);
  // Whatever the room held before (another model's weights): the state starts from zeros, and
  // so does the room past it, which the worker is given as well.
  ASSERT_TRUE(daemon_->arena().Fill(kRoomA.offset, kRoomA.bytes, 0x77).ok());
  auto first = TrainingState::Begin(daemon_.get(), &checkpoints_, 9, key, kBytes, kRoomA);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ((*first)->optimizer_bytes(), kBytes);
  ASSERT_EQ((*first)->optimizer_offset(), kRoomA.offset);
  EXPECT_FALSE((*first)->restored_resident());
  EXPECT_EQ(Read(kRoomA.offset, kRoomA.bytes), std::vector<std::byte>(kRoomA.bytes, std::byte{0}));
  const std::vector<std::byte> trained = Pattern(kBytes, 1);
  ASSERT_TRUE(daemon_->arena().CopyFromHost(kRoomA.offset, trained).ok());
  ASSERT_TRUE((*first)->EndOptimizer(/*keep=*/true, /*in_place=*/false).ok());
  EXPECT_EQ((*first)->optimizer_bytes(), 0u);  // ended

  // Its next run is elsewhere in the pool: filled from host memory, byte for byte.
  auto resumed = TrainingState::Begin(daemon_.get(), &checkpoints_, 10, key, kBytes, kRoomB);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(Read(kRoomB.offset, kBytes), trained);
  ASSERT_TRUE((*resumed)->EndOptimizer(/*keep=*/false, /*in_place=*/false).ok());
  EXPECT_EQ(checkpoints_.Take(key), nullptr);  // nothing kept for a finished run
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

// Issue 29 item 6: a preempted task's state stays where it is and its next run takes it as it
// is; when the pool needs the room it goes to host memory exactly (SaveKeptState) and the next
// run is filled from there.
TEST_F(TrainingStateTest, AStateKeptInPlaceIsTakenAsItIsAndSavedExactlyWhenItsRoomIsNeeded) {
  constexpr uint64_t kBytes = 1 << 20;
  const CheckpointKey key = CheckpointKey::Task(5);
  auto first = TrainingState::Begin(daemon_.get(), &checkpoints_, 5, key, kBytes, kRoomA);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::vector<std::byte> trained = Pattern(kBytes, 3);
  ASSERT_TRUE(daemon_->arena().CopyFromHost(kRoomA.offset, trained).ok());
  ASSERT_TRUE((*first)->EndOptimizer(/*keep=*/true, /*in_place=*/true).ok());
  EXPECT_EQ(checkpoints_.Take(key), nullptr) << "nothing went to host memory";

  auto resumed =
      TrainingState::Begin(daemon_.get(), &checkpoints_, 5, key, kBytes, kRoomA, /*resident=*/true);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_TRUE((*resumed)->restored_resident());
  EXPECT_EQ((*resumed)->optimizer_offset(), kRoomA.offset);
  EXPECT_EQ(Read(kRoomA.offset, kBytes), trained);
  ASSERT_TRUE((*resumed)->EndOptimizer(/*keep=*/true, /*in_place=*/true).ok());

  ASSERT_TRUE(SaveKeptState(*daemon_, checkpoints_, key, kRoomA, kBytes).ok());
  ASSERT_TRUE(daemon_->arena().Fill(kRoomA.offset, kRoomA.bytes, 0x55).ok());  // taken since
  auto from_host = TrainingState::Begin(daemon_.get(), &checkpoints_, 5, key, kBytes, kRoomB);
  ASSERT_TRUE(from_host.ok()) << from_host.status();
  EXPECT_FALSE((*from_host)->restored_resident());
  EXPECT_EQ(Read(kRoomB.offset, kBytes), trained);
}

TEST_F(TrainingStateTest, AStateLargerThanItsRoomOrARoomOutsideTheArenaIsRefusedNamingTheTask) {
  auto state = TrainingState::Begin(daemon_.get(), &checkpoints_, 4, CheckpointKey::Task(4),
                                    kRoomA.bytes + 1, kRoomA);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(state.status().message().find("task 4"), absl::string_view::npos);
  const uint64_t arena = daemon_->arena().size_bytes();
  auto outside = TrainingState::Begin(daemon_.get(), &checkpoints_, 6, CheckpointKey::Task(6),
                                      1 << 20, {arena - (1 << 20), 2 << 20});
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SaveKeptState(*daemon_, checkpoints_, CheckpointKey::Task(6),
                          {arena - (1 << 20), 2 << 20}, 1 << 20)
                .code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(checkpoints_.Take(CheckpointKey::Task(6)), nullptr);
}

}  // namespace
}  // namespace pswitch::controller
