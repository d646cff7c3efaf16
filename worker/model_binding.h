// How a zoo model's tensors map onto the arena: the one description of a model's weights that
// the controller registers with the memdaemon and every worker binds its tensor views to. Both
// sides derive it from the zoo model itself (eval-mode execution order, then unexecuted
// layers), so the only number that crosses a process boundary is the region's offset.
#ifndef PSWITCH_WORKER_MODEL_BINDING_H_
#define PSWITCH_WORKER_MODEL_BINDING_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "memdaemon/weight_store.h"
#include "models/script_model.h"
#include "models/zoo_model.h"

namespace pswitch::worker {

// The weights of `model` (eval mode) in registration form. `storage` keeps the contiguous
// copies the spans point into; it must outlive the use of `bytes`.
struct ModelWeights {
  std::vector<at::Tensor> storage;
  memdaemon::ModelBytes bytes;
};
absl::StatusOr<ModelWeights> CollectWeights(models::ZooModel& model, const std::string& name);

// For each layer of `mode_layers` (a mode's execution order), the index of the layer with the
// same name in `eval_layers` (the layout's order). NotFound for a layer the layout lacks.
absl::StatusOr<std::vector<int>> MapToLayoutOrder(const std::vector<models::Layer>& mode_layers,
                                                  const std::vector<models::Layer>& eval_layers);

// A zoo model whose parameters and buffers are views into memory at `region` laid out by
// memdaemon::ComputeWeightLayout. Not thread-safe.
class BoundModel {
 public:
  // Builds `source` (a zoo model, or a pswitch.export archive) as model `name`, records its
  // layer order in both modes, then rebinds every tensor into
  // `region` (which must stay mapped), as tensors of `device`: the CPU for a host-backend arena,
  // the GPU holding it for a CUDA arena (worker/cuda/arena_device.h). FailedPrecondition when the
  // layout disagrees with `expected_layers` / `expected_bytes` (controller and worker built
  // different models).
  static absl::StatusOr<std::unique_ptr<BoundModel>> Create(
      const models::ModelSource& source, const std::string& name, std::byte* region,
      uint32_t expected_layers,
      uint64_t expected_bytes, c10::Device device = c10::Device(c10::kCPU));

  models::ZooModel& model() { return *model_; }
  // Layout (eval-order) index of the layer that runs `index`-th in training / inference.
  int LayoutIndex(bool training, int index) const {
    return training ? train_to_layout_[index] : index;
  }
  size_t num_layers() const { return num_layers_; }
  // Layers a forward pass runs in training / inference (LayoutIndex's domain).
  size_t mode_layers(bool training) const {
    return training ? train_to_layout_.size() : num_layers_;
  }
  // A warm step's time measured at load (worker/warm_up.h), for a training step or an inference
  // forward; 0 when not measured. A fill step here is never predicted shorter.
  void set_measured_steps(int64_t infer_ns, int64_t train_ns) {
    measured_infer_ns_ = infer_ns;
    measured_train_ns_ = train_ns;
  }
  int64_t measured_step_ns(bool training) const {
    return training ? measured_train_ns_ : measured_infer_ns_;
  }

 private:
  BoundModel() = default;
  std::shared_ptr<models::ZooModel> model_;
  std::vector<int> train_to_layout_;
  size_t num_layers_ = 0;
  int64_t measured_infer_ns_ = 0;
  int64_t measured_train_ns_ = 0;
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_MODEL_BINDING_H_
