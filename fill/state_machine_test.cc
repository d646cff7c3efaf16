#include "fill/state_machine.h"

#include <map>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::fill {
namespace {

using ::testing::HasSubstr;

constexpr FillState kAllStates[] = {FillState::kSubmitted, FillState::kCreated, FillState::kPaused,
                                    FillState::kRunning, FillState::kStopped};
constexpr FillEvent kAllEvents[] = {FillEvent::kCreate,      FillEvent::kInit,  FillEvent::kStart,
                                    FillEvent::kRunNextStep, FillEvent::kPause, FillEvent::kStop};

TEST(FillStateMachineTest, EveryStateEventPairMatchesTheTransitionTable) {
  const std::map<std::pair<FillState, FillEvent>, FillState> legal = {
      {{FillState::kSubmitted, FillEvent::kCreate}, FillState::kCreated},
      {{FillState::kCreated, FillEvent::kInit}, FillState::kPaused},
      {{FillState::kPaused, FillEvent::kStart}, FillState::kRunning},
      {{FillState::kRunning, FillEvent::kRunNextStep}, FillState::kRunning},
      {{FillState::kRunning, FillEvent::kPause}, FillState::kPaused},
      {{FillState::kSubmitted, FillEvent::kStop}, FillState::kStopped},
      {{FillState::kCreated, FillEvent::kStop}, FillState::kStopped},
      {{FillState::kPaused, FillEvent::kStop}, FillState::kStopped},
      {{FillState::kRunning, FillEvent::kStop}, FillState::kStopped},
  };
  for (FillState state : kAllStates) {
    for (FillEvent event : kAllEvents) {
      SCOPED_TRACE(testing::Message() << FillStateName(state) << " + " << FillEventName(event));
      absl::StatusOr<FillState> next = NextState(state, event);
      auto it = legal.find({state, event});
      if (it != legal.end()) {
        ASSERT_TRUE(next.ok()) << next.status();
        EXPECT_EQ(*next, it->second);
      } else {
        ASSERT_FALSE(next.ok());
        EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_THAT(next.status().message(), HasSubstr(FillStateName(state)));
        EXPECT_THAT(next.status().message(), HasSubstr(FillEventName(event)));
      }
    }
  }
}

TEST(FillStateMachineTest, BubbleLifecycleCountsTransitionsAndSteps) {
  FillTaskStateMachine task;
  EXPECT_EQ(task.state(), FillState::kSubmitted);
  ASSERT_TRUE(task.Apply(FillEvent::kCreate).ok());
  ASSERT_TRUE(task.Apply(FillEvent::kInit).ok());
  // Two bubbles: three steps in the first, one in the second (FreeRide Figure 3b).
  ASSERT_TRUE(task.Apply(FillEvent::kStart).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(task.Apply(FillEvent::kRunNextStep).ok());
  ASSERT_TRUE(task.Apply(FillEvent::kPause).ok());
  EXPECT_EQ(task.state(), FillState::kPaused);
  ASSERT_TRUE(task.Apply(FillEvent::kStart).ok());
  ASSERT_TRUE(task.Apply(FillEvent::kRunNextStep).ok());
  ASSERT_TRUE(task.Apply(FillEvent::kStop).ok());
  EXPECT_TRUE(task.stopped());
  EXPECT_EQ(task.steps_run(), 4);
  EXPECT_EQ(task.transitions(), 10);
}

TEST(FillStateMachineTest, PausedTaskCanBeCancelled) {
  FillTaskStateMachine task;
  ASSERT_TRUE(task.Apply(FillEvent::kCreate).ok());
  ASSERT_TRUE(task.Apply(FillEvent::kInit).ok());
  EXPECT_TRUE(task.Apply(FillEvent::kStop).ok());
  EXPECT_EQ(task.state(), FillState::kStopped);
}

TEST(FillStateMachineTest, RejectedEventLeavesStateAndCountersUnchanged) {
  FillTaskStateMachine task;
  ASSERT_TRUE(task.Apply(FillEvent::kCreate).ok());
  absl::Status status = task.Apply(FillEvent::kRunNextStep);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "fill task: RunNextStep is not allowed in state CREATED");
  EXPECT_EQ(task.state(), FillState::kCreated);
  EXPECT_EQ(task.transitions(), 1);
  EXPECT_EQ(task.steps_run(), 0);
}

TEST(FillStateMachineTest, PausingAPausedTaskIsAnError) {
  // FreeRide's Algorithm 2 would pause a task it only initialised in this bubble; the manager
  // must check the state instead.
  FillTaskStateMachine task;
  ASSERT_TRUE(task.Apply(FillEvent::kCreate).ok());
  ASSERT_TRUE(task.Apply(FillEvent::kInit).ok());
  EXPECT_EQ(task.Apply(FillEvent::kPause).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(FillStateMachineTest, StoppedIsTerminal) {
  FillTaskStateMachine task;
  ASSERT_TRUE(task.Apply(FillEvent::kStop).ok());
  for (FillEvent event : kAllEvents) {
    EXPECT_EQ(task.Apply(event).code(), absl::StatusCode::kFailedPrecondition)
        << FillEventName(event);
  }
  EXPECT_EQ(task.transitions(), 1);
}

TEST(FillStateMachineTest, NamesFollowThePaper) {
  EXPECT_EQ(FillStateName(FillState::kSubmitted), "SUBMITTED");
  EXPECT_EQ(FillStateName(FillState::kRunning), "RUNNING");
  EXPECT_EQ(FillEventName(FillEvent::kCreate), "CreateSideTask");
  EXPECT_EQ(FillEventName(FillEvent::kInit), "InitSideTask");
  EXPECT_EQ(FillEventName(FillEvent::kStart), "StartSideTask");
  EXPECT_EQ(FillEventName(FillEvent::kPause), "PauseSideTask");
  EXPECT_EQ(FillEventName(FillEvent::kStop), "StopSideTask");
}

}  // namespace
}  // namespace pswitch::fill
