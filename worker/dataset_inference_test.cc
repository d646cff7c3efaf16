#include "worker/dataset_inference.h"

#include <deque>

#include "gtest/gtest.h"
#include "models/training.h"

namespace pswitch::worker {
namespace {

// Rows 0..n-1 (one value each); the "model" doubles them, so an output row names its input row.
at::Tensor Rows(int64_t n) { return torch::arange(n, torch::kFloat32).reshape({n, 1}); }
at::Tensor Double(const at::Tensor& rows) { return rows * 2; }

std::vector<float> Values(const std::vector<proto::HostTensor>& outputs) {
  std::vector<float> v;
  for (const proto::HostTensor& t : outputs) {
    const float* f = reinterpret_cast<const float*>(t.data.data());
    v.insert(v.end(), f, f + t.data.size() / sizeof(float));
  }
  return v;
}

std::vector<float> Doubled(int64_t from, int64_t to) {
  std::vector<float> v;
  for (int64_t i = from; i < to; ++i) v.push_back(2.0f * static_cast<float>(i));
  return v;
}

// The rows that fit, one answer per question, as a bubble's time runs out and the next opens.
class ScriptedBudget {
 public:
  explicit ScriptedBudget(std::deque<int64_t> answers) : answers_(std::move(answers)) {}
  int64_t operator()() {
    const int64_t a = answers_.empty() ? 1 << 20 : answers_.front();
    if (!answers_.empty()) answers_.pop_front();
    return a;
  }

 private:
  std::deque<int64_t> answers_;
};

TEST(DatasetInferenceTest, WholeStepsAnswerEveryRowOnceInOrder) {
  const at::Tensor rows = Rows(10);
  std::vector<proto::HostTensor> outputs;
  DatasetInferenceTask task(Double, rows, 4, c10::Device(c10::kCPU), &outputs);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(task.Step(i).ok());
  EXPECT_EQ(task.Step(3).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(task.Finish().ok());
  EXPECT_EQ(Values(outputs), Doubled(0, 10));
}

// A step of 4 rows split over bubbles: 3 rows fit, then none (the bubble ends), then the rest.
TEST(DatasetInferenceTest, AStepSplitAcrossBubblesAnswersEachRowOnce) {
  const at::Tensor rows = Rows(10);
  std::vector<proto::HostTensor> outputs;
  auto budget = std::make_shared<ScriptedBudget>(std::deque<int64_t>{3, 0, 16, 1, 0, 16});
  DatasetInferenceTask task(Double, rows, 4, c10::Device(c10::kCPU), &outputs,
                            DatasetInferenceTask::RowBudget{[budget] { return (*budget)(); }, {}});
  EXPECT_TRUE(IsStepCut(task.Step(0)));  // rows 0-2 done, no room for row 3
  ASSERT_TRUE(task.Step(0).ok());        // row 3, in the next bubble
  EXPECT_TRUE(IsStepCut(task.Step(1)));  // row 4
  ASSERT_TRUE(task.Step(1).ok());        // rows 5-7
  ASSERT_TRUE(task.Step(2).ok());
  ASSERT_TRUE(task.Finish().ok());
  EXPECT_EQ(Values(outputs), Doubled(0, 10));
}

// A run that ends in the middle of a step hands back its whole steps only: its next run
// computes that step whole, and no row is answered twice.
TEST(DatasetInferenceTest, ARunEndingInsideAStepHandsBackOnlyItsWholeSteps) {
  const at::Tensor rows = Rows(10);
  std::vector<proto::HostTensor> outputs;
  {
    auto budget = std::make_shared<ScriptedBudget>(std::deque<int64_t>{16, 2, 0});
    DatasetInferenceTask task(
        Double, rows, 4, c10::Device(c10::kCPU), &outputs,
        DatasetInferenceTask::RowBudget{[budget] { return (*budget)(); }, {}});
    ASSERT_TRUE(task.Step(0).ok());
    EXPECT_TRUE(IsStepCut(task.Step(1)));  // rows 4-5 done, then the run is stopped
    ASSERT_TRUE(task.Finish().ok());
  }
  EXPECT_EQ(Values(outputs), Doubled(0, 4));
  DatasetInferenceTask next(Double, rows, 4, c10::Device(c10::kCPU), &outputs);
  ASSERT_TRUE(next.Step(1).ok());
  ASSERT_TRUE(next.Step(2).ok());
  ASSERT_TRUE(next.Finish().ok());
  EXPECT_EQ(Values(outputs), Doubled(0, 10));
}

// A part cut by the layer gate at the bubble's end is lost, not half-kept: it runs again.
TEST(DatasetInferenceTest, APartCutByTheGateRunsAgain) {
  const at::Tensor rows = Rows(8);
  std::vector<proto::HostTensor> outputs;
  int calls = 0;
  auto budget = std::make_shared<ScriptedBudget>(std::deque<int64_t>{2, 2, 16});
  DatasetInferenceTask task(
      [&calls](const at::Tensor& r) -> at::Tensor {
        if (++calls == 2) throw models::StepCut();
        return Double(r);
      },
      rows, 8, c10::Device(c10::kCPU), &outputs,
      DatasetInferenceTask::RowBudget{[budget] { return (*budget)(); }, {}});
  EXPECT_TRUE(IsStepCut(task.Step(0)));  // rows 0-1 done, rows 2-3 cut
  ASSERT_TRUE(task.Step(0).ok());        // rows 2-7
  ASSERT_TRUE(task.Finish().ok());
  EXPECT_EQ(Values(outputs), Doubled(0, 8));
}

TEST(DatasetInferenceTest, ARunIsFullOnceItsOutputsReachTheirBound) {
  const at::Tensor rows = Rows(10);
  std::vector<proto::HostTensor> outputs;
  DatasetInferenceTask task(Double, rows, 4, c10::Device(c10::kCPU), &outputs, {},
                            /*max_output_bytes=*/20);
  EXPECT_FALSE(task.Full());
  ASSERT_TRUE(task.Step(0).ok());  // 16 bytes
  EXPECT_FALSE(task.Full());
  ASSERT_TRUE(task.Step(1).ok());  // 32 bytes
  EXPECT_TRUE(task.Full());
}

// Each part of a split step but its last says so (pswitchd sees progress though no whole step
// ended), and a run is not full from the parts of a step it has not finished.
TEST(DatasetInferenceTest, PartsAreToldAndDoNotFillARun) {
  const at::Tensor rows = Rows(12);
  std::vector<proto::HostTensor> outputs;
  int parts = 0;
  auto budget = std::make_shared<ScriptedBudget>(std::deque<int64_t>{2, 2, 0, 16});
  DatasetInferenceTask task(
      Double, rows, 12, c10::Device(c10::kCPU), &outputs,
      DatasetInferenceTask::RowBudget{[budget] { return (*budget)(); }, [&parts] { ++parts; }},
      /*max_output_bytes=*/8);
  EXPECT_TRUE(IsStepCut(task.Step(0)));  // rows 0-3 in two parts, 16 bytes of outputs so far
  EXPECT_EQ(parts, 2);
  EXPECT_FALSE(task.Full()) << "the step is not done: its parts are no outputs yet";
  ASSERT_TRUE(task.Step(0).ok());  // rows 4-11, the step's last part
  EXPECT_EQ(parts, 2);
  EXPECT_TRUE(task.Full());
  ASSERT_TRUE(task.Finish().ok());
  EXPECT_EQ(Values(outputs), Doubled(0, 12));
}

}  // namespace
}  // namespace pswitch::worker
