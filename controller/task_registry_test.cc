#include "controller/task_registry.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

TEST(TaskRegistryTest, ATaskGoesFromQueuedThroughItsPhasesToItsEnd) {
  TaskRegistry tasks;
  const uint64_t id = tasks.Add("resnet50");
  EXPECT_EQ(id, 1u);
  EXPECT_EQ(tasks.Add("bert"), 2u);
  absl::StatusOr<TaskStatus> info = tasks.Query(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->model, "resnet50");
  EXPECT_EQ(info->state, TaskState::kQueued);

  tasks.SetState(id, TaskState::kSwitching, 0, 1234);
  EXPECT_EQ(tasks.Query(id)->worker_pid, 1234);
  tasks.MarkTransmitted(id);
  EXPECT_EQ(tasks.Query(id)->state, TaskState::kRunning);
  tasks.Requeue(id, 7);
  info = tasks.Query(id);
  EXPECT_EQ(info->state, TaskState::kQueued);
  EXPECT_EQ(info->iterations_done, 7u);
  EXPECT_EQ(info->preemptions, 1u);
  EXPECT_EQ(info->worker_pid, 0);
  // Transmitted only moves a switching task: a queued one stays queued.
  tasks.MarkTransmitted(id);
  EXPECT_EQ(tasks.Query(id)->state, TaskState::kQueued);
  tasks.RecordCleaning(id, absl::Microseconds(40), true);
  tasks.Finish(id, absl::OkStatus(), 10);
  info = tasks.Query(id);
  EXPECT_EQ(info->state, TaskState::kSucceeded);
  EXPECT_EQ(info->iterations_done, 10u);
  EXPECT_EQ(info->clean_time, absl::Microseconds(40));
  EXPECT_TRUE(info->cleaned_after_drain);
}

// Issue 27 item 9: iterations_done stayed 0 while a training task ran and after its cancel.
TEST(TaskRegistryTest, ProgressShowsWhileRunningAndStaysAfterACancel) {
  TaskRegistry tasks;
  const uint64_t id = tasks.Add("m");
  tasks.SetState(id, TaskState::kRunning, 0, 1234);
  tasks.Progress(id, 5);
  EXPECT_EQ(tasks.Query(id)->iterations_done, 5u);
  tasks.Progress(id, 3);  // a late report never moves it back
  EXPECT_EQ(tasks.Query(id)->iterations_done, 5u);
  tasks.Progress(id, 5685);
  tasks.Finish(id, absl::CancelledError("task 1 cancelled after 5685 iterations"), 0);
  absl::StatusOr<TaskStatus> info = tasks.Query(id);
  EXPECT_EQ(info->state, TaskState::kCancelled);
  EXPECT_EQ(info->iterations_done, 5685u);
  tasks.Progress(id, 9000);  // finished: nothing changes it
  EXPECT_EQ(tasks.Query(id)->iterations_done, 5685u);
  tasks.Progress(99, 1);  // unknown: ignored
  EXPECT_EQ(tasks.Query(99).status().code(), absl::StatusCode::kNotFound);
}

TEST(TaskRegistryTest, FailuresAndCancellationsKeepTheirError) {
  TaskRegistry tasks;
  const uint64_t failed = tasks.Add("m"), cancelled = tasks.Add("m");
  tasks.Finish(failed, absl::UnavailableError("worker died"), 0);
  tasks.Finish(cancelled, absl::CancelledError("task 2 cancelled"), 0);
  EXPECT_EQ(tasks.Query(failed)->state, TaskState::kFailed);
  EXPECT_EQ(tasks.Query(failed)->error.message(), "worker died");
  EXPECT_EQ(tasks.Query(cancelled)->state, TaskState::kCancelled);
  EXPECT_EQ(tasks.Query(99).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(TaskStateName(TaskState::kCancelled), "cancelled");
  // Kills are known by a payload that survives the message being reworded.
  absl::Status killed = MarkKilled(absl::UnavailableError("killed: did not pause"));
  EXPECT_TRUE(WasKilled(killed));
  EXPECT_EQ(killed.message(), "killed: did not pause");
  EXPECT_FALSE(WasKilled(absl::UnavailableError("killed: did not pause")));
  EXPECT_FALSE(WasKilled(absl::OkStatus()));
}

TEST(TaskRegistryTest, RecentIsNewestFirstAndOnlyFinishedTasksAreForgotten) {
  TaskRegistry tasks(/*max_finished=*/3);
  const uint64_t waiting = tasks.Add("long-queued");
  for (int i = 0; i < 5; ++i) tasks.Finish(tasks.Add("m"), absl::OkStatus(), 1);
  std::vector<TaskStatus> recent = tasks.Recent(10);
  ASSERT_EQ(recent.size(), 3u);
  EXPECT_EQ(recent[0].task_id, 6u);
  EXPECT_EQ(recent[1].task_id, 5u);
  EXPECT_EQ(recent.back().task_id, waiting) << "a queued task is never forgotten";
  EXPECT_EQ(tasks.Query(2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tasks.Recent(1).size(), 1u);
}

TEST(TaskRegistryTest, ReadersAndTheWriterMayRunConcurrently) {
  TaskRegistry tasks;
  std::thread writer([&] {
    for (int i = 0; i < 2000; ++i) {
      const uint64_t id = tasks.Add("m");
      tasks.SetState(id, TaskState::kRunning);
      tasks.Finish(id, absl::OkStatus(), 1);
    }
  });
  for (int i = 0; i < 2000; ++i) {
    std::vector<TaskStatus> recent = tasks.Recent(5);
    for (size_t k = 1; k < recent.size(); ++k) {
      ASSERT_GT(recent[k - 1].task_id, recent[k].task_id) << "a consistent snapshot, newest first";
    }
  }
  writer.join();
  EXPECT_EQ(tasks.Recent(100000).size(), 2000u);
}

}  // namespace
}  // namespace pswitch::controller
