// ZooModel: a libtorch module whose leaf layers are visible in execution order.
//
// Design. PipeSwitch transmits a model group by group and starts a layer as soon as its group has
// arrived; that needs (a) the layers in the order they first execute, each with the tensors it
// reads, and (b) a point just before each layer runs where the worker can wait for the layer's
// group. Both come from one mechanism: every leaf module call in a zoo model goes through
// `LayerTape::Enter` (via `RunLayer`). Recording one forward pass gives the order (as the paper
// does for DAGs like ResNet and Inception); in normal runs the tape counts calls and invokes the
// gate hook with the call's index. Execution order is deterministic for a given mode (train/eval),
// so the k-th leaf call of every forward pass is layer k.
//
// A layer is one leaf *call*: a module called several times in one forward pass (ResNet's
// per-block ReLU) is one layer per call, named "name#2", "name#3", ... for the repeats, which own
// no tensors. This matches the paper's layer counts (ResNet-152: 464 layers) and lets the
// profiler attribute time to each call. Tensors belong to the module that registers them, so the
// layer list covers every parameter and buffer exactly once; layers that never run in the current
// mode (Inception's aux head in eval) are listed after the executed ones with executed == false.
// A layer's tensors are the model's own parameter/buffer handles, so a worker can rebind each to
// a view into the shared arena (Tensor::set_data) without rebuilding the module tree.
//
// Thread-compatibility: a ZooModel runs one forward pass at a time.
#ifndef PSWITCH_MODELS_ZOO_MODEL_H_
#define PSWITCH_MODELS_ZOO_MODEL_H_

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pswitch::models {

// Called with the layer index before each executed layer runs, in order 0, 1, ..., once each.
using GateHook = std::function<void(int layer_index)>;

struct ModelInput {
  at::Tensor input;           // images [N, C, H, W] float, or token ids [N, S] int64
  at::Tensor attention_mask;  // BERT: [N, S], 1 = attend; undefined = all ones
  at::Tensor token_type_ids;  // BERT: [N, S]; undefined = zeros
};

struct ModelOutput {
  at::Tensor output;  // logits
  at::Tensor aux;     // Inception's aux logits in train mode; otherwise undefined
};

struct LayerTensor {
  std::string name;  // state_dict key, e.g. "layer1.0.conv1.weight"
  at::Tensor tensor;
  bool is_parameter = true;  // false for buffers (running stats)
};

struct Layer {
  std::string name;  // module path, e.g. "layer1.0.conv1"; repeats are "layer1.0.relu#2"
  std::string type;  // libtorch module name, e.g. "torch::nn::Conv2dImpl"
  std::vector<LayerTensor> tensors;
  int64_t param_bytes = 0;  // bytes of floating-point tensors (what a switch transmits)
  int64_t total_bytes = 0;  // all tensors, including integer buffers like num_batches_tracked
  bool executed = true;     // false: never runs in this mode
};

// Counts leaf-layer calls during a forward pass; records them or runs the gate hook.
class LayerTape {
 public:
  void Enter(const torch::nn::Module* module) {
    if (recording_) {
      recorded_.push_back(module);
      return;
    }
    const int index = calls_++;
    // A call other than the one registration recorded at this point would wait for the wrong
    // group and compute on weights still in transit: refused, before it runs.
    TORCH_CHECK(expected_ == nullptr || (static_cast<size_t>(index) < expected_->size() &&
                                         (*expected_)[index] == module),
                "layer call ", index, " is not the layer registration recorded there");
    if (gate_) gate_(index);
    if (after_gate_) after_gate_(index);
  }
  // `expected`: the modules each call must be, in order (null: not checked); it outlives the pass.
  void StartForward(const std::vector<const torch::nn::Module*>* expected = nullptr) {
    calls_ = 0;
    expected_ = expected;
  }
  int calls() const { return calls_; }
  void StartRecording() {
    recording_ = true;
    recorded_.clear();
  }
  std::vector<const torch::nn::Module*> StopRecording() {
    recording_ = false;
    return std::move(recorded_);
  }
  void set_gate(GateHook gate) { gate_ = std::move(gate); }
  void set_after_gate(GateHook after_gate) { after_gate_ = std::move(after_gate); }

 private:
  GateHook gate_;
  GateHook after_gate_;
  const std::vector<const torch::nn::Module*>* expected_ = nullptr;
  bool recording_ = false;
  int calls_ = 0;
  std::vector<const torch::nn::Module*> recorded_;
};

// Calls a leaf module holder (torch::nn::Conv2d, ...) through the tape.
template <typename Holder>
at::Tensor RunLayer(LayerTape& tape, Holder& holder, const at::Tensor& x) {
  tape.Enter(holder.get());
  return holder->forward(x);
}

// A generator of `device` seeded with `seed`: the CPU's own kind, or a copy of the device's default
// generator rewound to `seed` (no other user of the default one sees its state move).
at::Generator SeededGenerator(uint64_t seed, c10::Device device);

// Base of every zoo model. Owned through std::shared_ptr because libtorch's module tree
// (named_modules, to(), clone) requires it.
class ZooModel : public torch::nn::Module {
 public:
  // One forward pass in the current mode (train()/eval()), calling the gate hook before each
  // layer. Throws c10::Error like any libtorch call; edges catch it (see RunForward).
  ModelOutput Forward(const ModelInput& input);

  // Layers of the current mode in execution order, then the unexecuted ones. Records one forward
  // pass on TraceInput() the first time per mode (buffers such as running stats are restored, so
  // recording has no visible effect). The pointer stays valid while the model lives.
  absl::StatusOr<const std::vector<Layer>*> Layers();

  // The layer order registration recorded for a mode, as layer names ("path", or "path#k" for a
  // module's k-th call): every later forward in that mode checks each layer call against it,
  // without recording a pass here. InvalidArgument for a name that is no module of the model.
  absl::Status ExpectOrder(bool training, const std::vector<std::string>& layer_names);

  // How many times Layers() recorded a forward pass (once per mode at most).
  int layer_recordings() const { return layer_recordings_; }

  // Every parameter and buffer by its state_dict name (a tied tensor under each of its names;
  // undefined optional slots left out): what a worker binds by name. Default: the module tree's.
  virtual absl::StatusOr<std::vector<LayerTensor>> NamedTensors();

  // `input` with its floating-point tensors in the model's own precision (FloatDType: a float16
  // or bfloat16 model takes images in its dtype), the others as they are. No copy when they
  // already are.
  virtual ModelInput InModelDType(ModelInput input);
  // The dtype of the model's floating-point parameters (the first one's: pswitch converts a
  // model whole); float32 for a model with none.
  virtual at::ScalarType FloatDType();

  // Replaces the gate hook; an empty function disables it.
  void SetGateHook(GateHook gate) { tape_.set_gate(std::move(gate)); }
  // Replaces the hook that runs once the gate let layer `index` go, just before it runs (its
  // weights are in by then: what reads them there reads what arrived); empty disables it.
  void SetAfterGateHook(GateHook after_gate) { tape_.set_after_gate(std::move(after_gate)); }

  const std::string& model_name() const { return model_name_; }

  // Synthetic, seeded input and training target for `batch` samples at the model's default size,
  // drawn on `device` by a generator of that device (SeededGenerator): a GPU draws a batch in
  // microseconds, where the CPU's randn and a pageable copy took 25 of a ResNet-50 training step's
  // 40 ms on the H100. One seed gives the same values on any CPU, and on GPUs of one model with
  // one libtorch (CUDA's draws depend on the kernel's grid, so on the GPU's size).
  ModelInput ExampleInput(int64_t batch, uint64_t seed, c10::Device device = c10::kCPU) const {
    return MakeExampleInput(batch, seed, device);
  }
  at::Tensor ExampleTarget(int64_t batch, uint64_t seed, c10::Device device = c10::kCPU) const {
    return MakeExampleTarget(batch, seed, device);
  }
  // Training loss; default: cross entropy of `output` against class indices.
  virtual at::Tensor Loss(const ModelOutput& out, const at::Tensor& target) const;
  // Checkpoint keys a loader may skip (e.g. GPT-2's causal-mask buffers "attn.bias").
  virtual bool IsIgnorableCheckpointKey(const std::string& key) const;

 protected:
  explicit ZooModel(std::string model_name) : model_name_(std::move(model_name)) {}
  virtual ModelOutput ForwardImpl(const ModelInput& input) = 0;
  virtual ModelInput MakeExampleInput(int64_t batch, uint64_t seed, c10::Device device) const = 0;
  // Default: class indices in [0, 10).
  virtual at::Tensor MakeExampleTarget(int64_t batch, uint64_t seed, c10::Device device) const;
  // A small input that exercises every layer of the current mode; used once to record order.
  virtual ModelInput TraceInput() const { return ExampleInput(2, 0); }
  ModelInput OnModelDevice(ModelInput input);
  LayerTape& tape() { return tape_; }
  // The current mode's layers (see Layers()), from one forward pass without gradients; the
  // caller restores the buffers afterwards. Default: leaf-module calls through the tape.
  virtual absl::StatusOr<std::vector<Layer>> RecordLayers();

 private:
  std::vector<Layer> BuildLayers(const std::vector<const torch::nn::Module*>& calls);

  const std::string model_name_;
  LayerTape tape_;
  std::array<std::optional<std::vector<Layer>>, 2> layers_;  // [eval, train]
  int layer_recordings_ = 0;
  std::array<std::vector<const torch::nn::Module*>, 2> expected_;  // [eval, train]
};

// Forward with exceptions turned into a Status naming the model (for tools and workers).
absl::StatusOr<ModelOutput> RunForward(ZooModel& model, const ModelInput& input);

// Calls `fn`, converting c10::Error / std::exception into an Internal status prefixed `what`;
// c10::ValueError (TORCH_CHECK_VALUE: a bad input) into InvalidArgument.
absl::Status CatchTorch(const std::string& what, const std::function<void()>& fn);

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_ZOO_MODEL_H_
