#include "models/zoo_model.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <exception>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::models {

ModelOutput ZooModel::Forward(const ModelInput& input) {
  const auto& expected = expected_[is_training() ? 1 : 0];
  tape_.StartForward(expected.empty() ? nullptr : &expected);
  // Example and trace inputs are float32; a half-precision model computes in its own dtype.
  ModelOutput out = ForwardImpl(InModelDType(input));
  const auto& recorded = layers_[is_training() ? 1 : 0];
  if (recorded.has_value()) {
    int executed = 0;
    for (const Layer& layer : *recorded) executed += layer.executed ? 1 : 0;
    // A forward pass that took another path than the recorded one would gate the wrong groups.
    TORCH_CHECK(tape_.calls() == executed, "model '", model_name_, "': forward ran ", tape_.calls(),
                " layers but ", executed, " were recorded for this mode");
  }
  return out;
}

at::ScalarType ZooModel::FloatDType() {
  for (const auto& p : parameters()) {
    if (p.is_floating_point()) return p.scalar_type();
  }
  return at::kFloat;
}

ModelInput ZooModel::InModelDType(ModelInput input) {
  const at::ScalarType dtype = FloatDType();
  for (at::Tensor* t : {&input.input, &input.attention_mask, &input.token_type_ids}) {
    if (t->defined() && t->is_floating_point() && t->scalar_type() != dtype) *t = t->to(dtype);
  }
  return input;
}

// The trace inputs are made on the CPU; a model already moved to a GPU needs them there.
ModelInput ZooModel::OnModelDevice(ModelInput input) {
  at::Device device(at::kCPU);
  for (const auto& p : parameters()) {
    device = p.device();
    break;
  }
  if (device.is_cpu()) return input;
  auto move = [&](at::Tensor& t) {
    if (t.defined()) t = t.to(device);
  };
  move(input.input);
  move(input.attention_mask);
  move(input.token_type_ids);
  return input;
}

absl::StatusOr<const std::vector<Layer>*> ZooModel::Layers() {
  auto& slot = layers_[is_training() ? 1 : 0];
  if (slot.has_value()) return &*slot;
  // Recording must not change the model: keep the buffers (BatchNorm statistics move in train
  // mode).
  std::vector<std::pair<at::Tensor, at::Tensor>> saved;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("model '", model_name_, "': saving buffers"), [&] {
    for (auto& buffer : buffers()) saved.emplace_back(buffer, buffer.clone());
  }));
  ++layer_recordings_;
  absl::StatusOr<std::vector<Layer>> layers = RecordLayers();
  PSWITCH_RETURN_IF_ERROR(
      CatchTorch(absl::StrCat("model '", model_name_, "': restoring buffers"), [&] {
        torch::NoGradGuard no_grad;
        for (auto& [buffer, copy] : saved) buffer.copy_(copy);
      }));
  PSWITCH_RETURN_IF_ERROR(layers.status());
  slot = std::move(*layers);
  return &*slot;
}

absl::Status ZooModel::ExpectOrder(bool training, const std::vector<std::string>& layer_names) {
  std::map<std::string, const torch::nn::Module*> modules;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("model '", model_name_, "': its modules"), [&] {
    for (const auto& item : named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
      modules[item.key()] = item.value().get();
    }
  }));
  std::vector<const torch::nn::Module*> order;
  order.reserve(layer_names.size());
  for (const std::string& name : layer_names) {
    // A repeated call is "path#k" (BuildLayers).
    auto it = modules.find(name.substr(0, name.rfind('#')));
    if (it == modules.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", model_name_, "' has no layer '", name, "'"));
    }
    order.push_back(it->second);
  }
  expected_[training ? 1 : 0] = std::move(order);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerTensor>> ZooModel::NamedTensors() {
  std::vector<LayerTensor> tensors;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("model '", model_name_, "': its tensors"), [&] {
    for (const auto& p : named_parameters(/*recurse=*/true)) {
      if (p.value().defined()) tensors.push_back({p.key(), p.value(), true});
    }
    for (const auto& b : named_buffers(/*recurse=*/true)) {
      if (b.value().defined()) tensors.push_back({b.key(), b.value(), false});
    }
  }));
  return tensors;
}

