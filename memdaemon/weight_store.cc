#include "memdaemon/weight_store.h"

#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "memdaemon/arena_layout.h"

namespace pswitch::memdaemon {
namespace {

absl::Status ValidateModel(const ModelBytes& model) {
  if (model.name.empty()) return absl::InvalidArgumentError("model name must not be empty");
  if (model.layers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", model.name, "' has no layers"));
  }
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    for (const TensorBytes& tensor : model.layers[l].tensors) {
      if (tensor.name.empty() || !seen.insert(tensor.name).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model '", model.name, "': layer ", l, " '", model.layers[l].name, "': ",
            tensor.name.empty() ? "unnamed tensor" : "duplicate tensor '" + tensor.name + "'"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<LayerSpec> LayerSpecsOf(const ModelBytes& model) {
  std::vector<LayerSpec> specs;
  specs.reserve(model.layers.size());
  for (const LayerBytes& layer : model.layers) {
    LayerSpec spec{layer.name, {}};
    for (const TensorBytes& tensor : layer.tensors) {
      spec.tensors.push_back(TensorSpec{tensor.name, tensor.bytes.size()});
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

absl::StatusOr<const StoredModel*> WeightStore::Register(const ModelBytes& model) {
  PSWITCH_RETURN_IF_ERROR(ValidateModel(model));
  {
    absl::MutexLock lock(&mu_);
    if (models_.contains(model.name)) {
      return absl::AlreadyExistsError(absl::StrCat("model '", model.name, "' already registered"));
    }
  }
  std::vector<LayerSpec> specs = LayerSpecsOf(model);
  PSWITCH_ASSIGN_OR_RETURN(WeightLayout layout, ComputeWeightLayout(specs));
  if (layout.total_bytes > max_model_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model '", model.name, "' needs ", layout.total_bytes,
                     " bytes of weights but the arena holds at most ", max_model_bytes_));
  }
  // Whole pages (StoredModel::padded_bytes); a model of only empty layers still gets one, so
  // every model has host bytes.
  PSWITCH_ASSIGN_OR_RETURN(
      std::unique_ptr<gpu::HostBuffer> buffer,
      device_->AllocatePinned(WholePages(std::max<uint64_t>(layout.total_bytes, 1))));
  std::memset(buffer->data(), 0, buffer->size_bytes());  // padding is deterministic
  for (size_t l = 0; l < model.layers.size(); ++l) {
    for (size_t t = 0; t < model.layers[l].tensors.size(); ++t) {
      const TensorBytes& tensor = model.layers[l].tensors[t];
      if (!tensor.bytes.empty()) {
        std::memcpy(buffer->data() + layout.placements[l][t].offset, tensor.bytes.data(),
                    tensor.bytes.size());
      }
    }
  }
  auto stored = std::make_unique<StoredModel>(model.name, std::move(specs), std::move(layout),
                                              std::move(buffer));
  absl::MutexLock lock(&mu_);
  // Re-checked: another thread may have registered the name while we copied.
  auto [it, inserted] = models_.emplace(model.name, std::move(stored));
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat("model '", model.name, "' already registered"));
  }
  return it->second.get();
}

absl::StatusOr<const StoredModel*> WeightStore::Find(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' is not registered"));
  }
  return it->second.get();
}

absl::Status WeightStore::Remove(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' is not registered"));
  }
  models_.erase(it);
  return absl::OkStatus();
}

std::vector<std::string> WeightStore::Names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, model] : models_) names.push_back(name);
  return names;
}

}  // namespace pswitch::memdaemon
