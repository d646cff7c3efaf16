#include "fill/scheduler.h"

#include <memory>
#include <vector>

#include "fill/partition.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::fill {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

absl::Duration Ms(int64_t ms) { return absl::Milliseconds(ms); }

const absl::Time kOrigin = absl::FromUnixSeconds(1'700'000'000);

// One 50 ms bubble at the start of every 100 ms iteration. A job of 10 ms steps runs 4 steps
// per bubble (10k < 50), so S steps take ceil(S/4) cycles and, from the cycle origin, finish
// at 100 * (ceil(S/4) - 1) + 10 * (steps in the last bubble) ms.
FillStage Stage(const char* name, int64_t free_bytes, absl::Duration bubble = Ms(50)) {
  return FillStage{name, BubbleCycle{Ms(100), {{Ms(0), bubble, free_bytes}}}, kOrigin,
                   absl::ZeroDuration()};
}

FillJob Job(uint64_t id, int64_t steps, absl::Duration step = Ms(10), int64_t memory = kGiB) {
  FillJob job;
  job.id = id;
  job.steps_total = steps;
  job.step_duration = step;
  job.memory_bytes = memory;
  job.submitted = kOrigin + absl::Seconds(static_cast<int64_t>(id));
  return job;
}

FillJob WithDeadline(FillJob job, absl::Duration after_origin) {
  job.deadline = kOrigin + after_origin;
  return job;
}

std::unique_ptr<FillScheduler> MakeScheduler(std::vector<FillStage> stages,
                                             FillSchedulerOptions options = {}) {
  absl::StatusOr<std::unique_ptr<FillScheduler>> scheduler =
      FillScheduler::Create(std::move(stages), std::move(options));
  EXPECT_TRUE(scheduler.ok()) << scheduler.status();
  return scheduler.ok() ? std::move(*scheduler) : nullptr;
}

std::unique_ptr<FillScheduler> OneStage(FillPolicy policy) {
  FillSchedulerOptions options;
  options.policy = policy;
  return MakeScheduler({Stage("gpu0", 8 * kGiB)}, options);
}

void SubmitAll(FillScheduler& scheduler, const std::vector<FillJob>& jobs) {
  for (const FillJob& job : jobs) ASSERT_TRUE(scheduler.Submit(job, kOrigin).ok()) << job.id;
}

// The order in which a manager would run the stage's jobs: each Next() job runs until its
// predicted completion (where the clock moves to) and then leaves the scheduler.
std::vector<uint64_t> Drain(FillScheduler& scheduler, int stage, absl::Time now = kOrigin) {
  std::vector<uint64_t> order;
  for (;;) {
    absl::StatusOr<std::optional<uint64_t>> next = scheduler.Next(stage, now);
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) return order;
    const uint64_t id = **next;
    order.push_back(id);
    absl::StatusOr<FillEstimate> estimate = scheduler.Estimate(id, now);
    EXPECT_TRUE(estimate.ok()) << estimate.status();
    if (estimate.ok()) now = estimate->completion;
    EXPECT_TRUE(scheduler.Remove(id).ok());
  }
}

TEST(FillPolicyTest, ParsesAndNamesPolicies) {
  for (FillPolicy policy :
       {FillPolicy::kFifo, FillPolicy::kSjf, FillPolicy::kMakespan, FillPolicy::kDeadline}) {
    absl::StatusOr<FillPolicy> parsed = ParseFillPolicy(FillPolicyName(policy));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, policy);
  }
  EXPECT_EQ(ParseFillPolicy("edf").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FillSchedulerTest, FifoRunsInSubmissionTimeOrder) {
  auto scheduler = OneStage(FillPolicy::kFifo);
  FillJob late = Job(1, 4);
  late.submitted = kOrigin + absl::Seconds(30);
  FillJob early = Job(2, 40);
  early.submitted = kOrigin + absl::Seconds(10);
  FillJob middle = Job(3, 4);
  middle.submitted = kOrigin + absl::Seconds(20);
  FillJob same_as_middle = Job(4, 4);
  same_as_middle.submitted = middle.submitted;  // tie: the earlier Submit call wins
  SubmitAll(*scheduler, {late, early, middle, same_as_middle});
  const absl::Time now = kOrigin + absl::Seconds(60);
  EXPECT_THAT(scheduler->RunOrder(0, now), ElementsAre(2, 3, 4, 1));
  EXPECT_THAT(Drain(*scheduler, 0, now), ElementsAre(2, 3, 4, 1));
}

