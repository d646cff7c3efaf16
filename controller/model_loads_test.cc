#include "controller/model_loads.h"

#include <optional>

#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

struct Result {
  std::optional<absl::Status> status;
  LoadOutcome outcome;
  ModelLoads::Done Callback() {
    return [this](const LoadOutcome& o) {
      status = o.status;
      outcome = o;
    };
  }
};

TEST(ModelLoadsTest, ARegistrationCompletesWhenEveryCountedWorkerHasAnswered) {
  ModelLoads loads(3);
  for (size_t s = 0; s < 3; ++s) loads.Announce(s);
  loads.Sent(0, "bert");
  loads.Sent(1, "bert");
  Result r;
  loads.Await("bert", {0, 1}, r.Callback());
  EXPECT_EQ(loads.pending(0), 1u);
  EXPECT_TRUE(loads.Loading(0, "bert"));
  loads.Answered(0, "bert", {absl::OkStatus()});
  EXPECT_FALSE(r.status.has_value());
  EXPECT_TRUE(loads.Loaded(0, "bert"));
  EXPECT_EQ(loads.pending(0), 0u);
  loads.Answered(1, "bert", {absl::OkStatus()});
  ASSERT_TRUE(r.status.has_value());
  EXPECT_TRUE(r.status->ok());
  EXPECT_EQ(loads.loaded_count(1), 1u);
}

TEST(ModelLoadsTest, ARegistrationReportsTheSlowestStepItsWorkersMeasured) {
  ModelLoads loads(3);
  for (size_t s = 0; s < 3; ++s) loads.Sent(s, "fill-1");
  Result r;
  loads.Await("fill-1", {0, 1, 2}, r.Callback());
  loads.Answered(0, "fill-1", {absl::OkStatus(), absl::Milliseconds(3), absl::Milliseconds(9)});
  loads.Answered(1, "fill-1", {absl::OkStatus(), absl::Milliseconds(5), absl::Milliseconds(7)});
  loads.Answered(2, "fill-1", {absl::OkStatus()});  // measured nothing
  ASSERT_TRUE(r.status.has_value());
  EXPECT_TRUE(r.status->ok());
  EXPECT_EQ(r.outcome.infer_step, absl::Milliseconds(5));
  EXPECT_EQ(r.outcome.train_step, absl::Milliseconds(9));
}

// A load unloaded while in flight, then registered again: the first (stale) answer, even a
// failure, is not the new registration's; the second is.
TEST(ModelLoadsTest, AStaleAnswerAfterAnUnloadIsNotTheNextRegistrations) {
  ModelLoads loads(1);
  loads.Announce(0);
  loads.Sent(0, "m");
  loads.Forget("m");   // unloaded while loading
  loads.Sent(0, "m");  // registered again
  Result second;
  loads.Await("m", {0}, second.Callback());
  loads.Answered(0, "m", {absl::InternalError("the old load failed")});
  EXPECT_FALSE(second.status.has_value()) << "the stale answer counted";
  EXPECT_TRUE(loads.Loading(0, "m"));
  loads.Answered(0, "m", {absl::OkStatus()});
  ASSERT_TRUE(second.status.has_value());
  EXPECT_TRUE(second.status->ok()) << *second.status;
  EXPECT_TRUE(loads.Loaded(0, "m"));
}

TEST(ModelLoadsTest, TheFirstErrorIsReportedNamingTheWorker) {
  ModelLoads loads(2);
  loads.Sent(0, "m");
  loads.Sent(1, "m");
  Result r;
  loads.Await("m", {0, 1}, r.Callback());
  loads.Answered(1, "m", {absl::ResourceExhaustedError("out of memory")});
  loads.Answered(0, "m", {absl::InternalError("second")});
  ASSERT_TRUE(r.status.has_value());
  EXPECT_EQ(r.status->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r.status->message(), "worker 1 could not load 'm': out of memory");
  EXPECT_FALSE(loads.Loaded(1, "m"));
  EXPECT_FALSE(loads.Loaded(0, "m"));
}

