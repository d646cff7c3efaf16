#include "controller/bubble_admission.h"

#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

TaskTicket Fill(uint64_t id) { return TaskTicket{id, "m", TaskKind::kTraining, INT32_MIN, {}}; }

TEST(BubbleAdmissionTest, OneRunAtATimeAndOnlyWhenNoTaskWantsTheGpu) {
  BubbleAdmission a;
  ASSERT_TRUE(a.Admit(Fill(1), /*fill_running=*/false).ok());
  EXPECT_EQ(a.Admit(Fill(2), false).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.Next(/*tasks_waiting=*/true), nullptr);  // tasks first: fill uses idle time
  ASSERT_NE(a.Next(false), nullptr);
  EXPECT_EQ(a.Next(false)->id, 1u);
  a.Taken();
  EXPECT_EQ(a.Next(false), nullptr);
  // While it runs, no second one.
  EXPECT_EQ(a.Admit(Fill(3), /*fill_running=*/true).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BubbleAdmissionTest, ARunStillWaitingAtItsBubblesEndIsAnsweredOnce) {
  BubbleAdmission a;
  EXPECT_FALSE(a.EndBubble().has_value());
  ASSERT_TRUE(a.Admit(Fill(4), false).ok());
  EXPECT_EQ(a.EndBubble(), 4u);
  EXPECT_FALSE(a.EndBubble().has_value());
  EXPECT_FALSE(a.waiting());
  EXPECT_TRUE(a.Admit(Fill(5), false).ok());  // the next bubble's
}

}  // namespace
}  // namespace pswitch::controller
