#include "fill/partition.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::fill {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

absl::Duration Ms(int64_t ms) { return absl::Milliseconds(ms); }

// period 100 ms:  b0 [0, 30) 4 GiB   b1 [40, 54) 8 GiB   b2 [60, 85) 1 GiB
BubbleCycle ExampleCycle() {
  return BubbleCycle{
      Ms(100), {{Ms(0), Ms(30), 4 * kGiB}, {Ms(40), Ms(14), 8 * kGiB}, {Ms(60), Ms(25), kGiB}}};
}

// 11 steps of 6 ms needing 2 GiB, 2 ms to switch in.
FillWork ExampleWork() { return FillWork{11, Ms(6), 2 * kGiB, Ms(2)}; }

PartitionPlan Plan(const BubbleCycle& cycle, const FillWork& work, absl::Duration start) {
  absl::StatusOr<PartitionPlan> plan = PartitionFillJob(cycle, work, start);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : PartitionPlan{};
}

TEST(PartitionTest, HandComputedExampleFromCycleStart) {
  // Per bubble, with o = 2 ms and d = 6 ms (k steps need 2 + 6k < duration):
  //   b0: 30 ms, 4 GiB >= 2 GiB: 2 + 6k < 30 -> k = 4 (26 ms; 5 would need 32).
  //   b1: 14 ms, 8 GiB: 2 + 6k < 14 -> k = 1. Two steps would end exactly at the bubble's end
  //       (2 + 12 = 14), which the strict rule refuses.
  //   b2: 1 GiB < 2 GiB -> nothing, however long it is.
  // So 5 steps per cycle: cycle 0 runs 4 + 1 (6 left), cycle 1 runs 4 + 1 (1 left), and
  // cycle 2 runs the last step in b0, ending at 2 * 100 + 0 + 2 + 1 * 6 = 208 ms.
  const PartitionPlan plan = Plan(ExampleCycle(), ExampleWork(), absl::ZeroDuration());
  const std::vector<PlanChunk> expected = {
      {0, 0, 4}, {0, 1, 1}, {1, 0, 4}, {1, 1, 1}, {2, 0, 1},
  };
  EXPECT_EQ(plan.chunks, expected);
  EXPECT_EQ(plan.completion, Ms(208));
}

TEST(PartitionTest, HandComputedExampleStartingMidCycle) {
  // Starting at 35 ms: b0 of cycle 0 has begun, so cycle 0 offers only b1 (1 step, 10 left);
  // cycles 1 and 2 run 4 + 1 each (5 then 0 left), the last step in b1 of cycle 2:
  // 2 * 100 + 40 + 2 + 1 * 6 = 248 ms.
  const PartitionPlan plan = Plan(ExampleCycle(), ExampleWork(), Ms(35));
  const std::vector<PlanChunk> expected = {
      {0, 1, 1}, {1, 0, 4}, {1, 1, 1}, {2, 0, 4}, {2, 1, 1},
  };
  EXPECT_EQ(plan.chunks, expected);
  EXPECT_EQ(plan.completion, Ms(248));
}

TEST(PartitionTest, StartIsOnTheTimelineNotWithinOneCycle) {
  // 1040 ms is 40 ms into cycle 10: b1 begins exactly then and is usable.
  FillWork one_step = ExampleWork();
  one_step.steps = 1;
  const PartitionPlan plan = Plan(ExampleCycle(), one_step, Ms(1040));
  EXPECT_EQ(plan.chunks, (std::vector<PlanChunk>{{10, 1, 1}}));
  EXPECT_EQ(plan.completion, Ms(1000 + 40 + 2 + 6));
}

TEST(PartitionTest, StepsPerBubbleAppliesMemoryAndTheStrictTimeRule) {
  const FillWork work = ExampleWork();
  const BubbleCycle cycle = ExampleCycle();
  EXPECT_EQ(StepsPerBubble(cycle.bubbles[0], work), 4);
  EXPECT_EQ(StepsPerBubble(cycle.bubbles[1], work), 1);
  EXPECT_EQ(StepsPerBubble(cycle.bubbles[2], work), 0);
  EXPECT_EQ(StepsPerBubble(Bubble{Ms(0), Ms(2), 8 * kGiB}, work), 0);  // overhead only
  EXPECT_EQ(StepsPerBubble(Bubble{Ms(0), Ms(8), 8 * kGiB}, work), 0);  // exact fit of one step
  EXPECT_EQ(StepsPerBubble(Bubble{Ms(0), absl::Nanoseconds(8'000'001), 8 * kGiB}, work), 1);
  // Exactly the memory needed is enough.
  EXPECT_EQ(StepsPerBubble(Bubble{Ms(0), Ms(30), 2 * kGiB}, work), 4);
}