// A dead worker counts down only the loads it was sent: its death is their answer.
TEST(ModelLoadsTest, ADeadWorkerCountsDownOnlyTheLoadsItWasSent) {
  ModelLoads loads(2);
  loads.Sent(0, "a");
  loads.Sent(1, "a");
  loads.Sent(1, "b");
  Result a, b;
  loads.Await("a", {0, 1}, a.Callback());
  loads.Await("b", {1}, b.Callback());
  loads.Answered(1, "a", {absl::OkStatus()});
  loads.Died(0);  // never answered "a"
  ASSERT_TRUE(a.status.has_value());
  EXPECT_TRUE(a.status->ok());
  EXPECT_FALSE(b.status.has_value()) << "slot 0 was never sent 'b'";
  EXPECT_EQ(loads.pending(0), 0u);
  loads.Died(1);
  ASSERT_TRUE(b.status.has_value());
  EXPECT_TRUE(loads.Loaded(1, "a")) << "known until a fresh process takes the slot";
  loads.Reset(1);
  EXPECT_FALSE(loads.Loaded(1, "a"));
  EXPECT_FALSE(loads.announced(1));
}

// A worker that announced after the registration loads the whole catalog, this model included;
// its answer is not one the registration waits for and must not complete it early.
TEST(ModelLoadsTest, OnlyTheCountedWorkersAnswersCount) {
  ModelLoads loads(3);
  loads.Sent(0, "m");
  Result r;
  loads.Await("m", {0}, r.Callback());
  loads.Sent(2, "m");  // slot 2 announced later
  loads.Answered(2, "m", {absl::OkStatus()});
  EXPECT_FALSE(r.status.has_value());
  loads.Died(2);
  EXPECT_FALSE(r.status.has_value());
  loads.Answered(0, "m", {absl::InternalError("bad weights")});
  ASSERT_TRUE(r.status.has_value());
  EXPECT_EQ(r.status->code(), absl::StatusCode::kInternal);
}

TEST(ModelLoadsTest, NothingToWaitForCompletesAtOnce) {
  ModelLoads loads(1);
  Result r;
  loads.Await("x", {}, r.Callback());
  ASSERT_TRUE(r.status.has_value());
  EXPECT_TRUE(r.status->ok());
  loads.Answered(0, "unawaited", {absl::OkStatus()});  // no registration: just bookkeeping
  EXPECT_TRUE(loads.Loaded(0, "unawaited"));
}

// An unload waits while any worker is still loading the model, then forgets it everywhere, so a
// later registration of the name is sent to every worker afresh.
TEST(ModelLoadsTest, AnUnloadedModelIsForgottenByEverySlot) {
  ModelLoads loads(2);
  loads.Announce(0);
  loads.Announce(1);
  loads.Sent(0, "bert");
  loads.Sent(1, "bert");
  loads.Sent(0, "gpt2");
  loads.Answered(0, "bert", {absl::OkStatus()});
  EXPECT_TRUE(loads.AnyLoading("bert"));
  loads.Answered(1, "bert", {absl::OkStatus()});
  EXPECT_FALSE(loads.AnyLoading("bert"));
  EXPECT_TRUE(loads.AnyLoading("gpt2"));
  loads.Forget("bert");
  EXPECT_FALSE(loads.Loaded(0, "bert"));
  EXPECT_FALSE(loads.Loaded(1, "bert"));
  loads.Answered(0, "gpt2", {absl::OkStatus()});
  EXPECT_TRUE(loads.Loaded(0, "gpt2")) << "other models stay";
  EXPECT_EQ(loads.loaded_count(0), 1u);
}

// A busy worker's load answered after the model was unloaded: it is dropped right after (the
// unload sent DropModel behind the load), so the slot must not count as holding it, and a new
// registration of the name sends a load of its own.
TEST(ModelLoadsTest, ALoadAnsweredAfterItsUnloadLeavesNothingLoaded) {
  ModelLoads loads(1);
  loads.Announce(0);
  loads.Sent(0, "bert");
  EXPECT_TRUE(loads.Holds(0, "bert"));
  loads.Forget("bert");
  EXPECT_TRUE(loads.Dropped(0, "bert"));
  loads.Answered(0, "bert", {absl::OkStatus()});
  EXPECT_FALSE(loads.Loaded(0, "bert"));
  EXPECT_FALSE(loads.Holds(0, "bert"));
  EXPECT_FALSE(loads.Dropped(0, "bert"));
  EXPECT_EQ(loads.pending(0), 0u);
  loads.Sent(0, "bert");  // registered again
  loads.Answered(0, "bert", {absl::OkStatus()});
  EXPECT_TRUE(loads.Loaded(0, "bert"));
}

}  // namespace
}  // namespace pswitch::controller
