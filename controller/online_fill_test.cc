#include "controller/online_fill.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

using ::testing::HasSubstr;

// A float32 "input" of `rows` rows of 2 values: row r holds (first + r, first + r).
proto::HostTensor Input(int64_t rows, float first) {
  proto::HostTensor t;
  t.name = "input";
  t.shape = {rows, 2};
  t.data.resize(static_cast<size_t>(rows) * 2 * sizeof(float));
  for (int64_t r = 0; r < rows; ++r) {
    const float v[2] = {first + static_cast<float>(r), first + static_cast<float>(r)};
    std::memcpy(t.data.data() + r * sizeof(v), v, sizeof(v));
  }
  return t;
}

TaskSpec Request(const std::string& model, int64_t rows, float first, absl::Duration slo,
                 const std::string& principal = "alice") {
  TaskSpec spec;
  spec.model = model;
  spec.principal = principal;
  spec.inputs.push_back(Input(rows, first));
  spec.online_slo = slo;
  return spec;
}

// What a fake model answers: "output" = the input's values times two, row by row.
TaskOutcome Doubled(const TaskSpec& spec) {
  TaskOutcome outcome;
  proto::HostTensor out = spec.inputs[0];
  out.name = "output";
  for (size_t i = 0; i < out.data.size(); i += sizeof(float)) {
    float v;
    std::memcpy(&v, out.data.data() + i, sizeof(v));
    v *= 2;
    std::memcpy(out.data.data() + i, &v, sizeof(v));
  }
  outcome.outputs.push_back(std::move(out));
  return outcome;
}

float FirstValue(const TaskOutcome& outcome) {
  float v;
  std::memcpy(&v, outcome.outputs.at(0).data.data(), sizeof(v));
  return v;
}

// The runner: records every run and answers it at once (after `service`, on the caller's
// thread), unless told to hold runs (then Release answers them).
class FakeRunner {
 public:
  OnlineRunner Runner() {
    return [this](int gpu, TaskSpec spec, TaskCallback done) -> absl::StatusOr<uint64_t> {
      absl::Duration service;
      absl::Status refuse;
      bool per_row;
      bool fail = false;
      uint64_t id;
      {
        absl::MutexLock lock(&mu_);
        runs_.push_back({gpu, spec});
        id = runs_.size();
        service = service_;
        refuse = refuse_;
        per_row = per_row_;
        if (spec.inputs[0].shape[0] > max_rows_) {
          return absl::InvalidArgumentError("inputs beyond --max-input-bytes");
        }
        if (spec.inputs[0].shape[0] > fail_rows_) {
          fail = true;
        }
        if (hold_) {
          held_.push_back({Reported(Doubled(spec)), std::move(done)});
          return id;
        }
      }
      if (!refuse.ok()) return refuse;
      if (fail) {  // accepted, then failed (as a run out of activation memory would)
        done(absl::ResourceExhaustedError("activations beyond the worker's lease"));
        return id;
      }
      absl::SleepFor(service);
      TaskOutcome outcome;
      {
        absl::MutexLock lock(&mu_);
        outcome = Reported(Doubled(spec));
      }
      if (!per_row) outcome.outputs[0].shape[0] = 1;  // one row, whatever the batch
      if (!per_row) outcome.outputs[0].data.resize(2 * sizeof(float));
      done(outcome);
      return id;
    };
  }
  struct Run {
    int gpu;
    TaskSpec spec;
  };
  TaskOutcome Reported(TaskOutcome outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reported_ > absl::ZeroDuration()) {
      outcome.timeline.placed_ns = 1;
      outcome.timeline.result_ns = 1 + absl::ToInt64Nanoseconds(reported_);
    }
    return outcome;
  }
  std::vector<Run> runs() {
    absl::MutexLock lock(&mu_);
    return runs_;
  }
  void set_service(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    service_ = d;
  }
  void refuse(absl::Status s) {
    absl::MutexLock lock(&mu_);
    refuse_ = std::move(s);
  }
  void set_per_row(bool per_row) {
    absl::MutexLock lock(&mu_);
    per_row_ = per_row;
  }
  // Every run says it took `d` on its worker (its timeline), whatever the wall clock says.
  void set_reported_service(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    reported_ = d;
  }
  // Runs of more rows fail after being accepted.
  void set_fail_rows(int64_t rows) {
    absl::MutexLock lock(&mu_);
    fail_rows_ = rows;
  }
  // Runs of more rows are refused, as a scheduler refuses inputs beyond its bound.
  void set_max_rows(int64_t rows) {
    absl::MutexLock lock(&mu_);
    max_rows_ = rows;
  }
  // From now on runs are held, unanswered, until ReleaseOldest.
  void hold() {
    absl::MutexLock lock(&mu_);
    hold_ = true;
  }
  size_t held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  void ReleaseOldest() {
    std::pair<TaskOutcome, TaskCallback> run;
    {
      absl::MutexLock lock(&mu_);
      run = std::move(held_.front());
      held_.erase(held_.begin());
    }
    run.second(run.first);
  }

 private:
  absl::Mutex mu_;
  std::vector<Run> runs_ ABSL_GUARDED_BY(mu_);
  absl::Duration service_ ABSL_GUARDED_BY(mu_);
  absl::Status refuse_ ABSL_GUARDED_BY(mu_);
  bool per_row_ ABSL_GUARDED_BY(mu_) = true;
  int64_t max_rows_ ABSL_GUARDED_BY(mu_) = 1 << 30;
  int64_t fail_rows_ ABSL_GUARDED_BY(mu_) = 1 << 30;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration reported_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<TaskOutcome, TaskCallback>> held_ ABSL_GUARDED_BY(mu_);
};

