#include "controller/task_queue.h"

#include <vector>

#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

TaskTicket Task(uint64_t id, TaskKind kind, int priority = 0,
                absl::Time deadline = absl::InfiniteFuture()) {
  return TaskTicket{id, "m", kind, priority, deadline};
}

std::vector<uint64_t> Drain(TaskQueue& q) {
  std::vector<uint64_t> ids;
  while (auto t = q.Pop()) ids.push_back(t->id);
  return ids;
}

TEST(TaskQueueTest, FcfsServesInArrivalOrder) {
  TaskQueue q(Policy::kFcfs, /*inference_preempts_training=*/false);
  q.Push(Task(1, TaskKind::kTraining, 5));
  q.Push(Task(2, TaskKind::kInference, 0, absl::UnixEpoch()));
  q.Push(Task(3, TaskKind::kInference, 9));
  EXPECT_EQ(Drain(q), (std::vector<uint64_t>{1, 2, 3}));
}

TEST(TaskQueueTest, InferenceRanksBeforeTrainingWhenItPreemptsIt) {
  TaskQueue q(Policy::kFcfs);
  q.Push(Task(1, TaskKind::kTraining));
  q.Push(Task(2, TaskKind::kInference));
  q.PushFront(Task(3, TaskKind::kTraining));  // a preempted task
  q.Push(Task(4, TaskKind::kInference));
  EXPECT_EQ(Drain(q), (std::vector<uint64_t>{2, 4, 3, 1}));
}

TEST(TaskQueueTest, EdfServesEarliestDeadlineFirstThenUndatedInArrivalOrder) {
  TaskQueue q(Policy::kEdf);
  absl::Time t0 = absl::Now();
  q.Push(Task(1, TaskKind::kInference));
  q.Push(Task(2, TaskKind::kInference, 0, t0 + absl::Milliseconds(50)));
  q.Push(Task(3, TaskKind::kInference, 0, t0 + absl::Milliseconds(10)));
  q.Push(Task(4, TaskKind::kInference));
  q.Push(Task(5, TaskKind::kInference, 0, t0 + absl::Milliseconds(10)));
  EXPECT_EQ(Drain(q), (std::vector<uint64_t>{3, 5, 2, 1, 4}));
}

TEST(TaskQueueTest, PriorityServesHighestFirstAndArrivalAmongEquals) {
  TaskQueue q(Policy::kPriority);
  q.Push(Task(1, TaskKind::kInference, 1));
  q.Push(Task(2, TaskKind::kInference, 7));
  q.Push(Task(3, TaskKind::kInference, 1));
  q.Push(Task(4, TaskKind::kInference, 7));
  EXPECT_EQ(Drain(q), (std::vector<uint64_t>{2, 4, 1, 3}));
}

TEST(TaskQueueTest, PreemptedTaskResumesBeforeLaterEquals) {
  TaskQueue q(Policy::kFcfs, false);
  q.Push(Task(2, TaskKind::kTraining));
  q.PushFront(Task(1, TaskKind::kTraining));
  q.Push(Task(3, TaskKind::kTraining));
  EXPECT_EQ(q.Peek()->id, 1u);
  EXPECT_EQ(Drain(q), (std::vector<uint64_t>{1, 2, 3}));
}

TEST(TaskQueueTest, CancelRemovesOnlyWaitingTasks) {
  TaskQueue q(Policy::kFcfs);
  q.Push(Task(1, TaskKind::kInference));
  q.Push(Task(2, TaskKind::kInference));
  EXPECT_TRUE(q.Remove(1));
  EXPECT_FALSE(q.Remove(1));
  EXPECT_FALSE(q.Remove(42));
  EXPECT_EQ(Drain(q), (std::vector<uint64_t>{2}));
}

TEST(TaskQueueTest, OnlyTrainingIsPreemptedAndInferencePreemptsByDefault) {
  TaskQueue fcfs(Policy::kFcfs);
  TaskTicket training = Task(1, TaskKind::kTraining, 0);
  training.arrival_seq = 1;
  TaskTicket inference = Task(2, TaskKind::kInference, 0);
  inference.arrival_seq = 2;
  EXPECT_TRUE(fcfs.ShouldPreempt(training, inference));
  EXPECT_FALSE(fcfs.ShouldPreempt(inference, training));
  TaskTicket later_training = Task(3, TaskKind::kTraining, 9);
  later_training.arrival_seq = 3;
  EXPECT_FALSE(fcfs.ShouldPreempt(training, later_training));

  TaskQueue no_default(Policy::kFcfs, /*inference_preempts_training=*/false);
  EXPECT_FALSE(no_default.ShouldPreempt(training, inference));

  TaskQueue priority(Policy::kPriority, /*inference_preempts_training=*/false);
  EXPECT_TRUE(priority.ShouldPreempt(training, later_training));
  TaskTicket equal = later_training;
  equal.priority = 0;
  EXPECT_FALSE(priority.ShouldPreempt(training, equal));

  TaskQueue edf(Policy::kEdf, false);
  absl::Time t0 = absl::Now();
  training.deadline = t0 + absl::Seconds(10);
  TaskTicket urgent = Task(4, TaskKind::kTraining, 0, t0 + absl::Seconds(1));
  urgent.arrival_seq = 4;
  EXPECT_TRUE(edf.ShouldPreempt(training, urgent));
  EXPECT_FALSE(edf.ShouldPreempt(urgent, training));
}

TEST(TaskQueueTest, PolicyNamesParse) {
  EXPECT_EQ(*ParsePolicy("edf"), Policy::kEdf);
  EXPECT_EQ(PolicyName(*ParsePolicy("priority")), "priority");
  EXPECT_EQ(ParsePolicy("lifo").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::controller
