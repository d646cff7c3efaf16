#include "api/client_codec.h"

#include "gtest/gtest.h"

namespace pswitch::api {
namespace {

template <typename Table, typename Value>
const Table* RoundTrip(flatbuffers::FlatBufferBuilder& b, const Value& value) {
  b.Finish(Encode(b, value));
  return flatbuffers::GetRoot<Table>(b.GetBufferPointer());
}

TEST(ClientCodecTest, TaskStatusRoundTripsEveryField) {
  TaskStatus in;
  in.task_id = 42;
  in.model = "resnet50";
  in.state = TaskState::kCancelled;
  in.iterations_done = 7;
  in.preemptions = 2;
  in.worker_pid = 1234;
  in.error = absl::CancelledError("task 42 cancelled");
  in.clean_time = absl::Microseconds(35);
  in.cleaned_after_drain = true;
  flatbuffers::FlatBufferBuilder b;
  absl::StatusOr<TaskStatus> out = Decode(*RoundTrip<proto::TaskStatus>(b, in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->task_id, 42u);
  EXPECT_EQ(out->model, "resnet50");
  EXPECT_EQ(out->state, TaskState::kCancelled);
  EXPECT_EQ(out->iterations_done, 7u);
  EXPECT_EQ(out->preemptions, 2u);
  EXPECT_EQ(out->worker_pid, 1234);
  EXPECT_EQ(out->error, in.error);
  EXPECT_EQ(out->clean_time, absl::Microseconds(35));
  EXPECT_TRUE(out->cleaned_after_drain);
}

TEST(ClientCodecTest, EveryStateAndKindMapsOneToOne) {
  for (TaskState s : {TaskState::kQueued, TaskState::kSwitching, TaskState::kRunning,
                      TaskState::kSucceeded, TaskState::kFailed, TaskState::kCancelled}) {
    EXPECT_EQ(*FromWire(ToWire(s)), s) << TaskStateName(s);
  }
  for (FillState s : {FillState::kSubmitted, FillState::kCreated, FillState::kPaused,
                      FillState::kRunning, FillState::kStopped}) {
    EXPECT_EQ(*FromWire(ToWire(s)), s) << FillStateName(s);
  }
  for (FillKind k : {FillKind::kInference, FillKind::kTraining, FillKind::kSynthetic}) {
    EXPECT_EQ(*FromWire(ToWire(k)), k);
  }
  EXPECT_EQ(ToWire(TaskState::kSwitching), proto::TaskState::Switching);
  EXPECT_EQ(ToWire(FillState::kPaused), proto::FillState::Paused);
}

// A state this build does not know (from a newer peer) is an error, never another state.
TEST(ClientCodecTest, UnknownWireValuesAreErrors) {
  EXPECT_EQ(FromWire(static_cast<proto::TaskState>(200)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromWire(static_cast<proto::FillState>(9)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromWire(static_cast<proto::FillKind>(3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  flatbuffers::FlatBufferBuilder b;
  b.Finish(proto::CreateTaskStatus(b, 1, static_cast<proto::TaskState>(77)));
  EXPECT_FALSE(Decode(*flatbuffers::GetRoot<proto::TaskStatus>(b.GetBufferPointer())).ok());
}

TEST(ClientCodecTest, FillStatusAndStatsRoundTrip) {
  FillJobStatus in;
  in.job_id = 9;
  in.state = FillState::kStopped;
  in.gpu = 3;
  in.steps_done = 10;
  in.steps_total = 12;
  in.bubbles = 4;
  in.predicted_remaining = absl::Milliseconds(250);
  in.meets_deadline = false;
  in.error = absl::UnavailableError("killed");
  flatbuffers::FlatBufferBuilder b;
  absl::StatusOr<FillJobStatus> out = Decode(*RoundTrip<proto::FillStatus>(b, in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->job_id, 9u);
  EXPECT_EQ(out->state, FillState::kStopped);
  EXPECT_EQ(out->gpu, 3u);
  EXPECT_EQ(out->steps_done, 10u);
  EXPECT_EQ(out->steps_total, 12u);
  EXPECT_EQ(out->bubbles, 4u);
  EXPECT_EQ(out->predicted_remaining, absl::Milliseconds(250));
  EXPECT_FALSE(out->meets_deadline);
  EXPECT_EQ(out->error, in.error);

  FillStats stats{5, absl::Milliseconds(40), absl::Milliseconds(30), 17,
                  absl::Microseconds(12), absl::Microseconds(90), 1};
  flatbuffers::FlatBufferBuilder b2;
  FillStats back = Decode(*RoundTrip<proto::FillStats>(b2, stats));
  EXPECT_EQ(back.bubbles, 5u);
  EXPECT_EQ(back.bubble_time, absl::Milliseconds(40));
  EXPECT_EQ(back.fill_step_time, absl::Milliseconds(30));
  EXPECT_EQ(back.steps, 17u);
  EXPECT_EQ(back.pause_p50, absl::Microseconds(12));
  EXPECT_EQ(back.pause_p99, absl::Microseconds(90));
  EXPECT_EQ(back.killed, 1u);
}

}  // namespace
}  // namespace pswitch::api