// One request's answer, waited for with a bound.
struct Answer {
  absl::Notification done;
  absl::StatusOr<TaskOutcome> outcome = absl::UnknownError("not answered");
  TaskCallback Callback() {
    return [this](const absl::StatusOr<TaskOutcome>& o) {
      outcome = o;
      done.Notify();
    };
  }
  bool Wait(absl::Duration d = absl::Seconds(10)) { return done.WaitForNotificationWithTimeout(d); }
};

int64_t InMs(double ms) { return base::MonotonicNowNs() + static_cast<int64_t>(ms * 1e6); }

// A bubble of `ms` on `gpu`, begun and ended (the fake runner answers within it).
void Bubble(OnlineFill& online, int gpu, double ms) {
  online.Pull(gpu, InMs(ms));
  online.BubbleEnded(gpu);
}

// Model "m" measured on GPU 0: one request of alice's served in a bubble of its own.
void Measure(OnlineFill& online) {
  Answer warm;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 0, absl::Seconds(30)), warm.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(warm.Wait());
  ASSERT_TRUE(warm.outcome.ok()) << warm.outcome.status();
}

TEST(OnlineFillTest, ARequestWaitsForABubbleAndIsServedInItWithItsOwnAnswer) {
  FakeRunner runner;
  auto telemetry = std::make_shared<Telemetry>();
  OnlineFillOptions options;
  options.telemetry = telemetry;
  OnlineFill online(runner.Runner(), options);
  Answer a;
  ASSERT_TRUE(online.Submit({1}, Request("m", 1, 3, absl::Seconds(30)), a.Callback()).ok());
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(a.done.HasBeenNotified()) << "ran before any bubble";
  EXPECT_EQ(online.Queued(), 1u);
  EXPECT_EQ(online.Pull(0, InMs(50)), absl::ZeroDuration()) << "another GPU's bubble";
  Bubble(online, 1, 50);
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(a.outcome.ok()) << a.outcome.status();
  EXPECT_EQ(FirstValue(*a.outcome), 6.0f);
  EXPECT_GE(a.outcome->task_id, kOnlineRequestIdBase);
  ASSERT_EQ(runner.runs().size(), 1u);
  EXPECT_EQ(runner.runs()[0].gpu, 1);
  EXPECT_FALSE(runner.runs()[0].spec.online_slo) << "the scheduler gets a plain task";
  EXPECT_TRUE(online.Predicted(1, "m", 1).has_value()) << "its run was measured";
  OnlineFillStats stats = online.Stats();
  EXPECT_EQ(stats.in_bubble, 1u);
  EXPECT_EQ(stats.bubbles_used, 1u);
  EXPECT_EQ(stats.queued, 0u);
  // Its latency, its queueing and the bubble it used, in /metrics and the trace.
  const std::string metrics = telemetry->Scrape({}, {}, {});
  EXPECT_THAT(metrics,
              HasSubstr(R"(pswitch_online_fill_requests_total{gpu="1",outcome="bubble"} 1)"));
  EXPECT_THAT(metrics, HasSubstr(R"(pswitch_online_fill_bubbles_total{gpu="1"} 1)"));
  EXPECT_THAT(metrics,
              HasSubstr(R"(pswitch_online_fill_queue_seconds_count{gpu="1",outcome="bubble"} 1)"));
  EXPECT_THAT(
      metrics,
      HasSubstr(R"(pswitch_online_fill_latency_seconds_count{gpu="1",outcome="bubble"} 1)"));
  const std::string trace = telemetry->trace().ChromeJson(absl::Minutes(1), base::MonotonicNowNs());
  EXPECT_THAT(trace, HasSubstr(R"("queued_ms")"));
}

