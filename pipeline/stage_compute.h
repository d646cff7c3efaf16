// What a pipeline stage computes: its slice of the model's forward and backward passes, one
// micro-batch at a time, and the optimizer step at the iteration's end. The stage runner
// (stage_runner.h) moves the tensors between stages and owns all waiting; a StageCompute never
// blocks on another stage.
//
// Implementations: SimulatedCompute (sleeps, below) and Gpt2StageCompute (gpt2_stage.h, real
// libtorch training). Thread-compatible: the stage's compute thread makes every call.
#ifndef PSWITCH_PIPELINE_STAGE_COMPUTE_H_
#define PSWITCH_PIPELINE_STAGE_COMPUTE_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "pipeline/simulator.h"
#include "pipeline/wire.h"

namespace pswitch::pipeline {

class StageCompute {
 public:
  virtual ~StageCompute() = default;

  // The activation this stage receives from the previous one (and sends the gradient of).
  virtual TensorSpec InputSpec() const = 0;
  // The activation this stage sends to the next one (and receives the gradient of).
  virtual TensorSpec OutputSpec() const = 0;

  // The cost of one micro-batch's forward and backward pass on this stage, measured or
  // configured. Leaves the stage's training state as it was.
  virtual absl::StatusOr<StageCost> Profile() = 0;

  // Clears the gradients before iteration `iteration`'s first op.
  virtual absl::Status StartIteration(int iteration) = 0;
  // Forward of `microbatch`. `input` is the previous stage's activation (empty on the first
  // stage, which reads its own data). Returns the activation for the next stage (empty on the
  // last stage, which computes the loss instead).
  virtual absl::StatusOr<WireTensor> Forward(int microbatch, WireTensor input) = 0;
  // Backward of `microbatch`. `output_grad` is the gradient of this stage's output (empty on
  // the last stage). Returns the gradient of its input (empty on the first stage).
  virtual absl::StatusOr<WireTensor> Backward(int microbatch, WireTensor output_grad) = 0;

  // The gradient of a weight this stage shares with the stage at the pipeline's other end
  // (GPT-2's embedding, tied to the LM head), or nullopt when it shares none. The runner
  // exchanges it with the other end and hands the peer's in through AddTiedGradient.
  virtual absl::StatusOr<std::optional<WireTensor>> TiedGradient() { return std::nullopt; }
  virtual absl::Status AddTiedGradient(const WireTensor& peer);

  // Applies the optimizer step after the iteration's last op. Returns the iteration's loss on
  // the last stage, NaN elsewhere.
  virtual absl::StatusOr<double> FinishIteration() = 0;
};

// Stands in for a model slice: every op sleeps its cost and sends a small f32 tensor, so the
// waits between stages are real idle time even with fewer cores than stages.
class SimulatedCompute final : public StageCompute {
 public:
  // What simulated stages pass along when nothing real is beside them.
  static TensorSpec DefaultMessage() { return {WireDType::kF32, {256}}; }

  // Ops cost `cost`; messages (activations both ways, gradients) are zero-filled `message`
  // tensors: a real stage beside simulated ones needs its own activation's shape.
  static std::unique_ptr<SimulatedCompute> WithCost(const StageCost& cost,
                                                    TensorSpec message = DefaultMessage());
  // Ops cost what `source->Profile()` measures on the first Profile() call (the real stage's
  // costs); `source` is released right after.
  static std::unique_ptr<SimulatedCompute> ProfiledFrom(std::unique_ptr<StageCompute> source,
                                                        TensorSpec message = DefaultMessage());

  TensorSpec InputSpec() const override { return message_; }
  TensorSpec OutputSpec() const override { return message_; }
  absl::StatusOr<StageCost> Profile() override;
  absl::Status StartIteration(int iteration) override;
  absl::StatusOr<WireTensor> Forward(int microbatch, WireTensor input) override;
  absl::StatusOr<WireTensor> Backward(int microbatch, WireTensor output_grad) override;
  absl::StatusOr<double> FinishIteration() override;

 private:
  SimulatedCompute(std::optional<StageCost> cost, std::unique_ptr<StageCompute> source,
                   TensorSpec message);
  WireTensor Message(int microbatch) const;

  const TensorSpec message_;
  std::optional<StageCost> cost_;  // unset until the source has been profiled
  std::unique_ptr<StageCompute> source_;
};

}  // namespace pswitch::pipeline

#endif  // PSWITCH_PIPELINE_STAGE_COMPUTE_H_
