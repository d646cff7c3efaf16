// A dataset-inference fill job's steps (FreeRide's iterative task): `batch` rows of the dataset
// per step through the model, the outputs kept in row order and handed back when the run ends.
// In a resident run a step may split (issue 30 item 2): it runs the rows that fit what is left
// of the bubble and goes on with the rest in a later one; a run that ends in the middle of a
// step hands back only its whole steps (the next run computes that step whole).
#ifndef PSWITCH_WORKER_DATASET_INFERENCE_H_
#define PSWITCH_WORKER_DATASET_INFERENCE_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "proto/host_tensor.h"
#include "worker/iterative_task.h"

namespace pswitch::worker {

// What a run keeps of its outputs before it ends to hand them back (a resident run's next bubble
// starts a new run): on CUDA they stay on the device until then. They go back inline in RunDone,
// well under the control channel's frame bound (64 MiB).
inline constexpr int64_t kDatasetRunOutputBytes = 32ll << 20;

class DatasetInferenceTask final : public IterativeTask {
 public:
  // The model's forward over some rows (on the task's device), one output row per input row;
  // throws models::StepCut when its layer gate cuts it at the bubble's end.
  using Forward = std::function<at::Tensor(const at::Tensor& rows)>;
  // Of a step's rows, how many fit what is left of the bubble now (FillSteps::RowsThatFit), and
  // what to tell when a part is done (FillSteps::PartDone).
  struct RowBudget {
    std::function<int64_t()> rows_that_fit;
    std::function<void()> part_done;
  };

  // `rows` must outlive the task. `split` without rows_that_fit: each step runs whole.
  DatasetInferenceTask(Forward forward, const at::Tensor& rows, uint32_t batch, c10::Device device,
                       std::vector<proto::HostTensor>* outputs, RowBudget split = {},
                       int64_t max_output_bytes = kDatasetRunOutputBytes);

  absl::Status Step(uint32_t index) override;
  absl::Status Finish() override;
  // Whole steps' outputs only: a step in parts finishes before its run hands them back.
  bool Full() const override { return whole_bytes_ >= max_output_bytes_; }

 private:
  const Forward forward_;
  const at::Tensor& rows_;
  const int64_t batch_;
  const c10::Device device_;
  std::vector<proto::HostTensor>* const outputs_;
  const RowBudget split_;
  const int64_t max_output_bytes_;
  std::vector<at::Tensor> results_;  // in row order: whole steps, then the parts of a split one
  int64_t result_bytes_ = 0;
  int64_t whole_bytes_ = 0;    // of whole steps
  int64_t partial_step_ = -1;  // the step under way in parts, its rows done, its first part
  int64_t partial_rows_ = 0;
  size_t step_first_result_ = 0;
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_DATASET_INFERENCE_H_
