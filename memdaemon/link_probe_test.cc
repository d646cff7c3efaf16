#include "memdaemon/link_probe.h"

#include "gtest/gtest.h"

namespace pswitch::memdaemon {
namespace {

std::unique_ptr<MemDaemon> OpenDaemon(double bandwidth_cap) {
  MemDaemonOptions options;
  options.arena_bytes = 64 << 20;
  options.device.copy_bandwidth_bytes_per_s = bandwidth_cap;
  auto daemon = MemDaemon::Create(options);
  EXPECT_TRUE(daemon.ok()) << daemon.status();
  return daemon.ok() ? std::move(*daemon) : nullptr;
}

bool HasProbeLease(MemDaemon& daemon) {
  for (const Lease& lease : daemon.leases().List()) {
    if (lease.owner == "link-probe") return true;
  }
  return false;
}

// The host engine paces copies to its cap, so the probe can never report a faster link; it
// leaves the borrowed flag at 0 (a later switch's first epoch must not pass early) and no lease.
TEST(LinkProbeTest, MeasuresTheCappedLinkAndGivesBackWhatItBorrowed) {
  constexpr double kCap = 400e6;
  std::unique_ptr<MemDaemon> daemon = OpenDaemon(kCap);
  ASSERT_NE(daemon, nullptr);
  absl::StatusOr<double> rate = MeasureLinkBandwidth(*daemon, {.bytes = 8 << 20, .repeats = 3});
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_GT(*rate, 0);
  EXPECT_LE(*rate, kCap * 1.05);
  EXPECT_EQ(*daemon->ready_flags().Load(0), 0u);
  EXPECT_FALSE(HasProbeLease(*daemon));
}

TEST(LinkProbeTest, RefusesWhatCannotBeMeasuredAndLeavesNothingBehind) {
  std::unique_ptr<MemDaemon> daemon = OpenDaemon(0);
  ASSERT_NE(daemon, nullptr);
  EXPECT_EQ(MeasureLinkBandwidth(*daemon, {.bytes = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureLinkBandwidth(*daemon, {.bytes = 1 << 20, .repeats = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Larger than the arena: no lease can hold it.
  EXPECT_EQ(MeasureLinkBandwidth(*daemon, {.bytes = 128 << 20}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(HasProbeLease(*daemon));
  EXPECT_EQ(*daemon->ready_flags().Load(0), 0u);
}

}  // namespace
}  // namespace pswitch::memdaemon
