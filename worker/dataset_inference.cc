#include "worker/dataset_inference.h"

#include <torch/cuda.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "models/training.h"
#include "worker/host_tensors.h"

namespace pswitch::worker {

DatasetInferenceTask::DatasetInferenceTask(Forward forward, const at::Tensor& rows, uint32_t batch,
                                           c10::Device device,
                                           std::vector<proto::HostTensor>* outputs, RowBudget split,
                                           int64_t max_output_bytes)
    : forward_(std::move(forward)),
      rows_(rows),
      batch_(std::max<uint32_t>(batch, 1)),
      device_(device),
      outputs_(outputs),
      split_(std::move(split)),
      max_output_bytes_(max_output_bytes) {}

absl::Status DatasetInferenceTask::Step(uint32_t index) {
  torch::NoGradGuard no_grad;
  const int64_t n = rows_.size(0);
  const int64_t first = int64_t{index} * batch_;
  if (first >= n) return absl::OutOfRangeError(absl::StrCat("step ", index, " past the dataset"));
  const int64_t step_rows = std::min(batch_, n - first);
  if (partial_step_ != int64_t{index}) {
    partial_step_ = index;
    partial_rows_ = 0;
    step_first_result_ = results_.size();
  }
  while (partial_rows_ < step_rows) {
    int64_t part = step_rows - partial_rows_;
    if (split_.rows_that_fit) {
      part = std::min(part, split_.rows_that_fit());
      if (part <= 0) return StepCutError();  // the rest of the step in a later bubble
    }
    try {
      results_.push_back(
          forward_(rows_.narrow(0, first + partial_rows_, part).to(device_)).clone());
    } catch (const models::StepCut&) {
      // Cut at a layer boundary at its bubble's end (the gate): these rows run again later.
      return StepCutError();
    }
    result_bytes_ += static_cast<int64_t>(results_.back().nbytes());
    // A fill step must be over when it returns: its bubble ends right after it.
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    partial_rows_ += part;
    if (partial_rows_ < step_rows && split_.part_done) split_.part_done();
  }
  partial_step_ = -1;
  whole_bytes_ = result_bytes_;
  return absl::OkStatus();
}

absl::Status DatasetInferenceTask::Finish() {
  // A step the run ended in the middle of is not done: its next run computes it whole, so the
  // parts done here are not outputs.
  if (partial_step_ >= 0) results_.resize(step_first_result_);
  if (results_.empty()) return absl::OkStatus();
  PSWITCH_ASSIGN_OR_RETURN(proto::HostTensor out, ToHostTensor("output", at::cat(results_)));
  outputs_->push_back(std::move(out));
  return absl::OkStatus();
}

}  // namespace pswitch::worker
