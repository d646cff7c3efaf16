#include "worker/model_binding.h"

#include <torch/torch.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "memdaemon/weight_layout.h"
#include "models/model_inspection.h"
#include "models/registry.h"
#include "models/weight_init.h"

namespace pswitch::worker {
namespace {

std::vector<memdaemon::LayerSpec> Specs(const std::vector<models::Layer>& layers) {
  std::vector<memdaemon::LayerSpec> specs;
  specs.reserve(layers.size());
  for (const models::Layer& layer : layers) {
    memdaemon::LayerSpec spec{layer.name, {}};
    for (const models::LayerTensor& t : layer.tensors) {
      spec.tensors.push_back({t.name, static_cast<uint64_t>(t.tensor.nbytes())});
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

// Registration's layer orders are what gating trusts: a layer gated on another's group would
// compute on weights still in transit (another model's bytes). A zoo model checks every call of
// every later forward against them (ZooModel::ExpectOrder); an archive's loader has recorded its
// own gate paths (its runtime needs them), which must be registration's.
absl::Status CheckOrders(models::ZooModel& model, const models::ModelSource& source,
                         const ModelLayout& layout, const std::string& what) {
  std::vector<std::string> eval_names, train_names;
  for (const memdaemon::LayerSpec& layer : layout.layers) eval_names.push_back(layer.name);
  for (int index : layout.train_order) train_names.push_back(layout.layers[index].name);
  if (source.archive == nullptr) {
    absl::Status eval = model.ExpectOrder(false, eval_names);
    absl::Status train = eval.ok() ? model.ExpectOrder(true, train_names) : eval;
    if (!train.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": registration's layer order does not fit it: ", train.message()));
    }
    return absl::OkStatus();
  }
  model.train();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<models::Layer>* train_layers, model.Layers());
  model.eval();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<models::Layer>* eval_layers, model.Layers());
  bool same = eval_layers->size() == eval_names.size();
  for (size_t l = 0; same && l < eval_names.size(); ++l) {
    same = (*eval_layers)[l].name == eval_names[l];
  }
  absl::StatusOr<std::vector<int>> train_order =
      models::MapToLayoutOrder(*train_layers, *eval_layers);
  if (!same || !train_order.ok() || *train_order != layout.train_order) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": its recorded layer order is not registration's"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> CollectWeights(models::ZooModel& model, const std::string& name) {
  model.eval();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<models::Layer>* layers, model.Layers());
  ModelWeights weights;
  weights.bytes.name = name;
  for (const models::Layer& layer : *layers) {
    memdaemon::LayerBytes out{layer.name, {}};
    for (const models::LayerTensor& t : layer.tensors) {
      at::Tensor contiguous = t.tensor.detach().contiguous();
      weights.storage.push_back(contiguous);
      out.tensors.push_back(memdaemon::TensorBytes{
          t.name, std::span<const std::byte>(static_cast<const std::byte*>(contiguous.data_ptr()),
                                             contiguous.nbytes())});
    }
    weights.bytes.layers.push_back(std::move(out));
  }
  return weights;
}

absl::StatusOr<ModelLayout> LayoutOf(models::ZooModel& model) {
  model.train();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<models::Layer>* train_layers, model.Layers());
  model.eval();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<models::Layer>* eval_layers, model.Layers());
  ModelLayout layout;
  PSWITCH_ASSIGN_OR_RETURN(layout.train_order,
                           models::MapToLayoutOrder(*train_layers, *eval_layers));
  layout.layers = Specs(*eval_layers);
  PSWITCH_ASSIGN_OR_RETURN(memdaemon::WeightLayout placed,
                           memdaemon::ComputeWeightLayout(layout.layers));
  layout.total_bytes = placed.total_bytes;
  if (!models::IsScriptModel(model)) {  // an archive's precision is its own
    switch (model.FloatDType()) {
      case at::kHalf:
        layout.dtype = models::ModelDType::kFloat16;
        break;
      case at::kBFloat16:
        layout.dtype = models::ModelDType::kBFloat16;
        break;
      default:
        break;
    }
  }
  return layout;
}

