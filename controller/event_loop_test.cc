#include "controller/event_loop.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "controller/loop_timer.h"
#include "controller/task_table.h"
#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

TEST(EventLoopTest, LoopOnlyCodeOffTheLoopsThreadAbortsWithTheReason) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EventLoop loop([] {});
  std::thread runner([&] { loop.Run(); });
  absl::Notification ran;
  ASSERT_TRUE(loop.Post([&] {
    loop.role().AssertHeld();  // on the loop: fine
    ran.Notify();
  }));
  ran.WaitForNotification();
  EXPECT_DEATH(loop.role().AssertHeld(), "off its event loop's thread");
  ASSERT_TRUE(loop.Post([&] { loop.Stop(); }));
  runner.join();
  EXPECT_FALSE(loop.Post([] {})) << "a post after the loop ended is dropped";
}

TEST(LoopTimerTest, ReArmingKeepsOneDeadlineAndInfiniteFutureDisarms) {
  EventLoop loop([] {});
  int due = 0, after = 0;
  LoopTimer timer(
      loop.io(), [&] { ++due; }, [&] { ++after; });
  timer.ArmAt(absl::Now() + absl::Hours(1));
  timer.ArmAt(absl::Now() + absl::Milliseconds(1));  // the earlier one replaces it
  EXPECT_TRUE(timer.armed());
  loop.io().run_for(std::chrono::milliseconds(50));
  EXPECT_EQ(due, 1);
  EXPECT_EQ(after, 1);
  EXPECT_FALSE(timer.armed());
  timer.ArmAt(absl::Now() + absl::Milliseconds(1));
  timer.ArmAt(absl::InfiniteFuture());
  loop.io().restart();
  loop.io().run_for(std::chrono::milliseconds(20));
  EXPECT_EQ(due, 1) << "disarmed before it was due";
}

TEST(TaskTableTest, ADeadlineLeavesTheIndexWithItsTaskOrWhenItExpires) {
  TaskTable table;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  TaskSpec a, b, c;
  a.expires = t0 + absl::Seconds(2);
  b.expires = t0 + absl::Seconds(1);
  table.Add(1, a, [](const absl::StatusOr<TaskOutcome>&) {});
  table.Add(2, b, [](const absl::StatusOr<TaskOutcome>&) {});
  table.Add(3, c, [](const absl::StatusOr<TaskOutcome>&) {});  // no deadline
  table.Add(
      4, b, [](const absl::StatusOr<TaskOutcome>&) {}, /*deadline=*/false);
  EXPECT_EQ(table.NextDeadline(), t0 + absl::Seconds(1));
  ASSERT_TRUE(table.Take(2).has_value());
  EXPECT_EQ(table.NextDeadline(), t0 + absl::Seconds(2)) << "answered: its deadline went too";
  EXPECT_FALSE(table.Take(2).has_value());
  EXPECT_EQ(table.TakeExpired(t0 + absl::Seconds(5)), std::vector<uint64_t>{1});
  EXPECT_EQ(table.NextDeadline(), absl::InfiniteFuture());
  EXPECT_NE(table.Find(1), nullptr) << "expired, not answered yet";

  TaskRecord& r = table.at(1);
  r.StopFor(absl::CancelledError("first"));
  r.StopFor(absl::DeadlineExceededError("second"));
  std::optional<absl::Status> why = r.TakeStopReason();
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->message(), "first") << "the first reason stands";
  EXPECT_FALSE(r.TakeStopReason().has_value()) << "answered once";
}

}  // namespace
}  // namespace pswitch::controller
