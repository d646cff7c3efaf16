// Runs whole pipelines with simulated compute: the bubbles the stages announce against the
// simulator's prediction, and failure handling with real stage processes.
#include "pipeline/stage_runner.h"

#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipeline/bubble_reporter.h"
#include "pipeline/coordinator.h"
#include "pipeline/stage_compute.h"

namespace pswitch::pipeline {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kFreeBytes = 3u << 20;

// A stage body with sleeping ops of `cost`, reporting bubbles to `log` when given.
StageMain SimulatedStage(StageCost cost, BubbleLog* log = nullptr, int crash_stage = -1,
                         int crash_iteration = -1) {
  return [=](StageConfig config, StageLinks& links) -> absl::Status {
    config.bubble_free_bytes = kFreeBytes;
    if (config.stage == crash_stage) config.crash_at_iteration = crash_iteration;
    auto compute = SimulatedCompute::WithCost(cost);
    NullReporter null_reporter;
    RecordingReporter recording(log);
    BubbleReporter& reporter =
        log ? static_cast<BubbleReporter&>(recording) : static_cast<BubbleReporter&>(null_reporter);
    return ServeStage(config, links, *compute, reporter);
  };
}

struct BubbleCase {
  ScheduleKind kind;
  const char* name;
};

class SimulatedPipelineTest : public ::testing::TestWithParam<BubbleCase> {};

// What must hold exactly: each announced bubble's expected duration is one the simulator
// predicts for that stage, and the free bytes are the configured ones. The measured durations
// are checked loosely and in aggregate (median error, bubble ratio): CI has 2 busy cores, and a
// stage delayed by the OS can even find a predicted bubble's message already waiting.
TEST_P(SimulatedPipelineTest, AnnouncedBubblesMatchTheSimulator) {
  const int S = 4, M = 4, kWarmup = 1, kIterations = 3;
  const StageCost cost{absl::Milliseconds(3), absl::Milliseconds(6)};
  PipelineOptions options;
  options.schedule = GetParam().kind;
  options.stages = S;
  options.microbatches = M;
  options.warmup = kWarmup;
  options.iterations = kIterations;
  options.receive_timeout = absl::Seconds(20);
  options.launch = StageLaunch::kThreads;
  BubbleLog log;
  auto report = RunPipeline(options, SimulatedStage(cost, &log));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(log.MisorderedStages().empty());

  const SimulatedIteration& predicted = report->predicted;
  EXPECT_EQ(predicted.iteration, absl::Milliseconds(9) * (M + S - 1));
  EXPECT_NEAR(predicted.bubble_ratio, UniformBubbleRatio(S, M), 1e-9);
  size_t announced = 0, predicted_count = 0;
  std::vector<absl::Duration> errors;
  for (const BubbleRecord& r : log.Records()) {
    EXPECT_EQ(r.free_bytes, kFreeBytes);
    ASSERT_NE(r.end, absl::InfinitePast()) << "bubble of stage " << r.stage << " never ended";
    // Waits the simulator does not predict (a message arriving just in time) announce zero.
    if (r.expected == absl::ZeroDuration()) continue;
    ++announced;
    bool known = false;
    for (const IdleInterval& i : predicted.stages[r.stage].idle) {
      known = known || i.duration == r.expected;
    }
    EXPECT_TRUE(known) << "stage " << r.stage << " announced " << r.expected;
    errors.push_back(absl::AbsDuration((r.end - r.begin) - r.expected));
  }
  // Every predicted bubble, every iteration (the barrier after the last one waits for Stop).
  for (const StageTimeline& t : predicted.stages) {
    predicted_count += t.idle.size() * (kWarmup + kIterations);
  }
  EXPECT_LE(announced, predicted_count);
  EXPECT_GE(announced, predicted_count * 8 / 10);
  ASSERT_FALSE(errors.empty());
  std::sort(errors.begin(), errors.end());
  EXPECT_LE(errors[errors.size() / 2], absl::Milliseconds(2)) << "median bubble error";

  ASSERT_EQ(report->iterations.size(), static_cast<size_t>(kWarmup + kIterations));
  ReportSummary summary = Summarize(*report);
  EXPECT_EQ(summary.iterations, kIterations);
  EXPECT_NEAR(summary.bubble_ratio, predicted.bubble_ratio, 0.15);
  for (int s = 0; s < S; ++s) {
    const int peak = summary.stages[s].peak_in_flight;
    if (GetParam().kind == ScheduleKind::kGpipe) {
      EXPECT_EQ(peak, M);
    } else {
      EXPECT_EQ(peak, S - s);  // 1F1B's bound: stage s holds at most S - s micro-batches
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, SimulatedPipelineTest,
                         ::testing::Values(BubbleCase{ScheduleKind::kGpipe, "gpipe"},
                                           BubbleCase{ScheduleKind::kOneFOneB, "onefoneb"}),
                         [](const auto& info) { return std::string(info.param.name); });

void ExpectNoChildrenLeft() {
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD) << "a stage process was not reaped";
}

PipelineOptions ProcessOptions(int stages, int microbatches) {
  PipelineOptions options;
  options.stages = stages;
  options.microbatches = microbatches;
  options.warmup = 0;
  options.iterations = 2;
  options.receive_timeout = absl::Seconds(10);
  options.launch = StageLaunch::kProcesses;
  return options;
}

// Beside a real stage, a simulated one must send the real activation's shape both ways.
TEST(SimulatedComputeTest, MessagesHaveTheGivenShapeAndCarryTheMicrobatch) {
  auto compute = SimulatedCompute::WithCost({absl::Microseconds(1), absl::Microseconds(1)},
                                            TensorSpec{WireDType::kF32, {2, 3, 4}});
  ASSERT_TRUE(compute->Profile().ok());
  ASSERT_TRUE(compute->StartIteration(0).ok());
  EXPECT_EQ(compute->InputSpec().shape, (std::vector<int64_t>{2, 3, 4}));
  for (bool forward : {true, false}) {
    absl::StatusOr<WireTensor> out =
        forward ? compute->Forward(5, WireTensor{}) : compute->Backward(5, WireTensor{});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->shape, (std::vector<int64_t>{2, 3, 4}));
    ASSERT_EQ(out->data.size(), 24 * sizeof(float));
    float last = 0;
    std::memcpy(&last, out->data.data() + 23 * sizeof(float), sizeof(float));
    EXPECT_EQ(last, 5.0f);
  }
}

TEST(StageProcessTest, ProcessesRunAndAreReaped) {
  auto report = RunPipeline(ProcessOptions(3, 3),
                            SimulatedStage({absl::Milliseconds(1), absl::Milliseconds(2)}));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->iterations.size(), 2u);
  for (const IterationStats& it : report->iterations) {
    EXPECT_GE(it.wall, absl::Milliseconds(3 * 5));  // (M+S-1) * (f+b)
    EXPECT_EQ(it.stages.size(), 3u);
  }
  ExpectNoChildrenLeft();
}