TEST(OnlineFillTest, TheFirstBubbleOfAnyOfItsGpusServesARequest) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  Answer a;
  ASSERT_TRUE(online.Submit({0, 3}, Request("m", 1, 1, absl::Seconds(30)), a.Callback()).ok());
  EXPECT_EQ(online.Pull(2, InMs(100)), absl::ZeroDuration()) << "not a GPU it may use";
  EXPECT_EQ(online.Queued(), 1u);
  Bubble(online, 3, 100);
  ASSERT_TRUE(a.Wait());
  ASSERT_EQ(runner.runs().size(), 1u);
  EXPECT_EQ(runner.runs()[0].gpu, 3);
  EXPECT_EQ(
      online.Submit({}, Request("m", 1, 1, absl::Seconds(30)), [](const auto&) {}).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(OnlineFillTest, AModelNotYetMeasuredRunsAloneSoItsServiceIsLearnt) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  Answer a, b;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 1, absl::Seconds(30)), a.Callback()).ok());
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 2, absl::Seconds(30)), b.Callback()).ok());
  Bubble(online, 0, 100);
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  EXPECT_EQ(FirstValue(*b.outcome), 4.0f);
  // a alone, then (pulled when a's pass ended, measured now) b, in the same bubble.
  ASSERT_EQ(runner.runs().size(), 2u);
  EXPECT_EQ(runner.runs()[0].spec.inputs[0].shape[0], 1);
  EXPECT_EQ(online.Stats().bubbles_used, 1u);
}

TEST(OnlineFillTest, ARequestArrivingInABubbleUnderWayIsServedAtOnceUntilItEnds) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  ASSERT_NO_FATAL_FAILURE(Measure(online));
  EXPECT_EQ(online.Pull(0, InMs(1000)), absl::ZeroDuration()) << "nothing waits yet";
  Answer a;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 1, absl::Seconds(30)), a.Callback()).ok());
  EXPECT_TRUE(a.done.HasBeenNotified()) << "pull-and-execute: the open bubble serves it";
  online.BubbleEnded(0);
  Answer b;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 2, absl::Seconds(30)), b.Callback()).ok());
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(b.done.HasBeenNotified()) << "served after its bubble ended";
  Bubble(online, 0, 100);
  ASSERT_TRUE(b.Wait());
  EXPECT_TRUE(b.outcome.ok());
}

TEST(OnlineFillTest, RequestsOfOneModelAndPrincipalShareOnePassAndGetTheirOwnRows) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  ASSERT_NO_FATAL_FAILURE(Measure(online));

  Answer a, b, c, other;
  ASSERT_TRUE(online.Submit({0}, Request("m", 2, 10, absl::Seconds(30)), a.Callback()).ok());
  ASSERT_TRUE(
      online.Submit({0}, Request("m", 1, 20, absl::Seconds(30), "bob"), other.Callback()).ok());
  ASSERT_TRUE(online.Submit({0}, Request("m", 3, 30, absl::Seconds(30)), b.Callback()).ok());
  ASSERT_TRUE(online.Submit({0}, Request("n", 1, 40, absl::Seconds(30)), c.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  ASSERT_TRUE(other.Wait());
  // Model n is not measured yet: it runs alone, handed out at the bubble's start with all the
  // bubble has left after the others.
  ASSERT_TRUE(c.Wait());
  // warm-up, alice's batch of a and b, bob's alone, then model n.
  std::vector<FakeRunner::Run> runs = runner.runs();
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[1].spec.inputs[0].shape[0], 5) << "a's 2 rows and b's 3 in one pass";
  EXPECT_EQ(runs[1].spec.principal, "alice");
  EXPECT_EQ(runs[2].spec.principal, "bob") << "another tenant never shares a pass";
  EXPECT_EQ(runs[3].spec.model, "n");
  ASSERT_TRUE(a.outcome.ok() && b.outcome.ok() && other.outcome.ok());
  EXPECT_EQ(a.outcome->outputs[0].shape[0], 2);
  EXPECT_EQ(FirstValue(*a.outcome), 20.0f);
  EXPECT_EQ(b.outcome->outputs[0].shape[0], 3);
  EXPECT_EQ(FirstValue(*b.outcome), 60.0f);
  EXPECT_EQ(FirstValue(*other.outcome), 40.0f);
  EXPECT_NE(a.outcome->task_id, b.outcome->task_id);
  EXPECT_EQ(online.Stats().passes, 4u);
}