absl::StatusOr<std::unique_ptr<BoundModel>> BoundModel::Create(const models::ModelSource& source,
                                                               const std::string& name,
                                                               std::byte* region,
                                                               const ModelLayout& layout,
                                                               c10::Device device) {
  const std::string what = absl::StrCat("model '", name, "'");
  for (int index : layout.train_order) {
    if (index < 0 || static_cast<size_t>(index) >= layout.layers.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": training order names layer ", index, " of ", layout.layers.size()));
    }
  }
  PSWITCH_ASSIGN_OR_RETURN(memdaemon::WeightLayout placed,
                           memdaemon::ComputeWeightLayout(layout.layers));
  if (placed.total_bytes != layout.total_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": its layout holds ", placed.total_bytes, " bytes, registration pinned ",
        layout.total_bytes, " (different pswitch builds?)"));
  }
  std::unique_ptr<BoundModel> bound(new BoundModel());
  bound->device_ = device;
  bound->region_bytes_ = layout.total_bytes;
  bound->storage_ = c10::Storage(c10::Storage::use_byte_size_t(), layout.total_bytes,
                                 c10::DataPtr(region, device), /*allocator=*/nullptr,
                                 /*resizable=*/false);
  {
    // Its parameters are bound to the weights region below: the seeded draw would be wasted.
    models::SkipWeightInit skip;
    PSWITCH_ASSIGN_OR_RETURN(bound->model_, models::CreateModelFrom(source, name));
  }
  if (layout.dtype != models::ModelDType::kFloat32) {
    if (source.archive != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": an archive keeps the precision it was exported in"));
    }
    PSWITCH_RETURN_IF_ERROR(models::CatchTorch(absl::StrCat("converting ", what), [&] {
      bound->model_->to(models::TorchDType(layout.dtype));
    }));
  }
  bound->train_to_layout_ = layout.train_order;
  bound->num_layers_ = layout.layers.size();
  PSWITCH_RETURN_IF_ERROR(CheckOrders(*bound->model_, source, layout, what));
  PSWITCH_ASSIGN_OR_RETURN(std::vector<models::LayerTensor> named, bound->model_->NamedTensors());
  absl::flat_hash_map<std::string, at::Tensor> by_name;
  for (const models::LayerTensor& t : named) by_name.emplace(t.name, t.tensor);
  // Registration and this build must agree on every tensor: one the layout lacks would stay in
  // this process's memory, off the weights region, and one the model lacks would never be read.
  absl::flat_hash_set<const c10::TensorImpl*> bound_tensors;
  absl::Status mismatch;
  PSWITCH_RETURN_IF_ERROR(models::CatchTorch("binding tensors", [&] {
    torch::NoGradGuard no_grad;
    for (size_t l = 0; l < layout.layers.size() && mismatch.ok(); ++l) {
      for (size_t t = 0; t < layout.layers[l].tensors.size(); ++t) {
        const memdaemon::TensorSpec& spec = layout.layers[l].tensors[t];
        auto it = by_name.find(spec.name);
        if (it == by_name.end()) {
          mismatch = absl::FailedPreconditionError(
              absl::StrCat(what, " has no tensor '", spec.name, "', which registration laid out"));
          break;
        }
        at::Tensor& tensor = it->second;
        if (static_cast<uint64_t>(tensor.nbytes()) != spec.bytes ||
            !bound_tensors.insert(tensor.unsafeGetTensorImpl()).second) {
          mismatch = absl::FailedPreconditionError(
              absl::StrCat(what, ": tensor '", spec.name, "' has ", tensor.nbytes(),
                           " bytes here, registration laid out ", spec.bytes, " (or it twice)"));
          break;
        }
        // A view of the one storage that spans the region: the arena is the tensor's memory from
        // now on, and Rebind moves every tensor at once. Placements are 256-byte aligned, so
        // each is a whole number of elements.
        const uint64_t offset = placed.placements[l][t].offset;
        const auto item = static_cast<uint64_t>(tensor.element_size());
        if (offset % item != 0) {
          mismatch = absl::FailedPreconditionError(
              absl::StrCat(what, ": tensor '", spec.name, "' is placed at byte ", offset,
                           ", not a multiple of its ", item, "-byte elements"));
          break;
        }
        at::Tensor view = at::empty({0}, tensor.options().device(device));
        view.set_(bound->storage_, static_cast<int64_t>(offset / item), tensor.sizes());
        tensor.set_data(view);
      }
    }
  }));
  PSWITCH_RETURN_IF_ERROR(mismatch);
  for (const models::LayerTensor& t : named) {
    if (!bound_tensors.contains(t.tensor.unsafeGetTensorImpl())) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": tensor '", t.name, "' is not in registration's layout"));
    }
  }
  absl::flat_hash_set<std::string> buffer_names;
  for (const models::LayerTensor& t : named) {
    if (!t.is_parameter) buffer_names.insert(t.name);
  }
  for (int layer : layout.train_order) {
    std::vector<at::Tensor>& buffers = bound->training_call_buffers_.emplace_back();
    for (const memdaemon::TensorSpec& spec : layout.layers[layer].tensors) {
      if (buffer_names.contains(spec.name)) buffers.push_back(by_name.at(spec.name));
    }
  }
  return bound;
}

void BoundModel::Rebind(std::byte* region) {
  if (region == this->region()) return;
  storage_.set_data_ptr_noswap(c10::DataPtr(region, device_));
}

}  // namespace pswitch::worker