TEST(StageProcessTest, CrashingStageFailsTheRunNamingIt) {
  const absl::Time start = absl::Now();
  auto report =
      RunPipeline(ProcessOptions(4, 4),
                  SimulatedStage({absl::Milliseconds(1), absl::Milliseconds(1)}, nullptr, 2, 1));
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kAborted);
  const std::string message(report.status().message());
  EXPECT_THAT(message, HasSubstr("stage 2 (pid"));
  EXPECT_THAT(message, HasSubstr("killed by signal 9"));
  // Well before any receive timeout: the neighbours see the closed links at once.
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  ExpectNoChildrenLeft();
}

TEST(StageProcessTest, StuckStageTimesOutInsteadOfHanging) {
  PipelineOptions options = ProcessOptions(3, 2);
  options.receive_timeout = absl::Milliseconds(300);
  // Stage 1's forward outlasts its neighbours' receive timeout.
  StageMain body = [](StageConfig config, StageLinks& links) -> absl::Status {
    const absl::Duration fwd = config.stage == 1 ? absl::Seconds(30) : absl::Milliseconds(1);
    auto compute = SimulatedCompute::WithCost({fwd, absl::Milliseconds(1)});
    NullReporter reporter;
    return ServeStage(config, links, *compute, reporter);
  };
  const absl::Time start = absl::Now();
  auto report = RunPipeline(options, body);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("link from stage 1"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ExpectNoChildrenLeft();
}

TEST(StageProcessTest, SetupErrorIsReportedWithTheStage) {
  StageMain body = [](StageConfig config, StageLinks& links) -> absl::Status {
    if (config.stage == 1) return absl::InvalidArgumentError("model does not fit");
    auto compute = SimulatedCompute::WithCost({absl::Milliseconds(1), absl::Milliseconds(1)});
    NullReporter reporter;
    return ServeStage(config, links, *compute, reporter);
  };
  auto report = RunPipeline(ProcessOptions(3, 2), body);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("stage 1 (pid"));
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("model does not fit"));
  ExpectNoChildrenLeft();
}

// Stage 0 sends f32[sent]; stage 1 expects f32[expected].
absl::Status RunMismatched(int64_t sent, int64_t expected) {
  StageMain body = [=](StageConfig config, StageLinks& links) -> absl::Status {
    auto compute = SimulatedCompute::WithCost({absl::Milliseconds(1), absl::Milliseconds(1)},
                                              TensorSpec{WireDType::kF32,
                                                         {config.stage == 0 ? sent : expected}});
    NullReporter reporter;
    return ServeStage(config, links, *compute, reporter);
  };
  return RunPipeline(ProcessOptions(2, 2), body).status();
}

TEST(StageProcessTest, MismatchedActivationIsRejectedByTheReceiver) {
  absl::Status smaller = RunMismatched(128, 256);
  EXPECT_EQ(smaller.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(smaller.message()),
              HasSubstr("stage 1: iteration 0: F0: link from stage 0: activation of micro-batch "
                        "0: expected f32[256], got f32[128]"));
  // Larger than the expected tensor: refused from the header, before the payload is read.
  absl::Status larger = RunMismatched(256, 64);
  EXPECT_EQ(larger.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(larger.message()),
              HasSubstr("link from stage 0: activation message of 1024 bytes exceeds the limit "
                        "of 256"));
  ExpectNoChildrenLeft();
}

}  // namespace
}  // namespace pswitch::pipeline
