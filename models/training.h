// One training step of a zoo model: train mode, forward, loss, backward, optimizer step.
#ifndef PSWITCH_MODELS_TRAINING_H_
#define PSWITCH_MODELS_TRAINING_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "api/types.h"
#include "models/zoo_model.h"

namespace torch::optim {
class Optimizer;
}

namespace pswitch::models {

// Defined with the types clients and pswitchd share (no torch there).
using api::OptimizerKind;
using api::OptimizerStateSlots;
using api::TrainerOptions;

// Bytes of one slot for `model`: every trainable parameter in parameters() order, each at a
// 256-byte aligned offset. Slot k starts at k * OptimizerSlotBytes(model).
uint64_t OptimizerSlotBytes(ZooModel& model);

// The first half of a training step: train mode, forward, loss, backward. Writes gradients (added
// to any already there) and what the forward itself writes (running statistics), never the
// parameters; returns the loss. Trainer::Step is this plus the optimizer's update.
absl::StatusOr<double> ComputeGradients(ZooModel& model, const ModelInput& input,
                                        const at::Tensor& target);

// One update of `options`' optimizer over scratch parameters shaped like `like` (on their device
// and dtype), one per tensor: its kernels are loaded and its first-step set-up paid without
// writing any model. Given one small tensor per trainable parameter of a model, its time is the
// model's update's: libtorch's optimizers launch kernels per parameter, and on a GPU that, not
// the bytes, is what an update costs (a ResNet-50 step 20.6 ms in bubbles on the H100 against a
// measurement of 11.7 ms that updated one scratch tensor).
absl::Status WarmOptimizer(const TrainerOptions& options, const std::vector<at::Tensor>& like);

// Optimizer state kept outside the Trainer, so a preempted training task can resume with it in
// another process: `storage` holds OptimizerStateSlots() slots (zeros before the first step;
// libtorch's own first step gives bit-identical results from zeros), `steps_taken` is the
// number of optimizer steps already applied (Adam's bias correction needs it).
struct ExternalOptimizerState {
  std::span<std::byte> storage;
  int64_t steps_taken = 0;
};

// Thrown through a training step's forward pass (by a gate hook, between two layers) to cut the
// step short: a preemption need not wait for the step's end. Trainer::Step undoes what the step
// wrote and returns StepCutError().
class StepCut final : public std::exception {
 public:
  const char* what() const noexcept override { return "training step cut at a layer boundary"; }
};
// Trainer::Step's answer for a step that was cut: the model is as it was before the step.
absl::Status StepCutError();
bool IsStepCut(const absl::Status& status);

// How a step may be cut (Trainer::Step's `cut`; the default: never).
struct StepCutOptions {
  const std::atomic<bool>* stop = nullptr;  // once set, the step is cut at its next point
  // Where the step reads its deadline (CLOCK_MONOTONIC ns; 0: none): the step is cut at its
  // first point at or past it (a fill step that would overrun its bubble: issue 30 item 2), as
  // by `stop`. A word, not a value: a resident fill run's bubble end moves under a step when its
  // bubble ends early.
  const std::atomic<int64_t>* deadline_ns = nullptr;
  // Given while the model's weights may still be arriving (the first step of a run whose copy is
  // in flight): the buffers each layer call of the training forward may write, in call order.
  // Each call's are then read at its gate (the after-gate hook), once its weights came, not all
  // at the step's start, where some had not landed (a cut would write those stale values back
  // over the copy). Calls past its end write nothing.
  const std::vector<std::vector<at::Tensor>>* arriving_buffers = nullptr;
  // Given (a resident fill run's step, issue 30): at a point past `deadline_ns`, though not for
  // a Stop, the step calls it instead of being cut. It returns true once the step may go on (the
  // deadline word then holds a later bubble's end), false when the step is to be cut after all
  // (the run is ending). A step suspended so computes exactly what an uninterrupted one does.
  const std::function<bool()>* suspend = nullptr;