TEST(FillSchedulerTest, SjfRunsShortestPredictedTimeFirst) {
  auto scheduler = OneStage(FillPolicy::kSjf);
  // Predicted times from the origin: job 1 940 ms (40 steps), job 2 40 ms, job 3 240 ms,
  // job 4 40 ms (ties with job 2, submitted later). Jobs 5 and 6 show that SJF uses the plan,
  // not the raw work: job 5 has 52 ms of work (2 x 26 ms) but only one step fits a bubble
  // (126 ms); job 6 has 56 ms (4 x 14 ms) but runs 3 per bubble (114 ms).
  SubmitAll(*scheduler,
            {Job(1, 40), Job(2, 4), Job(3, 12), Job(4, 4), Job(5, 2, Ms(26)), Job(6, 4, Ms(14))});
  EXPECT_THAT(scheduler->RunOrder(0, kOrigin), ElementsAre(2, 4, 6, 5, 3, 1));
  EXPECT_THAT(Drain(*scheduler, 0), ElementsAre(2, 4, 6, 5, 3, 1));
}

TEST(FillSchedulerTest, MakespanPrefersJobsThatFinishBeforeTheBusiestOtherStage) {
  FillSchedulerOptions options;
  options.policy = FillPolicy::kMakespan;
  // gpu1's 12 ms bubble cannot hold a 12 ms step, so the 12 ms jobs can only go to gpu0
  // (4 steps per 50 ms bubble); the 12 GiB job can only go to gpu1.
  auto scheduler =
      MakeScheduler({Stage("gpu0", 8 * kGiB), Stage("gpu1", 16 * kGiB, Ms(12))}, options);
  // gpu1 is busy for 910 ms: 20 steps of 5 ms, 2 per bubble -> 900 + 10 ms.
  ASSERT_TRUE(scheduler->Submit(Job(10, 20, Ms(5), 12 * kGiB), kOrigin).ok());
  ASSERT_EQ(scheduler->StageOf(10), 1);
  ASSERT_EQ(*scheduler->Next(1, kOrigin), std::optional<uint64_t>(10));
  // On gpu0: job 1 248 ms (12 steps), job 2 1148 ms (48), job 3 48 ms (4), job 4 1048 ms (44).
  // Scores -max(p, 910 ms): jobs 1 and 3 tie at -910 (submission order), then 4, then 2.
  SubmitAll(*scheduler,
            {Job(1, 12, Ms(12)), Job(2, 48, Ms(12)), Job(3, 4, Ms(12)), Job(4, 44, Ms(12))});
  for (uint64_t id : {1, 2, 3, 4}) EXPECT_EQ(scheduler->StageOf(id), 0) << id;
  EXPECT_THAT(scheduler->RunOrder(0, kOrigin), ElementsAre(1, 3, 4, 2));
  EXPECT_EQ(*scheduler->Next(0, kOrigin), std::optional<uint64_t>(1));
}

TEST(FillSchedulerTest, MakespanScoreFollowsThePaperFormula) {
  const FillJob job = Job(1, 4);
  const ScoreInput shorter{job, 0, kOrigin, Ms(300), Ms(900)};
  const ScoreInput longer{job, 0, kOrigin, Ms(1200), Ms(900)};
  EXPECT_DOUBLE_EQ(MakespanScore(shorter), -0.9);
  EXPECT_DOUBLE_EQ(MakespanScore(longer), -1.2);
  EXPECT_DOUBLE_EQ(SjfScore(longer), -1.2);
  EXPECT_DOUBLE_EQ(FifoScore(ScoreInput{job, 0, kOrigin + absl::Seconds(3), Ms(0), Ms(0)}), 2.0);
}