absl::StatusOr<std::vector<Layer>> ZooModel::RecordLayers() {
  std::vector<const torch::nn::Module*> calls;
  PSWITCH_RETURN_IF_ERROR(
      CatchTorch(absl::StrCat("model '", model_name_, "': recording layers"), [&] {
        torch::NoGradGuard no_grad;
        tape_.StartRecording();
        try {
          ForwardImpl(InModelDType(OnModelDevice(TraceInput())));
        } catch (...) {
          tape_.StopRecording();
          throw;
        }
        calls = tape_.StopRecording();
      }));
  return BuildLayers(calls);
}

std::vector<Layer> ZooModel::BuildLayers(const std::vector<const torch::nn::Module*>& calls) {
  std::map<const torch::nn::Module*, std::string> names;
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules;
  for (const auto& item : named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    names[item.value().get()] = item.key();
    modules.emplace_back(item.key(), item.value());
  }
  auto tensors_of = [&](const std::string& name, const torch::nn::Module& module) {
    std::vector<LayerTensor> tensors;
    const std::string prefix = name.empty() ? "" : name + ".";
    for (const auto& p : module.named_parameters(/*recurse=*/false)) {
      tensors.push_back({prefix + p.key(), p.value(), true});
    }
    for (const auto& b : module.named_buffers(/*recurse=*/false)) {
      tensors.push_back({prefix + b.key(), b.value(), false});
    }
    return tensors;
  };
  auto make_layer = [&](const std::string& name, const torch::nn::Module& module,
                        std::vector<LayerTensor> tensors, bool executed) {
    Layer layer;
    layer.name = name;
    layer.type = module.name();
    layer.tensors = std::move(tensors);
    layer.executed = executed;
    for (const auto& t : layer.tensors) {
      const int64_t bytes = static_cast<int64_t>(t.tensor.numel() * t.tensor.element_size());
      layer.total_bytes += bytes;
      if (t.tensor.is_floating_point()) layer.param_bytes += bytes;
    }
    return layer;
  };

  std::vector<Layer> layers;
  std::map<const torch::nn::Module*, int> seen;
  for (const torch::nn::Module* module : calls) {
    const std::string& name = names.at(module);
    const int count = ++seen[module];
    if (count == 1) {
      layers.push_back(make_layer(name, *module, tensors_of(name, *module), true));
    } else {
      layers.push_back(make_layer(absl::StrCat(name, "#", count), *module, {}, true));
    }
  }
  // Modules that own tensors (or are leaves) but did not run in this mode.
  for (const auto& [name, module] : modules) {
    if (seen.count(module.get())) continue;
    auto tensors = tensors_of(name, *module);
    if (tensors.empty() && !module->children().empty()) continue;
    if (tensors.empty() && module.get() == this) continue;
    layers.push_back(make_layer(name, *module, std::move(tensors), false));
  }
  return layers;
}

at::Generator SeededGenerator(uint64_t seed, c10::Device device) {
  if (device.is_cpu()) return at::detail::createCPUGenerator(seed);
  // A copy of the device's default generator, so no other user of that one sees its state move;
  // seeding the copy also rewinds its offset, so each seed draws the same values every time.
  at::Generator fresh;
  {
    at::Generator shared = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(shared.mutex());  // dropout may draw from it meanwhile
    fresh = shared.clone();
  }
  fresh.set_current_seed(seed);
  return fresh;
}

at::Tensor ZooModel::MakeExampleTarget(int64_t batch, uint64_t seed, c10::Device device) const {
  const int64_t classes = 10;
  return at::randint(classes, {batch}, SeededGenerator(seed, device),
                     at::TensorOptions().dtype(at::kLong).device(device));
}

at::Tensor ZooModel::Loss(const ModelOutput& out, const at::Tensor& target) const {
  return torch::nn::functional::cross_entropy(out.output, target.to(out.output.device()));
}

bool ZooModel::IsIgnorableCheckpointKey(const std::string& /*key*/) const { return false; }

absl::Status CatchTorch(const std::string& what, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::ValueError& e) {
    // TORCH_CHECK_VALUE: what the caller passed (a model's input) is wrong, not the model.
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelOutput> RunForward(ZooModel& model, const ModelInput& input) {
  ModelOutput out;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("model '", model.model_name(), "': forward"),
                                     [&] { out = model.Forward(input); }));
  return out;
}

}  // namespace pswitch::models