  // Whether the step may be cut at all.
  bool armed() const { return stop != nullptr || deadline_ns != nullptr; }
  // Whether it is to be cut now.
  bool Now() const;
  // At a point where the step may stop (StepCutPoint with these options).
  void AtPoint() const;
};

// A training step's point where it may stop: throws StepCut when `stop` is set, or when the
// deadline `deadline_ns` holds (CLOCK_MONOTONIC; null or 0: none) has passed and `suspend` is null
// or answers false; returns when the step goes on (after `suspend` answered true, the new
// deadline is checked again). The layer gate's points and Trainer::Step's use it alike.
void StepCutPoint(const std::atomic<bool>* stop, const std::atomic<int64_t>* deadline_ns,
                  const std::function<bool()>* suspend);

// Trains `model` in place. The model is borrowed: it must outlive the Trainer. Not thread-safe.
class Trainer {
 public:
  // With `state`, the optimizer's buffers are views into state->storage, updated in place by
  // every step; InvalidArgument when its size is not what the options need for this model.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      ZooModel& model, const TrainerOptions& options,
      const ExternalOptimizerState* state = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Where one step's time went, as the host saw it (`parts` in Step): nothing waits between the
  // parts, so on a GPU the first two are the time to issue their work (a step that is slow to
  // issue, the optimizer's per-parameter launches say, shows there) and the last holds what the
  // device still had to do.
  struct StepParts {
    int64_t forward_backward_ns = 0;  // zeroing the gradients, forward, loss, backward
    int64_t update_ns = 0;            // the optimizer's step
    int64_t loss_wait_ns = 0;         // reading the loss back: the device's remaining work
  };
  // Puts the model in train mode and runs one step; returns the loss before the update.
  // Deterministic on the CPU for a fixed libtorch seed (dropout draws from the global generator).
  // With `cut.stop`, the step may be cut short: by a StepCut thrown from the forward pass (a
  // gate hook), at the flag seen set after the forward, before any node of the backward, or
  // after it. A cut step leaves the parameters, the buffers the forward updated (BatchNorm's
  // running statistics) and the optimizer state as they were, and returns StepCutError():
  // running it again gives what the uncut step would have.
  absl::StatusOr<double> Step(const ModelInput& input, const at::Tensor& target,
                              StepParts* parts = nullptr, StepCutOptions cut = {});

 private:
  // The buffers a forward may update, as they were before a step, so a cut step can put them
  // back: one flat copy per dtype. Taken whole by one concatenation per dtype (one kernel on a
  // GPU, not one per buffer) when every weight is in; else buffer by buffer as each layer's
  // weights come, and then only those taken are put back (the others the forward never wrote,
  // and their copy may still be landing).
  class BufferSnapshot {
   public:
    explicit BufferSnapshot(const std::vector<at::Tensor>& buffers);
    void TakeAll();
    void StartPiecewise();  // nothing taken yet: Take as each layer's weights come
    void Take(const std::vector<at::Tensor>& buffers);  // those of them it keeps, once a step
    void Restore();  // what was taken since TakeAll or StartPiecewise

   private:
    struct Group {
      std::vector<at::Tensor> buffers;  // of one dtype
      at::Tensor copy;                  // all of them, flat, in order
    };
    struct Slot {
      at::Tensor buffer;
      size_t group = 0;
      int64_t offset = 0;  // in the group's copy
      bool taken = false;  // this step (piecewise)
    };
    void Put(const Slot& slot, bool take);

    std::vector<Group> groups_;
    std::vector<Slot> slots_;
    std::unordered_map<const c10::TensorImpl*, size_t> slot_of_;
    bool all_taken_ = false;
    std::vector<size_t> taken_;
  };

  Trainer(ZooModel& model, std::unique_ptr<torch::optim::Optimizer> optimizer,
          std::unique_ptr<BufferSnapshot> buffers);

  ZooModel& model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  const std::unique_ptr<BufferSnapshot> buffers_;
};

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_TRAINING_H_