TEST(FillSchedulerTest, DeadlinePolicyRunsLeastSlackFirstThenUndatedInSubmissionOrder) {
  auto scheduler = OneStage(FillPolicy::kDeadline);
  // Slack = deadline - predicted time: job 2 1000 - 940 = 60 ms, job 3 300 - 40 = 260 ms,
  // job 4 2000 - 40 = 1960 ms. Earliest-deadline-first would run job 3 before job 2.
  SubmitAll(*scheduler,
            {Job(1, 4), WithDeadline(Job(2, 40), Ms(1000)), WithDeadline(Job(3, 4), Ms(300)),
             WithDeadline(Job(4, 4), Ms(2000)), Job(5, 4)});
  EXPECT_THAT(scheduler->RunOrder(0, kOrigin), ElementsAre(2, 3, 4, 1, 5));
  // Job 3 waits for job 2 (done at 940 ms) and runs in the bubble at 1000 ms: 1040 > 300.
  absl::StatusOr<FillEstimate> job3 = scheduler->Estimate(3, kOrigin);
  ASSERT_TRUE(job3.ok());
  EXPECT_EQ(job3->completion, kOrigin + Ms(1040));
  EXPECT_FALSE(job3->meets_deadline);
  absl::StatusOr<FillEstimate> job2 = scheduler->Estimate(2, kOrigin);
  ASSERT_TRUE(job2.ok());
  EXPECT_TRUE(job2->meets_deadline);
  EXPECT_THAT(Drain(*scheduler, 0), ElementsAre(2, 3, 4, 1, 5));
}

TEST(FillSchedulerTest, RejectsJobsThatWouldMissTheirDeadline) {
  FillSchedulerOptions options;
  options.policy = FillPolicy::kDeadline;
  options.reject_missed_deadlines = true;
  auto scheduler = MakeScheduler({Stage("gpu0", 8 * kGiB)}, options);
  absl::Status hopeless = scheduler->Submit(WithDeadline(Job(1, 40), Ms(500)), kOrigin);
  EXPECT_EQ(hopeless.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(hopeless.message(), HasSubstr("is after its deadline"));
  EXPECT_EQ(scheduler->num_jobs(), 0u);
  // Jobs without a deadline are never refused for time.
  EXPECT_TRUE(scheduler->Submit(Job(2, 400), kOrigin).ok());
}

TEST(FillSchedulerTest, RejectsJobsThatWouldMakeAnAdmittedJobMissItsDeadline) {
  FillSchedulerOptions options;
  options.policy = FillPolicy::kDeadline;
  options.reject_missed_deadlines = true;
  auto scheduler = MakeScheduler({Stage("gpu0", 8 * kGiB)}, options);
  // Job 1: 8 steps, done at 140 ms, deadline 150 ms (slack 10 ms).
  ASSERT_TRUE(scheduler->Submit(WithDeadline(Job(1, 8), Ms(150)), kOrigin).ok());
  // Job 2 (slack 5 ms) would run first and push job 1 to 240 ms.
  absl::Status status = scheduler->Submit(WithDeadline(Job(2, 4), Ms(45)), kOrigin);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("would make fill job 1 miss its deadline"));
  EXPECT_EQ(scheduler->StageOf(2), std::nullopt);
  EXPECT_THAT(scheduler->RunOrder(0, kOrigin), ElementsAre(1));
}

TEST(FillSchedulerTest, PlacementRespectsBubbleMemory) {
  auto scheduler = MakeScheduler({Stage("small", 4 * kGiB), Stage("large", 16 * kGiB)});
  // Load the large stage so that only memory can explain the choice.
  ASSERT_TRUE(scheduler->Submit(Job(1, 400, Ms(10), 2 * kGiB), kOrigin).ok());
  ASSERT_TRUE(scheduler->Submit(Job(2, 400, Ms(10), 12 * kGiB), kOrigin).ok());
  ASSERT_TRUE(scheduler->Submit(Job(3, 400, Ms(10), 12 * kGiB), kOrigin).ok());
  EXPECT_EQ(scheduler->StageOf(1), 0);
  EXPECT_EQ(scheduler->StageOf(2), 1);
  EXPECT_EQ(scheduler->StageOf(3), 1);  // the small stage is idle but cannot hold it
  // Exactly the free memory is enough.
  ASSERT_TRUE(scheduler->Submit(Job(4, 4, Ms(10), 16 * kGiB), kOrigin).ok());
  EXPECT_EQ(scheduler->StageOf(4), 1);
}

TEST(FillSchedulerTest, PlacementPicksTheEarliestPredictedFinish) {
  auto scheduler = MakeScheduler({Stage("a", 8 * kGiB), Stage("b", 8 * kGiB, Ms(30))});
  // Stage b's 30 ms bubble runs 2 steps of 10 ms; stage a's runs 4.
  ASSERT_TRUE(scheduler->Submit(Job(1, 8), kOrigin).ok());  // a: 140 ms, b: 320 ms
  EXPECT_EQ(scheduler->StageOf(1), 0);
  ASSERT_TRUE(scheduler->Submit(Job(2, 8), kOrigin).ok());  // a: behind job 1, 340; b: 320
  EXPECT_EQ(scheduler->StageOf(2), 1);
  ASSERT_TRUE(scheduler->Submit(Job(3, 2), kOrigin).ok());  // a: 220; b: 420
  EXPECT_EQ(scheduler->StageOf(3), 0);
}