TEST(OnlineFillTest, ARequestTooLongForTheBubbleWaitsWhileAShorterOneBehindItRuns) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  runner.set_service(absl::Milliseconds(30));
  Answer slow_warm, fast_warm;
  ASSERT_TRUE(
      online.Submit({0}, Request("slow", 1, 0, absl::Seconds(30)), slow_warm.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(slow_warm.Wait());
  runner.set_service(absl::ZeroDuration());
  ASSERT_TRUE(
      online.Submit({0}, Request("fast", 1, 0, absl::Seconds(30)), fast_warm.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(fast_warm.Wait());

  Answer slow, fast;
  ASSERT_TRUE(online.Submit({0}, Request("slow", 1, 1, absl::Seconds(20)), slow.Callback()).ok());
  ASSERT_TRUE(online.Submit({0}, Request("fast", 1, 2, absl::Seconds(30)), fast.Callback()).ok());
  // 10 ms of bubble: the slow model's 30 ms does not fit, the fast one does.
  Bubble(online, 0, 10);
  ASSERT_TRUE(fast.Wait());
  EXPECT_FALSE(slow.done.HasBeenNotified());
  Bubble(online, 0, 200);
  ASSERT_TRUE(slow.Wait());
  EXPECT_TRUE(slow.outcome.ok());
}

TEST(OnlineFillTest, AnObjectiveNoBubbleCanMeetIsRefusedWithTheReasonByDefault) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  Answer a;
  const int64_t start = base::MonotonicNowNs();
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 1, absl::Milliseconds(40)), a.Callback()).ok());
  ASSERT_TRUE(a.Wait());
  const absl::Duration took = absl::Nanoseconds(base::MonotonicNowNs() - start);
  EXPECT_EQ(a.outcome.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(a.outcome.status().message(), HasSubstr("latency objective of 40ms"));
  EXPECT_THAT(a.outcome.status().message(), HasSubstr("--online-fill-overflow=refuse"));
  // Not measured: refused three quarters into its objective, not before.
  EXPECT_GE(took, absl::Milliseconds(29));
  EXPECT_TRUE(runner.runs().empty()) << "the main job was never touched";
  EXPECT_EQ(online.Stats().refused, 1u);
}

TEST(OnlineFillTest, WithOverflowRunAnObjectiveNoBubbleCanMeetRunsAtOnceAndIsCounted) {
  FakeRunner runner;
  OnlineFillOptions options;
  options.overflow = OnlineOverflow::kRun;
  OnlineFill online(runner.Runner(), options);
  runner.set_service(absl::Milliseconds(5));
  Answer a;
  ASSERT_TRUE(online.Submit({2}, Request("m", 1, 1, absl::Milliseconds(40)), a.Callback()).ok());
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(a.outcome.ok()) << a.outcome.status();
  ASSERT_EQ(runner.runs().size(), 1u);
  EXPECT_EQ(runner.runs()[0].gpu, 2);
  OnlineFillStats stats = online.Stats();
  EXPECT_EQ(stats.overflow_run, 1u);
  EXPECT_EQ(stats.in_bubble, 0u);
  EXPECT_GE(stats.overflow_time, absl::Milliseconds(5)) << "the main job's cost is counted";
}

TEST(OnlineFillTest, AMeasuredModelOverflowsOnlyWhenItsServiceNoLongerFitsTheObjective) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  runner.set_service(absl::Milliseconds(40));
  ASSERT_NO_FATAL_FAILURE(Measure(online));
  // Its objective is shorter than its measured service: refused at once.
  Answer a;
  const int64_t start = base::MonotonicNowNs();
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 1, absl::Milliseconds(30)), a.Callback()).ok());
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.outcome.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Nanoseconds(base::MonotonicNowNs() - start), absl::Milliseconds(25));
}

