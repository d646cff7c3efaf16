#include "controller/online_fill.h"

#include <cstring>
#include <thread>

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
      uint64_t id;
      {
        absl::MutexLock lock(&mu_);
        runs_.push_back({gpu, spec});
        id = runs_.size();
        service = service_;
        refuse = refuse_;
        per_row = per_row_;
      }
      if (!refuse.ok()) return refuse;
      absl::SleepFor(service);
      TaskOutcome outcome = Doubled(spec);
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

 private:
  absl::Mutex mu_;
  std::vector<Run> runs_ ABSL_GUARDED_BY(mu_);
  absl::Duration service_ ABSL_GUARDED_BY(mu_);
  absl::Status refuse_ ABSL_GUARDED_BY(mu_);
  bool per_row_ ABSL_GUARDED_BY(mu_) = true;
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
  Answer warm;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 0, absl::Seconds(30)), warm.Callback()).ok());
  Bubble(online, 0, 100);
  ASSERT_TRUE(warm.Wait());
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
  Answer warm;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 0, absl::Seconds(30)), warm.Callback()).ok());
  Bubble(online, 0, 100);
  ASSERT_TRUE(warm.Wait());

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
  ASSERT_TRUE(c.Wait());
  // warm-up, alice's batch of a and b, bob's alone, then model n (not measured: alone, last).
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
  Answer warm;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 0, absl::Seconds(30)), warm.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(warm.Wait());
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
  Answer warm;
  ASSERT_TRUE(online.Submit({0}, Request("m", 1, 0, absl::Seconds(30)), warm.Callback()).ok());
  Bubble(online, 0, 1000);
  ASSERT_TRUE(warm.Wait());
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

TEST(OnlineFillTest, ParsesTheOverflowChoice) {
  EXPECT_EQ(*ParseOnlineOverflow("run"), OnlineOverflow::kRun);
  EXPECT_EQ(*ParseOnlineOverflow("refuse"), OnlineOverflow::kRefuse);
  EXPECT_FALSE(ParseOnlineOverflow("sometimes").ok());
}

}  // namespace
}  // namespace pswitch::controller
