// Tests of the schedule simulator: dependencies, bubbles, and the analytic bubble ratio.
#include "pipeline/simulator.h"

#include <cmath>
#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::pipeline {
namespace {

using ::testing::HasSubstr;

std::vector<StageCost> Uniform(int stages, double fwd_ms, double bwd_ms) {
  return std::vector<StageCost>(stages,
                                StageCost{absl::Milliseconds(fwd_ms), absl::Milliseconds(bwd_ms)});
}

// Every op starts after what it consumes has been produced, and a stage runs one op at a time.
void ExpectDependenciesHold(const Schedule& schedule, const SimulatedIteration& sim) {
  const int S = schedule.stages;
  std::vector<std::map<int, TimedOp>> fwd(S), bwd(S);
  for (int s = 0; s < S; ++s) {
    absl::Duration free_at;
    for (const TimedOp& t : sim.stages[s].ops) {
      EXPECT_GE(t.start, free_at) << "stage " << s << " overlaps at " << OpName(t.op);
      free_at = t.end;
      (t.op.kind == OpKind::kForward ? fwd : bwd)[s][t.op.microbatch] = t;
    }
  }
  for (int s = 0; s < S; ++s) {
    for (int m = 0; m < schedule.microbatches; ++m) {
      if (s > 0) {
        EXPECT_GE(fwd[s][m].start, fwd[s - 1][m].end) << "F" << m << " on " << s;
      }
      if (s < S - 1) {
        EXPECT_GE(bwd[s][m].start, bwd[s + 1][m].end) << "B" << m << " on " << s;
      }
      EXPECT_GE(bwd[s][m].start, fwd[s][m].end);
    }
  }
}

TEST(SimulatorTest, DependenciesHoldForNonUniformCosts) {
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB}) {
    for (int stages = 1; stages <= 6; ++stages) {
      for (int microbatches = 1; microbatches <= 9; ++microbatches) {
        auto schedule = BuildSchedule(kind, stages, microbatches);
        ASSERT_TRUE(schedule.ok());
        std::vector<StageCost> costs;
        for (int s = 0; s < stages; ++s) {
          costs.push_back({absl::Microseconds(700 + 310 * ((s * 7) % 5)),
                           absl::Microseconds(1300 + 170 * ((s * 3) % 4))});
        }
        auto sim = Simulate(*schedule, costs);
        ASSERT_TRUE(sim.ok()) << sim.status();
        ExpectDependenciesHold(*schedule, *sim);
        for (const StageTimeline& stage : sim->stages) {
          absl::Duration idle;
          for (const IdleInterval& i : stage.idle) idle += i.duration;
          EXPECT_EQ(idle, stage.idle_total);
          EXPECT_EQ(stage.busy + stage.idle_total, sim->iteration);
        }
      }
    }
  }
}

TEST(SimulatorTest, GpipeBubbleRatioIsAnalyticForUniformCosts) {
  for (int stages = 1; stages <= 8; ++stages) {
    for (int microbatches = 1; microbatches <= 16; ++microbatches) {
      auto schedule = BuildSchedule(ScheduleKind::kGpipe, stages, microbatches);
      ASSERT_TRUE(schedule.ok());
      auto sim = Simulate(*schedule, Uniform(stages, 5, 10));
      ASSERT_TRUE(sim.ok());
      EXPECT_NEAR(sim->bubble_ratio, UniformBubbleRatio(stages, microbatches), 1e-12);
      EXPECT_EQ(sim->iteration, absl::Milliseconds(15) * (microbatches + stages - 1));
    }
  }
}

TEST(SimulatorTest, GpipeBubblesSitWhereTheTheorySaysTheyDo) {
  // Stage s waits s*f for its first input, (S-1-s)*(f+b) between its forwards and backwards,
  // and s*b at the end while the stages before it finish their backwards.
  const int S = 4, M = 8;
  auto schedule = BuildSchedule(ScheduleKind::kGpipe, S, M);
  auto sim = Simulate(*schedule, Uniform(S, 5, 10));
  ASSERT_TRUE(sim.ok());
  for (int s = 0; s < S; ++s) {
    const StageTimeline& t = sim->stages[s];
    EXPECT_EQ(t.IdleBefore(0), absl::Milliseconds(5 * s));
    EXPECT_EQ(t.IdleBefore(M), absl::Milliseconds(15 * (S - 1 - s)));
    EXPECT_EQ(t.IdleBefore(2 * M), absl::Milliseconds(10 * s));
    EXPECT_EQ(t.idle_total, absl::Milliseconds(15 * (S - 1)));
  }
  EXPECT_EQ(sim->stages[0].idle.size(), 1u);  // only the wait for the first gradient
}

TEST(SimulatorTest, OneFOneBHasGpipesBubbleWithFewerMicrobatchesInFlight) {
  for (int stages = 2; stages <= 6; ++stages) {
    for (int microbatches = 1; microbatches <= 12; ++microbatches) {
      auto gpipe = BuildSchedule(ScheduleKind::kGpipe, stages, microbatches);
      auto one_f_one_b = BuildSchedule(ScheduleKind::kOneFOneB, stages, microbatches);
      auto g = Simulate(*gpipe, Uniform(stages, 5, 10));
      auto o = Simulate(*one_f_one_b, Uniform(stages, 5, 10));
      ASSERT_TRUE(g.ok() && o.ok());
      EXPECT_EQ(o->iteration, g->iteration) << "S=" << stages << " M=" << microbatches;
      EXPECT_NEAR(o->bubble_ratio, g->bubble_ratio, 1e-12);
      for (int s = 0; s < stages; ++s) {
        EXPECT_EQ(o->stages[s].idle_total, g->stages[s].idle_total);
        EXPECT_LE(PeakInFlight(one_f_one_b->ops[s]), stages);
        EXPECT_LE(PeakInFlight(one_f_one_b->ops[s]), PeakInFlight(gpipe->ops[s]));
      }
      if (microbatches > stages) {
        EXPECT_LT(PeakInFlight(one_f_one_b->ops[0]), PeakInFlight(gpipe->ops[0]));
      }
    }
  }
}

TEST(SimulatorTest, DeadlockedScheduleIsReported) {
  // Stage 1 wants F1 before F0, but stage 0 only sends F1 after B0, which needs stage 1's F0.
  Schedule schedule{ScheduleKind::kGpipe, 2, 2, {}};
  schedule.ops = {{{OpKind::kForward, 0},
                   {OpKind::kBackward, 0},
                   {OpKind::kForward, 1},
                   {OpKind::kBackward, 1}},
                  {{OpKind::kForward, 1},
                   {OpKind::kForward, 0},
                   {OpKind::kBackward, 0},
                   {OpKind::kBackward, 1}}};
  auto sim = Simulate(schedule, Uniform(2, 1, 1));
  ASSERT_EQ(sim.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(sim.status().message()), HasSubstr("stage 1 at F1"));
}

TEST(SimulatorTest, WrongNumberOfCostsIsInvalid) {
  auto schedule = BuildSchedule(ScheduleKind::kGpipe, 3, 2);
  EXPECT_EQ(Simulate(*schedule, Uniform(2, 1, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::pipeline