TEST(OnlineFillTest, OutputsNotPerRowRunEachRequestAgainAloneAndStopBatching) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  runner.set_per_row(false);
  ASSERT_NO_FATAL_FAILURE(Measure(online));
  Answer a, b;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 1, absl::Seconds(30)), a.Callback()).ok());
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 2, absl::Seconds(30)), b.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  ASSERT_TRUE(a.outcome.ok() && b.outcome.ok());
  EXPECT_EQ(FirstValue(*a.outcome), 2.0f);
  EXPECT_EQ(FirstValue(*b.outcome), 4.0f);
  // warm-up, the batch, then each alone.
  ASSERT_EQ(runner.runs().size(), 4u);
  Answer c, d;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 3, absl::Seconds(30)), c.Callback()).ok());
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 4, absl::Seconds(30)), d.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(c.Wait());
  ASSERT_TRUE(d.Wait());
  EXPECT_EQ(runner.runs().size(), 6u) << "not batched any more";
}

TEST(OnlineFillTest, ARunTheSchedulerRefusesIsAnsweredWithItsReason) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  runner.refuse(absl::NotFoundError("model 'm' is not registered"));
  Answer a;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 1, absl::Seconds(30)), a.Callback()).ok());
  Bubble(online, 0, 100);
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.outcome.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(online.Stats().failed, 1u);
}

TEST(OnlineFillTest, BoundsAndStopAnswerEveryRequest) {
  FakeRunner runner;
  OnlineFillOptions options;
  options.max_queued = 2;
  OnlineFill online(runner.Runner(), options);
  TaskSpec no_objective = Request("m", 1, 1, absl::Seconds(1));
  no_objective.online_slo.reset();
  EXPECT_EQ(online.Submit({0}, no_objective, [](const auto&) {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  Answer a, b;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 1, absl::Seconds(30)), a.Callback()).ok());
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 2, absl::Seconds(30)), b.Callback()).ok());
  EXPECT_EQ(
      online.Submit({0}, Request("m", 1, 3, absl::Seconds(30)), [](const auto&) {}).status().code(),
      absl::StatusCode::kResourceExhausted);
  online.Stop();
  ASSERT_TRUE(a.Wait(absl::Seconds(1)));
  ASSERT_TRUE(b.Wait(absl::Seconds(1)));
  EXPECT_EQ(a.outcome.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(
      online.Submit({0}, Request("m", 1, 3, absl::Seconds(30)), [](const auto&) {}).status().code(),
      absl::StatusCode::kUnavailable);
  EXPECT_EQ(online.Pull(0, InMs(100)), absl::ZeroDuration());
  EXPECT_TRUE(runner.runs().empty());
}

// The passes handed out in a bubble and still running (or still queued at the GPU's scheduler)
// keep their predicted time: one that ends frees its own time only, not theirs.
TEST(OnlineFillTest, ABubbleNeverHandsOutMoreThanItHasLeftForThePassesStillOut) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  runner.set_reported_service(absl::Milliseconds(10));  // measured at exactly 10 ms
  ASSERT_NO_FATAL_FAILURE(Measure(online));
  runner.hold();
  // Five requests of five tenants (never batched together), each predicted at about 10 ms.
  std::vector<std::unique_ptr<Answer>> answers;
  for (int i = 0; i < 5; ++i) {
    answers.push_back(std::make_unique<Answer>());
    ASSERT_TRUE(online
                    .Submit({0}, Request("m", 1, i, absl::Seconds(30), absl::StrCat("t", i)),
                            answers.back()->Callback())
                    .ok());
  }
  // A 38 ms bubble: room for three (the margin aside), not four.
  online.Pull(0, InMs(38));
  EXPECT_EQ(runner.held(), 3u);
  absl::SleepFor(absl::Milliseconds(10));
  runner.ReleaseOldest();  // done after 10 ms or more: at most 28 ms left, 20 of them the others'
  ASSERT_TRUE(answers[0]->Wait());
  EXPECT_EQ(runner.held(), 2u) << "handed out time the passes still out will take";
  online.BubbleEnded(0);
  while (runner.held() > 0) runner.ReleaseOldest();
  online.Stop();
}

