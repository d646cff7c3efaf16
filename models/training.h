// One training step of a zoo model: train mode, forward, loss, backward, optimizer step.
#ifndef PSWITCH_MODELS_TRAINING_H_
#define PSWITCH_MODELS_TRAINING_H_

#include <ATen/core/Tensor.h>

#include <memory>

#include "absl/status/statusor.h"
#include "models/zoo_model.h"

namespace torch::optim {
class Optimizer;
}

namespace pswitch::models {

enum class OptimizerKind { kSgd, kAdam };

struct TrainerOptions {
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double learning_rate = 0.01;
  double momentum = 0.9;  // SGD only
};

// Trains `model` in place. The model is borrowed: it must outlive the Trainer. Not thread-safe.
class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(ZooModel& model,
                                                         const TrainerOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Puts the model in train mode and runs one step; returns the loss before the update.
  // Deterministic on the CPU for a fixed libtorch seed (dropout draws from the global generator).
  absl::StatusOr<double> Step(const ModelInput& input, const at::Tensor& target);

 private:
  Trainer(ZooModel& model, std::unique_ptr<torch::optim::Optimizer> optimizer);

  ZooModel& model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_TRAINING_H_
