#include "worker/warm_up.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/status.h"
#include "models/training.h"
#include "worker/executor.h"
#include "worker/host_tensors.h"
#include "worker/lease_allocator.h"
#include "worker/model_binding.h"

namespace pswitch::worker {
namespace {

// Runs `step` and waits until the device has finished it.
absl::Status RunAndSync(const std::string& what, ComputeSection* compute, absl::Duration timeout,
                        const std::function<absl::Status()>& step) {
  absl::Status ran = step();
  absl::Status synced = compute != nullptr ? compute->Synchronize(what, timeout) : absl::OkStatus();
  return ran.ok() ? synced : ran;
}

// Runs `step` once (the cold run) and, when `measure`, once more, timed to its end on the device.
absl::StatusOr<int64_t> ColdThenWarm(const std::string& what, ComputeSection* compute,
                                     absl::Duration timeout, bool measure,
                                     const std::function<absl::Status()>& step) {
  PSWITCH_RETURN_IF_ERROR(RunAndSync(what, compute, timeout, step));
  if (!measure) return 0;
  const int64_t start = base::MonotonicNowNs();
  PSWITCH_RETURN_IF_ERROR(RunAndSync(what, compute, timeout, step));
  return base::MonotonicNowNs() - start;
}

void DropGradients(models::ZooModel& model) {
  for (at::Tensor& p : model.parameters()) p.mutable_grad() = at::Tensor();
}

absl::StatusOr<int64_t> WarmInference(BoundModel& bound, const std::string& name,
                                      const WarmSpec& spec, const WarmContext& context,
                                      const models::ModelInput& input, ComputeSection* compute) {
  models::ZooModel& model = bound.model();
  return ColdThenWarm(absl::StrCat("warming up '", name, "'"), compute, context.timeout,
                      spec.measure, [&] {
                        return models::CatchTorch(
                            absl::StrCat("warming up '", name, "' at batch ", spec.batch), [&] {
                              torch::NoGradGuard no_grad;
                              model.eval();
                              ScopedLeaseAllocation from_lease(context.activations);
                              (void)model.Forward(input);
                            });
                      });
}

absl::StatusOr<int64_t> WarmTraining(BoundModel& bound, const std::string& name,
                                     const WarmSpec& spec, const WarmContext& context,
                                     ComputeSection* compute) {
  models::ZooModel& model = bound.model();
  const std::string what =
      absl::StrCat("warming up a training step of '", name, "' at batch ", spec.batch);
  // One small tensor per trainable parameter: the update's cost is per parameter (its launches),
  // and the measured step must hold all of it.
  std::vector<at::Tensor> optimizer_like;
  std::unique_ptr<ScratchBuffers> scratch;
  PSWITCH_RETURN_IF_ERROR(models::CatchTorch(what, [&] {
    for (const at::Tensor& p : model.parameters()) {
      if (p.requires_grad()) {
        optimizer_like.push_back(at::empty({std::min<int64_t>(p.numel(), 1 << 12)}, p.options()));
      }
    }
    scratch = std::make_unique<ScratchBuffers>(model);
  }));
  if (optimizer_like.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", name, "' has no trainable parameter"));
  }
  const models::TrainerOptions options;  // what fill jobs train with
  absl::StatusOr<int64_t> took =
      ColdThenWarm(what, compute, context.timeout, spec.measure, [&]() -> absl::Status {
        DropGradients(model);
        {
          ScopedLeaseAllocation from_lease(context.activations);
          // Its batch drawn inside the step, as a training task's every step draws its own (on
          // the task's device): part of what a fill step costs.
          TrainingBatch batch;
          PSWITCH_RETURN_IF_ERROR(models::CatchTorch(what, [&] {
            batch = SyntheticTrainingBatch(model, spec.batch, /*seed=*/0, context.device);
          }));
          PSWITCH_RETURN_IF_ERROR(
              models::ComputeGradients(model, batch.input, batch.target).status());
        }
        // The update itself: its kernels, on small scratch parameters of the same device and
        // dtype, one per real one (those are the region, never written by a warm-up).
        return models::WarmOptimizer(options, optimizer_like);
      });
  // Gradients would hold lease memory until the model trains; its buffers go back to the region.
  absl::Status restored = models::CatchTorch(what, [&] {
    DropGradients(model);
    model.eval();
    scratch.reset();
  });
  PSWITCH_RETURN_IF_ERROR(took.status());
  PSWITCH_RETURN_IF_ERROR(restored);
  return *took;
}

}  // namespace

absl::StatusOr<WarmSpec> WarmSpec::From(const proto::WarmUp* warm, uint32_t max_batch) {
  WarmSpec spec;
  if (warm == nullptr) return spec;
  if (warm->batch() > max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("warm-up batch ", warm->batch(), " above the maximum ", max_batch));
  }
  spec.batch = warm->batch();
  spec.train = warm->train();
  spec.train_required = warm->train_required();
  spec.measure = warm->measure();
  return spec;
}

TrainingBatch SyntheticTrainingBatch(models::ZooModel& model, uint32_t batch, uint64_t seed,
                                     c10::Device device) {
  TrainingBatch out;
  out.input = model.ExampleInput(batch, seed, device);
  out.target = model.ExampleTarget(batch, seed, device);
  return out;
}

absl::StatusOr<WarmResult> WarmUp(BoundModel& bound, const std::string& name, const WarmSpec& spec,
                                  const WarmContext& context) {
  WarmResult result;
  if (spec.batch == 0) return result;
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<ComputeSection> compute,
                           context.executor.Enter(context.stream));
  context.executor.SetActivationLimit(0);
  // One example batch for both kinds of step.
  models::ModelInput input;
  absl::Status made = models::CatchTorch(absl::StrCat("warming up '", name, "': input"), [&] {
    input = bound.model().ExampleInput(spec.batch, 0, context.device);
  });
  absl::StatusOr<int64_t> infer =
      made.ok() ? WarmInference(bound, name, spec, context, input, compute.get())
                : absl::StatusOr<int64_t>(made);
  absl::StatusOr<int64_t> train = 0;
  if (infer.ok() && spec.train) {
    train = WarmTraining(bound, name, spec, context, compute.get());
  }
  // Workspaces the warm-up allocated (cuBLAS, cuDNN) stay for the process, charged to no task.
  context.executor.MarkActivationsPersistent();
  PSWITCH_RETURN_IF_ERROR(infer.status());
  result.infer_step_ns = *infer;
  if (train.ok()) {
    result.train_step_ns = *train;
  } else if (spec.train_required) {
    return train.status();
  } else {
    result.train_status = train.status();
  }
  return result;
}

ScratchBuffers::ScratchBuffers(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  try {
    for (const at::Tensor& b : module.buffers(/*recurse=*/true)) {
      at::Tensor own = b;  // shares the module's TensorImpl: set_data swaps the module's buffer
      at::Tensor original = own.data();
      own.set_data(original.clone());
      buffers_.push_back(std::move(own));
      originals_.push_back(std::move(original));
    }
  } catch (...) {
    Restore();  // the buffers swapped so far go back before the error propagates
    throw;
  }
}

ScratchBuffers::~ScratchBuffers() { Restore(); }

void ScratchBuffers::Restore() {
  torch::NoGradGuard no_grad;
  // In reverse: a buffer reached twice (a shared submodule) ends on its first original.
  for (size_t i = buffers_.size(); i-- > 0;) buffers_[i].set_data(originals_[i]);
  buffers_.clear();
  originals_.clear();
}

}  // namespace pswitch::worker