// A batch the scheduler refuses as a whole (its inputs beyond a bound each member keeps) runs
// its requests one by one: none is failed for the others' bytes.
TEST(OnlineFillTest, ABatchTheSchedulerRefusesRunsItsRequestsOneByOne) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  ASSERT_NO_FATAL_FAILURE(Measure(online));
  runner.set_max_rows(2);
  Answer a, b;
  ASSERT_TRUE(online.Submit({0}, Request("m", 2, 1, absl::Seconds(30)), a.Callback()).ok());
  ASSERT_TRUE(online.Submit({0}, Request("m", 2, 5, absl::Seconds(30)), b.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  ASSERT_TRUE(a.outcome.ok()) << a.outcome.status();
  ASSERT_TRUE(b.outcome.ok()) << b.outcome.status();
  EXPECT_EQ(FirstValue(*b.outcome), 10.0f);
  // warm-up, the refused batch of 4 rows, then each alone.
  EXPECT_EQ(runner.runs().size(), 4u);
}

TEST(OnlineFillTest, ABatchThatFailsAsAWholeRunsItsRequestsOneByOne) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  ASSERT_NO_FATAL_FAILURE(Measure(online));
  runner.set_fail_rows(1);
  Answer a, b;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 1, absl::Seconds(30)), a.Callback()).ok());
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 2, absl::Seconds(30)), b.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  ASSERT_TRUE(a.outcome.ok()) << a.outcome.status();
  ASSERT_TRUE(b.outcome.ok()) << b.outcome.status();
  EXPECT_EQ(FirstValue(*b.outcome), 4.0f);
  EXPECT_EQ(runner.runs().size(), 4u) << "warm-up, the batch, then each alone";
  EXPECT_EQ(online.Stats().failed, 0u);
}

TEST(OnlineFillTest, AClientsDeadlineSoonerThanItsObjectiveBoundsItsWait) {
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  TaskSpec spec = Request("m", 1, 1, absl::Seconds(30));
  spec.deadline = absl::Now() + absl::Milliseconds(40);
  Answer a;
  const int64_t start = base::MonotonicNowNs();
  ASSERT_TRUE(online.Submit({0}, std::move(spec), a.Callback()).ok());
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.outcome.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Nanoseconds(base::MonotonicNowNs() - start), absl::Seconds(5))
      << "waited for its 30 s objective, not its 40 ms deadline";
}

TEST(OnlineFillTest, OnlyOneKnownTenantsAlikeRowsShareAPassAndBatchesArePredictedPerRow) {
  TaskSpec a = Request("m", 1, 1, absl::Seconds(1));
  EXPECT_TRUE(MayBatch(a, Request("m", 3, 1, absl::Seconds(1))));
  EXPECT_FALSE(MayBatch(a, Request("m", 1, 1, absl::Seconds(1), "bob")));
  EXPECT_FALSE(
      MayBatch(Request("m", 1, 1, absl::Seconds(1), ""), Request("m", 1, 1, absl::Seconds(1), "")))
      << "an unknown principal may be anyone";
  TaskSpec ragged = Request("m", 2, 1, absl::Seconds(1));
  ragged.inputs.push_back(Input(2, 0));
  ragged.inputs.push_back(Input(1, 0));  // its rows do not line up
  ragged.inputs[1].name = "attention_mask";
  ragged.inputs[2].name = "token_type_ids";
  TaskSpec other = ragged;
  other.inputs[2] = Input(2, 0);
  other.inputs[2].name = "token_type_ids";
  EXPECT_FALSE(MayBatch(ragged, other));

  // One-row passes of about 10 ms, then a batch of 4 rows in about 10 ms: a row more costs
  // little, and 4 rows are not predicted at 4 passes' time.
  FakeRunner runner;
  OnlineFill online(runner.Runner(), {});
  runner.set_service(absl::Milliseconds(10));
  for (int i = 0; i < 2; ++i) {
    Answer one;
    ASSERT_TRUE(online.Submit({0}, Request("m", 1, 0, absl::Seconds(30)), one.Callback()).ok());
    Bubble(online, 0, 1000);
    ASSERT_TRUE(one.Wait());
  }
  Answer four;
  ASSERT_TRUE(online.Submit({0}, Request("m", 4, 0, absl::Seconds(30)), four.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(four.Wait());
  const std::optional<absl::Duration> one_row = online.Predicted(0, "m", 1);
  const std::optional<absl::Duration> four_rows = online.Predicted(0, "m", 4);
  ASSERT_TRUE(one_row && four_rows);
  EXPECT_GE(*one_row, absl::Milliseconds(9));
  EXPECT_LT(*four_rows, *one_row * 2);
}

TEST(OnlineFillTest, ParsesTheOverflowChoice) {
  EXPECT_EQ(*ParseOnlineOverflow("run"), OnlineOverflow::kRun);
  EXPECT_EQ(*ParseOnlineOverflow("refuse"), OnlineOverflow::kRefuse);
  EXPECT_FALSE(ParseOnlineOverflow("sometimes").ok());
}

}  // namespace
}  // namespace pswitch::controller
