#include "memdaemon/state_area.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "memdaemon/host_test_daemon.h"

namespace pswitch::memdaemon {
namespace {

class StateAreaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = HostTestDaemon();
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
  }
  std::vector<std::byte> Read(uint64_t offset, uint64_t bytes) {
    std::vector<std::byte> seen(bytes);
    EXPECT_TRUE(daemon_->arena().CopyToHost(offset, seen).ok());
    return seen;
  }
  std::unique_ptr<MemDaemon> daemon_;
};

// A first run starts from zeros; preemption saves the trained state; the resumed run, in another
// room, starts from exactly those bytes. The rooms stay the caller's: nothing is leased.
TEST_F(StateAreaTest, StateSurvivesPreemptionByteForByte) {
  constexpr uint64_t kBytes = 3 << 20;
  const StateArea::Room first_room{2 << 20, 4 << 20};
  const size_t leases = daemon_->leases().List().size();
  ASSERT_TRUE(daemon_->arena().Fill(first_room.offset, first_room.bytes, 0x5a).ok());
  auto first = StateArea::Fill(*daemon_, first_room, kBytes, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Read(first_room.offset, first_room.bytes),
            std::vector<std::byte>(first_room.bytes, std::byte{0}));
  // The worker trains: the state changes in the arena.
  std::vector<std::byte> trained(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) trained[i] = std::byte(i * 7 + 3);
  ASSERT_TRUE(daemon_->arena().CopyFromHost(first_room.offset, trained).ok());
  auto saved = (*first)->Save();
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ((*saved)->size_bytes(), kBytes);
  EXPECT_EQ(std::memcmp((*saved)->data(), trained.data(), kBytes), 0);

  const StateArea::Room second_room{8 << 20, kBytes};
  auto resumed = StateArea::Fill(*daemon_, second_room, kBytes, std::move(*saved));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(Read(second_room.offset, kBytes), trained);
  auto in_place = StateArea::InPlace(*daemon_, second_room, kBytes);
  ASSERT_TRUE(in_place.ok()) << in_place.status();
  EXPECT_EQ(Read(second_room.offset, kBytes), trained) << "taken as it is";
  EXPECT_EQ(daemon_->leases().List().size(), leases);
}

TEST_F(StateAreaTest, AStateItsRoomCannotHoldIsRefused) {
  EXPECT_EQ(StateArea::Fill(*daemon_, {0, 1 << 20}, (1 << 20) + 1, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  const uint64_t arena = daemon_->arena().size_bytes();
  EXPECT_EQ(StateArea::InPlace(*daemon_, {arena, 1 << 20}, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StateArea::Fill(*daemon_, {0, 1 << 20}, 0, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::memdaemon
