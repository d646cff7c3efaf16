// Tests of the GPipe and 1F1B op orders.
#include "pipeline/schedule.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::pipeline {
namespace {

using ::testing::HasSubstr;

std::string Ops(const std::vector<Op>& ops) {
  std::string out;
  for (const Op& op : ops) out += OpName(op) + " ";
  return out;
}

TEST(ScheduleTest, GpipeRunsAllForwardsThenAllBackwards) {
  auto schedule = BuildSchedule(ScheduleKind::kGpipe, 3, 4);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  ASSERT_EQ(schedule->ops.size(), 3u);
  for (const auto& ops : schedule->ops) {
    EXPECT_EQ(Ops(ops), "F0 F1 F2 F3 B0 B1 B2 B3 ");
    EXPECT_EQ(PeakInFlight(ops), 4);
  }
}

TEST(ScheduleTest, OneFOneBWarmsUpThenAlternatesThenDrains) {
  auto schedule = BuildSchedule(ScheduleKind::kOneFOneB, 4, 6);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ(Ops(schedule->ops[0]), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(Ops(schedule->ops[2]), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5 ");
  EXPECT_EQ(Ops(schedule->ops[3]), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
}

TEST(ScheduleTest, EveryStageRunsEachOpOnceAndOneFOneBBoundsInFlight) {
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB}) {
    for (int stages = 1; stages <= 8; ++stages) {
      for (int microbatches = 1; microbatches <= 12; ++microbatches) {
        auto schedule = BuildSchedule(kind, stages, microbatches);
        ASSERT_TRUE(schedule.ok()) << schedule.status();
        EXPECT_TRUE(ValidateSchedule(*schedule).ok());
        for (int s = 0; s < stages; ++s) {
          const auto& ops = schedule->ops[s];
          EXPECT_EQ(ops.size(), 2u * microbatches);
          const int peak = PeakInFlight(ops);
          if (kind == ScheduleKind::kGpipe) {
            EXPECT_EQ(peak, microbatches);
          } else {
            // Stage s holds at most S - s micro-batches: the 1F1B memory advantage.
            EXPECT_LE(peak, stages);
            EXPECT_EQ(peak, std::min(stages - s, microbatches)) << "S=" << stages << " s=" << s;
          }
        }
      }
    }
  }
}

TEST(ScheduleTest, ValidateRejectsBackwardBeforeForwardAndMissingOps) {
  Schedule bad{ScheduleKind::kGpipe, 1, 2, {{{OpKind::kBackward, 0}, {OpKind::kForward, 0}}}};
  EXPECT_THAT(std::string(ValidateSchedule(bad).message()), HasSubstr("B0 runs before"));
  Schedule missing{ScheduleKind::kGpipe, 1, 2, {{{OpKind::kForward, 0}, {OpKind::kBackward, 0}}}};
  EXPECT_THAT(std::string(ValidateSchedule(missing).message()), HasSubstr("micro-batch 1"));
}

TEST(ScheduleTest, BadArgumentsAreClearErrors) {
  EXPECT_EQ(BuildSchedule(ScheduleKind::kGpipe, 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildSchedule(ScheduleKind::kGpipe, 4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildSchedule(ScheduleKind::kGpipe, kMaxStages + 1, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseScheduleKind("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(*ParseScheduleKind("gpipe"), ScheduleKind::kGpipe);
  EXPECT_THAT(std::string(ParseScheduleKind("pipedream").status().message()),
              HasSubstr("gpipe or 1f1b"));
}

}  // namespace
}  // namespace pswitch::pipeline
