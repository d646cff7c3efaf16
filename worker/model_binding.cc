#include "worker/model_binding.h"

#include <torch/torch.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "memdaemon/weight_layout.h"
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

absl::StatusOr<std::vector<int>> MapToLayoutOrder(const std::vector<models::Layer>& mode_layers,
                                                  const std::vector<models::Layer>& eval_layers) {
  absl::flat_hash_map<std::string, int> index;
  for (size_t i = 0; i < eval_layers.size(); ++i) index[eval_layers[i].name] = static_cast<int>(i);
  std::vector<int> map;
  map.reserve(mode_layers.size());
  for (const models::Layer& layer : mode_layers) {
    auto it = index.find(layer.name);
    if (it == index.end()) {
      return absl::NotFoundError(absl::StrCat("layer '", layer.name, "' missing from the layout"));
    }
    map.push_back(it->second);
  }
  return map;
}

absl::StatusOr<std::unique_ptr<BoundModel>> BoundModel::Create(const models::ModelSource& source,
                                                               const std::string& name,
                                                               std::byte* region,
                                                               uint32_t expected_layers,
                                                               uint64_t expected_bytes,
                                                               c10::Device device) {
  std::unique_ptr<BoundModel> bound(new BoundModel());
  {
    // Its parameters are bound to the weights region below: the seeded draw would be wasted.
    models::SkipWeightInit skip;
    PSWITCH_ASSIGN_OR_RETURN(bound->model_, models::CreateModelFrom(source, name));
  }
  models::ZooModel& model = *bound->model_;
  // Both modes' orders are recorded now, while the weights are still the model's own: the
  // arena may hold another model's bytes at any time.
  model.train();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<models::Layer>* train_layers, model.Layers());
  model.eval();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<models::Layer>* eval_layers, model.Layers());
  PSWITCH_ASSIGN_OR_RETURN(bound->train_to_layout_, MapToLayoutOrder(*train_layers, *eval_layers));
  bound->num_layers_ = eval_layers->size();

  PSWITCH_ASSIGN_OR_RETURN(memdaemon::WeightLayout layout,
                           memdaemon::ComputeWeightLayout(Specs(*eval_layers)));
  if (eval_layers->size() != expected_layers || layout.total_bytes != expected_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", name, "': worker layout has ", eval_layers->size(),
                     " layers and ", layout.total_bytes, " bytes, the controller registered ",
                     expected_layers, " and ", expected_bytes, " (different pswitch builds?)"));
  }
  PSWITCH_RETURN_IF_ERROR(models::CatchTorch("binding tensors", [&] {
    torch::NoGradGuard no_grad;
    for (size_t l = 0; l < eval_layers->size(); ++l) {
      for (size_t t = 0; t < (*eval_layers)[l].tensors.size(); ++t) {
        at::Tensor tensor = (*eval_layers)[l].tensors[t].tensor;
        // A non-owning view: the arena region is the tensor's storage from now on. On CUDA,
        // libtorch checks that the address is memory of `device`.
        at::Tensor view = torch::from_blob(region + layout.placements[l][t].offset, tensor.sizes(),
                                           tensor.options().device(device));
        tensor.set_data(view);
      }
    }
  }));
  return bound;
}

}  // namespace pswitch::worker
