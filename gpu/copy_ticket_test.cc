// The copy ticket's life cycle both backends share, and the copy observer's timer slack.
#include <atomic>
#include <thread>

#include "gpu/internal/job_ticket.h"
#include "gpu/timer_slack.h"
#include "gtest/gtest.h"

namespace pswitch::gpu {
namespace {

// Issue 26, item 2: a job that failed while its work is still queued on the device is stalled,
// not finished: its owner hears of the failure (to release what the work waits for), but may
// neither free its sources nor retire its flags until the engine reports the end.
TEST(CopyTicketTest, AStalledJobIsNotFinishedUntilItsWorkHasRun) {
  int stalls = 0, ends = 0;
  absl::Status stall_reason;
  internal::JobTicket ticket(
      2, [&] { ++ends; },
      [&](const absl::Status& why) {
        ++stalls;
        stall_reason = why;
      });
  EXPECT_FALSE(ticket.stalled());
  ticket.Stall(absl::DeadlineExceededError("previous tenant did not drain"));
  ticket.Stall(absl::DeadlineExceededError("again"));  // reported once
  EXPECT_EQ(stalls, 1);
  EXPECT_EQ(stall_reason.message(), "previous tenant did not drain");
  EXPECT_TRUE(ticket.stalled());
  EXPECT_FALSE(ticket.finished());
  EXPECT_EQ(ends, 0);
  EXPECT_EQ(ticket.Wait(absl::ZeroDuration()).status().code(), absl::StatusCode::kDeadlineExceeded);

  ticket.Finish(absl::DeadlineExceededError("previous tenant did not drain"));
  EXPECT_TRUE(ticket.finished());
  EXPECT_EQ(ends, 1);
  auto ended = ticket.Wait(absl::ZeroDuration());
  EXPECT_EQ(ended.status().message(), "previous tenant did not drain");
}

TEST(CopyTicketTest, AJobThatNeverStallsFinishesAsBefore) {
  int stalls = 0;
  internal::JobTicket ticket(1, nullptr, [&](const absl::Status&) { ++stalls; });
  ticket.RecordGroup(0, GroupTiming{1, 2, 3});
  ticket.Finish(absl::OkStatus());
  EXPECT_EQ(stalls, 0);
  EXPECT_FALSE(ticket.stalled());
  auto timings = ticket.Wait(absl::ZeroDuration());
  ASSERT_TRUE(timings.ok()) << timings.status();
  EXPECT_EQ((*timings)[0].bytes, 3u);
}

// Issue 26, item 5: the copy observer sleeps 5 us between looks at the device; under the
// default 50 us timer slack every observed group time was late by up to that much.
TEST(TimerSlackTest, SetsTheCallingThreadsSlackOnly) {
  auto before = ThreadTimerSlackNs();
  ASSERT_TRUE(before.ok()) << before.status();
  std::atomic<uint64_t> inside{0};
  std::thread observer([&] {
    ASSERT_TRUE(SetThreadTimerSlackNs(1).ok());
    auto now = ThreadTimerSlackNs();
    inside = now.ok() ? *now : 0;
  });
  observer.join();
  EXPECT_EQ(inside.load(), 1u);
  EXPECT_EQ(*ThreadTimerSlackNs(), *before) << "another thread's slack is untouched";
  EXPECT_EQ(SetThreadTimerSlackNs(0).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::gpu
