#include "controller/stop_deadline.h"

#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(StopDeadlineTest, ExpiresOnceAtItsDeadlineWithItsReason) {
  StopDeadline d;
  EXPECT_EQ(d.deadline(), absl::InfiniteFuture());
  d.Arm(7, kT0 + absl::Seconds(1), "did not drain");
  EXPECT_FALSE(d.Due(kT0).has_value());
  auto expired = d.Due(kT0 + absl::Seconds(1));
  ASSERT_TRUE(expired.has_value());
  EXPECT_EQ(expired->task, 7u);
  EXPECT_EQ(expired->reason, "did not drain");
  EXPECT_FALSE(d.Due(kT0 + absl::Seconds(2)).has_value());
  EXPECT_EQ(d.deadline(), absl::InfiniteFuture());
}

TEST(StopDeadlineTest, TheEarliestDeadlineForATaskStands) {
  StopDeadline d;
  d.Arm(7, kT0 + absl::Seconds(30), "did not drain");
  d.Arm(7, kT0 + absl::Milliseconds(5), "did not pause");  // the bubble's grace is shorter
  d.Arm(7, kT0 + absl::Seconds(60), "later");                // does not postpone it
  EXPECT_EQ(d.deadline(), kT0 + absl::Milliseconds(5));
  EXPECT_EQ(d.Due(kT0 + absl::Seconds(1))->reason, "did not pause");
}

TEST(StopDeadlineTest, AnsweringInTimeDisarmsOnlyItsOwnTask) {
  StopDeadline d;
  d.Arm(7, kT0, "x");
  d.Met(8);
  EXPECT_TRUE(d.Due(kT0).has_value());
  d.Arm(7, kT0, "x");
  d.Met(7);
  EXPECT_FALSE(d.Due(kT0 + absl::Hours(1)).has_value());
  // Another task's deadline replaces the previous one, later or not.
  d.Arm(7, kT0, "x");
  d.Arm(9, kT0 + absl::Seconds(3), "y");
  EXPECT_FALSE(d.Due(kT0 + absl::Seconds(1)).has_value());
  EXPECT_EQ(d.Due(kT0 + absl::Seconds(3))->task, 9u);
}

}  // namespace
}  // namespace pswitch::controller