TEST(FillSchedulerTest, ResourceExhaustedWhenNoStageCanEverHoldTheJob) {
  auto scheduler = MakeScheduler({Stage("gpu0", 4 * kGiB), Stage("gpu1", 8 * kGiB)});
  absl::Status too_big = scheduler->Submit(Job(1, 4, Ms(10), 9 * kGiB), kOrigin);
  EXPECT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.message(), HasSubstr("stage 'gpu0'"));
  EXPECT_THAT(too_big.message(), HasSubstr("stage 'gpu1'"));
  absl::Status too_long = scheduler->Submit(Job(2, 4, Ms(50)), kOrigin);
  EXPECT_EQ(too_long.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(scheduler->num_jobs(), 0u);
}

TEST(FillSchedulerTest, EstimateEqualsThePartitionPrediction) {
  FillStage stage{"gpu0",
                  BubbleCycle{Ms(100), {{Ms(10), Ms(30), 8 * kGiB}, {Ms(60), Ms(25), 8 * kGiB}}},
                  kOrigin, Ms(2)};
  auto scheduler = MakeScheduler({stage});
  FillJob job = Job(1, 37, Ms(7));
  job.steps_done = 5;
  const absl::Time now = kOrigin + absl::Seconds(3) + Ms(42);  // mid-cycle, after the origin
  ASSERT_TRUE(scheduler->Submit(job, now).ok());

  absl::StatusOr<absl::Duration> predicted =
      PredictFillCompletion(stage.cycle, FillWork{32, Ms(7), kGiB, Ms(2)}, now - kOrigin);
  ASSERT_TRUE(predicted.ok());
  absl::StatusOr<FillEstimate> estimate = scheduler->Estimate(1, now);
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  EXPECT_EQ(estimate->stage, 0);
  EXPECT_EQ(estimate->completion, kOrigin + *predicted);
  EXPECT_TRUE(estimate->meets_deadline);

  // A second job starts from the first one's completion.
  ASSERT_TRUE(scheduler->Submit(Job(2, 3, Ms(7)), now).ok());
  absl::StatusOr<absl::Duration> second =
      PredictFillCompletion(stage.cycle, FillWork{3, Ms(7), kGiB, Ms(2)}, *predicted);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(scheduler->Estimate(2, now)->completion, kOrigin + *second);

  // Progress shortens the estimate.
  ASSERT_TRUE(scheduler->ReportProgress(1, 30).ok());
  absl::StatusOr<absl::Duration> rest =
      PredictFillCompletion(stage.cycle, FillWork{7, Ms(7), kGiB, Ms(2)}, now - kOrigin);
  EXPECT_EQ(scheduler->Estimate(1, now)->completion, kOrigin + *rest);
}

