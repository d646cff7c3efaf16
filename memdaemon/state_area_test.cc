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
  bool Leased(const std::string& owner) const {
    for (const Lease& l : daemon_->leases().List()) {
      if (l.owner == owner) return true;
    }
    return false;
  }
  std::unique_ptr<MemDaemon> daemon_;
};

// A first run starts from zeros; preemption saves the trained state; the resumed run starts
// from exactly those bytes; each time the lease is given back.
TEST_F(StateAreaTest, StateSurvivesPreemptionByteForByte) {
  constexpr uint64_t kBytes = 3 << 20;
  auto first = StateArea::Acquire(*daemon_, "task-1-optimizer", kBytes, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<std::byte> seen(kBytes, std::byte{0x5a});
  ASSERT_TRUE(daemon_->arena().CopyToHost((*first)->offset(), seen).ok());
  EXPECT_EQ(seen, std::vector<std::byte>(kBytes, std::byte{0}));
  // The worker trains: the state changes in the arena.
  std::vector<std::byte> trained(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) trained[i] = std::byte(i * 7 + 3);
  ASSERT_TRUE(daemon_->arena().CopyFromHost((*first)->offset(), trained).ok());
  auto saved = (*first)->SaveAndRelease();
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_FALSE(Leased("task-1-optimizer"));
  first->reset();  // nothing left to release
  ASSERT_EQ((*saved)->size_bytes(), kBytes);
  EXPECT_EQ(std::memcmp((*saved)->data(), trained.data(), kBytes), 0);

  auto resumed = StateArea::Acquire(*daemon_, "task-1-optimizer", kBytes, std::move(*saved));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_TRUE(daemon_->arena().CopyToHost((*resumed)->offset(), seen).ok());
  EXPECT_EQ(seen, trained);
  resumed->reset();  // a finished or failed task: dropped, lease released
  EXPECT_FALSE(Leased("task-1-optimizer"));
}

TEST_F(StateAreaTest, AStateTheArenaCannotHoldIsRefusedNamingTheTask) {
  auto huge = StateArea::Acquire(*daemon_, "task-9-optimizer", 1ull << 30, nullptr);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("task-9-optimizer"), absl::string_view::npos);
  EXPECT_FALSE(Leased("task-9-optimizer"));
}

}  // namespace
}  // namespace pswitch::memdaemon