TEST(PartitionTest, PredictionMatchesThePlanWithoutListingIt) {
  for (int64_t steps : {1, 4, 5, 6, 11, 12, 97, 1000}) {
    for (int64_t start_ms : {0, 1, 35, 40, 41, 99, 100, 12345}) {
      FillWork work = ExampleWork();
      work.steps = steps;
      const PartitionPlan plan = Plan(ExampleCycle(), work, Ms(start_ms));
      absl::StatusOr<absl::Duration> predicted =
          PredictFillCompletion(ExampleCycle(), work, Ms(start_ms));
      ASSERT_TRUE(predicted.ok()) << predicted.status();
      EXPECT_EQ(*predicted, plan.completion) << steps << " steps from " << start_ms << " ms";
      int64_t planned = 0;
      for (const PlanChunk& chunk : plan.chunks) planned += chunk.steps;
      EXPECT_EQ(planned, steps);
    }
  }
}

TEST(PartitionTest, EveryChunkFitsItsBubble) {
  FillWork work = ExampleWork();
  work.steps = 50;
  const BubbleCycle cycle = ExampleCycle();
  for (const PlanChunk& chunk : Plan(cycle, work, Ms(7)).chunks) {
    const Bubble& bubble = cycle.bubbles[chunk.bubble];
    EXPECT_GE(bubble.free_bytes, work.memory_bytes);
    EXPECT_LT(work.switch_overhead + work.step_duration * chunk.steps, bubble.duration);
  }
}

TEST(PartitionTest, PredictionScalesToHugeJobs) {
  FillWork work = ExampleWork();
  work.steps = 5'000'000'001;  // 10^9 cycles of 5 steps, then one step in b0
  absl::StatusOr<absl::Duration> predicted =
      PredictFillCompletion(ExampleCycle(), work, absl::ZeroDuration());
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  EXPECT_EQ(*predicted, Ms(100) * 1'000'000'000 + Ms(2 + 6));
  EXPECT_EQ(PartitionFillJob(ExampleCycle(), work, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(PartitionTest, ZeroStepsCompleteAtTheStart) {
  FillWork work = ExampleWork();
  work.steps = 0;
  const PartitionPlan plan = Plan(ExampleCycle(), work, Ms(17));
  EXPECT_TRUE(plan.chunks.empty());
  EXPECT_EQ(plan.completion, Ms(17));
}

TEST(PartitionTest, JobThatNeverFitsSaysWhy) {
  FillWork too_big = ExampleWork();
  too_big.memory_bytes = 9 * kGiB;
  absl::Status memory = PartitionFillJob(ExampleCycle(), too_big, absl::ZeroDuration()).status();
  EXPECT_EQ(memory.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(memory.message(), HasSubstr("no bubble has enough free memory"));

  FillWork too_long = ExampleWork();
  too_long.step_duration = Ms(28);  // b0 would need 2 + 28 < 30: exact fit, refused
  absl::Status time =
      PredictFillCompletion(ExampleCycle(), too_long, absl::ZeroDuration()).status();
  EXPECT_EQ(time.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(time.message(), HasSubstr("last at most 30ms"));

  absl::Status empty =
      PartitionFillJob(BubbleCycle{Ms(100), {}}, ExampleWork(), absl::ZeroDuration()).status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(empty.message(), HasSubstr("no bubbles"));
}

TEST(PartitionTest, RejectsInvalidInputs) {
  const auto code = [](const BubbleCycle& cycle, const FillWork& work, absl::Duration start) {
    return PartitionFillJob(cycle, work, start).status().code();
  };
  FillWork work = ExampleWork();
  EXPECT_EQ(code(ExampleCycle(), work, -Ms(1)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ExampleCycle(), work, absl::InfiniteDuration()),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(BubbleCycle{Ms(0), {}}, work, Ms(0)), absl::StatusCode::kInvalidArgument);
  work.step_duration = absl::ZeroDuration();
  EXPECT_EQ(code(ExampleCycle(), work, Ms(0)), absl::StatusCode::kInvalidArgument);
  work = ExampleWork();
  work.steps = -1;
  EXPECT_EQ(code(ExampleCycle(), work, Ms(0)), absl::StatusCode::kInvalidArgument);
  work = ExampleWork();
  work.switch_overhead = -Ms(1);
  EXPECT_EQ(code(ExampleCycle(), work, Ms(0)), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::fill