// `pswitchctl fill estimate`: the prediction a submission would get, with nothing submitted.
TEST(FillSchedulerTest, EstimateNewPredictsASubmissionWithoutMakingIt) {
  auto scheduler = MakeScheduler({Stage("a", 8 * kGiB), Stage("b", 8 * kGiB, Ms(30))});
  ASSERT_TRUE(scheduler->Submit(Job(1, 8), kOrigin).ok());  // a: 140 ms

  // Job 2 would go behind job 1 on a (340 ms) or alone on b (320 ms).
  absl::StatusOr<FillEstimate> what_if = scheduler->EstimateNew(Job(2, 8), kOrigin);
  ASSERT_TRUE(what_if.ok()) << what_if.status();
  EXPECT_EQ(what_if->stage, 1);
  EXPECT_EQ(what_if->completion, kOrigin + Ms(320));
  EXPECT_EQ(scheduler->num_jobs(), 1u);
  EXPECT_EQ(scheduler->StageOf(2), std::nullopt);
  EXPECT_THAT(scheduler->RunOrder(1, kOrigin), ElementsAre());

  // The real submission gets the same prediction.
  ASSERT_TRUE(scheduler->Submit(Job(2, 8), kOrigin).ok());
  EXPECT_EQ(scheduler->Estimate(2, kOrigin)->completion, what_if->completion);

  // Submit's errors come back, and still nothing is submitted.
  EXPECT_EQ(scheduler->EstimateNew(Job(3, 4, Ms(10), 9 * kGiB), kOrigin).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(scheduler->EstimateNew(Job(1, 4), kOrigin).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(scheduler->num_jobs(), 2u);
}

TEST(FillSchedulerTest, NextKeepsTheCurrentJobUntilItFinishes) {
  auto scheduler = OneStage(FillPolicy::kSjf);
  SubmitAll(*scheduler, {Job(1, 8)});
  EXPECT_EQ(*scheduler->Next(0, kOrigin), std::optional<uint64_t>(1));
  // A shorter job arrives: SJF ranks it first, but the running job is not preempted.
  SubmitAll(*scheduler, {Job(2, 1)});
  EXPECT_EQ(*scheduler->Next(0, kOrigin + Ms(100)), std::optional<uint64_t>(1));
  EXPECT_THAT(scheduler->RunOrder(0, kOrigin), ElementsAre(1, 2));
  ASSERT_TRUE(scheduler->ReportProgress(1, 4).ok());
  EXPECT_EQ(*scheduler->Next(0, kOrigin + Ms(100)), std::optional<uint64_t>(1));
  ASSERT_TRUE(scheduler->ReportProgress(1, 8).ok());  // finished: forgotten
  EXPECT_EQ(scheduler->StageOf(1), std::nullopt);
  EXPECT_EQ(*scheduler->Next(0, kOrigin + Ms(200)), std::optional<uint64_t>(2));
  ASSERT_TRUE(scheduler->Remove(2).ok());  // cancel the current job
  EXPECT_EQ(*scheduler->Next(0, kOrigin + Ms(300)), std::nullopt);
}

TEST(FillSchedulerTest, RejectsBadCallsWithTheRightCodes) {
  auto scheduler = OneStage(FillPolicy::kFifo);
  FillJob no_memory = Job(1, 4);
  no_memory.memory_bytes = 0;
  absl::Status invalid = scheduler->Submit(no_memory, kOrigin);
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(invalid.message(), HasSubstr("fill job 1: memory_bytes must be > 0"));
  FillJob done = Job(1, 4);
  done.steps_done = 4;
  EXPECT_EQ(scheduler->Submit(done, kOrigin).code(), absl::StatusCode::kInvalidArgument);
  FillJob no_step = Job(1, 4);
  no_step.step_duration = absl::ZeroDuration();
  EXPECT_EQ(scheduler->Submit(no_step, kOrigin).code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(scheduler->Submit(Job(1, 4), kOrigin).ok());
  EXPECT_EQ(scheduler->Submit(Job(1, 4), kOrigin).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(scheduler->ReportProgress(1, 2).ok());
  EXPECT_EQ(scheduler->ReportProgress(1, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler->ReportProgress(1, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler->ReportProgress(9, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler->Remove(9).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler->Estimate(9, kOrigin).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler->Next(1, kOrigin).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler->Next(-1, kOrigin).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FillSchedulerTest, CreateValidatesStages) {
  EXPECT_EQ(FillScheduler::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  FillStage bad = Stage("gpu3", 8 * kGiB);
  bad.cycle.bubbles[0].duration = Ms(200);
  absl::Status status = FillScheduler::Create({Stage("gpu0", kGiB), bad}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("stage 'gpu3': bubble cycle: bubbles[0]"));
  FillStage negative = Stage("", kGiB);
  negative.switch_overhead = -Ms(1);
  EXPECT_THAT(FillScheduler::Create({negative}).status().message(), HasSubstr("stage 0"));
}

TEST(FillSchedulerTest, CustomScoreFunctionOrdersTheQueue) {
  FillSchedulerOptions options;
  options.custom_score = [](const ScoreInput& in) {
    return static_cast<double>(in.job.memory_bytes);  // biggest memory first
  };
  auto scheduler = MakeScheduler({Stage("gpu0", 8 * kGiB)}, options);
  SubmitAll(*scheduler,
            {Job(1, 4, Ms(10), kGiB), Job(2, 4, Ms(10), 4 * kGiB), Job(3, 4, Ms(10), 2 * kGiB)});
  EXPECT_THAT(Drain(*scheduler, 0), ElementsAre(2, 3, 1));
}

}  // namespace
}  // namespace pswitch::fill
