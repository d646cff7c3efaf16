#include "models/training.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "absl/strings/str_cat.h"
#include "proto/status.h"

namespace pswitch::models {

Trainer::Trainer(ZooModel& model, std::unique_ptr<torch::optim::Optimizer> optimizer)
    : model_(model), optimizer_(std::move(optimizer)) {}

Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(ZooModel& model,
                                                         const TrainerOptions& options) {
  if (options.learning_rate <= 0) {
    return absl::InvalidArgumentError("learning rate must be positive");
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  PSWITCH_RETURN_IF_ERROR(
      CatchTorch(absl::StrCat("model '", model.model_name(), "': optimizer"), [&] {
        if (options.optimizer == OptimizerKind::kAdam) {
          optimizer = std::make_unique<torch::optim::Adam>(
              model.parameters(), torch::optim::AdamOptions(options.learning_rate));
        } else {
          optimizer = std::make_unique<torch::optim::SGD>(
              model.parameters(),
              torch::optim::SGDOptions(options.learning_rate).momentum(options.momentum));
        }
      }));
  return std::unique_ptr<Trainer>(new Trainer(model, std::move(optimizer)));
}

absl::StatusOr<double> Trainer::Step(const ModelInput& input, const at::Tensor& target) {
  double loss_value = 0;
  PSWITCH_RETURN_IF_ERROR(
      CatchTorch(absl::StrCat("model '", model_.model_name(), "': training step"), [&] {
        model_.train();
        optimizer_->zero_grad();
        ModelOutput out = model_.Forward(input);
        at::Tensor loss = model_.Loss(out, target);
        loss.backward();
        optimizer_->step();
        loss_value = loss.item<double>();
      }));
  return loss_value;
}

}  // namespace pswitch::models
