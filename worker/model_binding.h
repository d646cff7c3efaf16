// How a model's tensors map onto the arena. Registration inspects the model once (in a child:
// models/model_inspection.h) and pins its weights in the layout of its eval-order layer table;
// every worker gets that table and the training order with the model (LoadModel), builds the
// module tree without random initialisation (and, for a zoo model, without recording a forward
// pass: every later forward checks its calls against registration's order instead), and binds
// each parameter and buffer by name to its place in the weights region.
#ifndef PSWITCH_WORKER_MODEL_BINDING_H_
#define PSWITCH_WORKER_MODEL_BINDING_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "memdaemon/weight_store.h"
#include "models/model_dtype.h"
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

// A registered model's layout as registration inspected it: the layer table in eval (layout)
// order with each tensor's state_dict name and size, and the layout index of each layer a
// training forward runs, in its order.
struct ModelLayout {
  std::vector<memdaemon::LayerSpec> layers;
  std::vector<int> train_order;
  uint64_t total_bytes = 0;  // of memdaemon::ComputeWeightLayout(layers)
  // A zoo model's precision: built in float32 and converted before binding (an archive's tensors
  // keep the dtype it was exported in).
  models::ModelDType dtype = models::ModelDType::kFloat32;
};

// The layout of `model` in eval mode, recorded in this process (tests and tools that build a
// model themselves; workers get theirs from registration).
absl::StatusOr<ModelLayout> LayoutOf(models::ZooModel& model);

// A model whose parameters and buffers are views into memory at `region` laid out by
// memdaemon::ComputeWeightLayout, all of one storage (Rebind). Not thread-safe.
class BoundModel {
 public:
  // Builds `source` (a zoo model, or a pswitch.export archive) as model `name`, without its
  // random initialisation, then rebinds every parameter and buffer, by name, to its place in
  // `layout` within `region` (which must stay mapped), as tensors of `device`: the CPU for a
  // host-backend arena, the GPU holding it for a CUDA arena (worker/cuda/arena_device.h). A zoo
  // model records no forward pass here. FailedPrecondition when the model and `layout` disagree
  // (a tensor missing from either or laid out twice, a size, a layer order, the total:
  // registration and worker built different models); InvalidArgument for a training order
  // outside the layout; ComputeWeightLayout's error for a layout that cannot be placed.
  static absl::StatusOr<std::unique_ptr<BoundModel>> Create(
      const models::ModelSource& source, const std::string& name, std::byte* region,
      const ModelLayout& layout, c10::Device device = c10::Device(c10::kCPU));

  models::ZooModel& model() { return *model_; }
  // Every parameter and buffer is a view of one storage spanning the model's region, so the
  // region can move (the weights cache places a model wherever it has room) at the cost of one
  // pointer: no tensor is rebuilt. The caller checks that `region` holds region_bytes() of the
  // arena and keeps it mapped.
  void Rebind(std::byte* region);
  std::byte* region() const { return static_cast<std::byte*>(storage_.data_ptr().get()); }
  uint64_t region_bytes() const { return region_bytes_; }
  // Layout (eval-order) index of the layer that runs `index`-th in training / inference.
  int LayoutIndex(bool training, int index) const {
    return training ? train_to_layout_[index] : index;
  }
  size_t num_layers() const { return num_layers_; }
  // The buffers each call of a training forward may write (its layer's own), in call order: what
  // a step that may be cut reads at each layer's gate while the weights still arrive
  // (models::StepCutOptions).
  const std::vector<std::vector<at::Tensor>>& training_call_buffers() const {
    return training_call_buffers_;
  }
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
  // True for this model's first few training steps here: they are timed by part and logged, so
  // a first step slower than its measurement says where (the steps after it are the reference).
  bool TimeThisTrainingStep() {
    if (timed_training_steps_left_ == 0) return false;
    --timed_training_steps_left_;
    return true;
  }

 private:
  BoundModel() = default;
  std::shared_ptr<models::ZooModel> model_;
  c10::Storage storage_;  // spans the region; every bound tensor is a view of it
  c10::Device device_ = c10::Device(c10::kCPU);
  uint64_t region_bytes_ = 0;
  std::vector<int> train_to_layout_;
  std::vector<std::vector<at::Tensor>> training_call_buffers_;
  size_t num_layers_ = 0;
  int64_t measured_infer_ns_ = 0;
  int64_t measured_train_ns_ = 0;
  int timed_training_steps_left_ = 4;
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_MODEL_BINDING_H_
