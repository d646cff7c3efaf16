#include "worker/model_inspection.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "models/script_model.h"
#include "models/training.h"
#include "worker/model_binding.h"

namespace pswitch::worker {
namespace {

absl::StatusOr<models::FactsTensorSpec> SpecOf(const char* what, const at::Tensor& t) {
  models::FactsTensorSpec spec;
  switch (t.scalar_type()) {
    case at::kFloat: spec.dtype = models::DType::kF32; break;
    case at::kLong: spec.dtype = models::DType::kI64; break;
    case at::kInt: spec.dtype = models::DType::kI32; break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "the model's ", what, " is ", c10::toString(t.scalar_type()),
          "; pswitch serves float32, int64 and int32 tensors"));
  }
  spec.shape.assign(t.sizes().begin(), t.sizes().end());
  if (!spec.shape.empty()) spec.shape[0] = -1;  // the batch
  return spec;
}

}  // namespace

absl::StatusOr<models::ModelFacts> InspectModel(models::ZooModel& model, uint32_t example_batch) {
  model.eval();
  PSWITCH_ASSIGN_OR_RETURN(ModelWeights weights, CollectWeights(model, ""));
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<models::Layer>* layers, model.Layers());
  if (layers->size() != weights.bytes.layers.size()) {
    return absl::InternalError("the model's layers changed while its weights were collected");
  }
  models::ModelFacts facts;
  for (size_t l = 0; l < layers->size(); ++l) {
    models::FactsLayer layer{(*layers)[l].name, (*layers)[l].executed, {}};
    for (const memdaemon::TensorBytes& t : weights.bytes.layers[l].tensors) {
      layer.tensors.push_back({t.name, t.bytes});
    }
    facts.layers.push_back(std::move(layer));
  }
  facts.optimizer_slot_bytes = models::OptimizerSlotBytes(model);
  facts.trainable = models::CheckTrainable(model);
  const models::ModelInput example =
      model.ExampleInput(static_cast<int64_t>(std::max<uint32_t>(example_batch, 1)), 0);
  PSWITCH_ASSIGN_OR_RETURN(models::ModelOutput out, models::RunForward(model, example));
  PSWITCH_ASSIGN_OR_RETURN(facts.input, SpecOf("input", example.input));
  PSWITCH_ASSIGN_OR_RETURN(facts.output, SpecOf("output", out.output));
  facts.keep_alive = std::make_shared<const std::vector<at::Tensor>>(std::move(weights.storage));
  return facts;
}

memdaemon::ModelBytes WeightsOf(const models::ModelFacts& facts, const std::string& name) {
  memdaemon::ModelBytes bytes;
  bytes.name = name;
  for (const models::FactsLayer& layer : facts.layers) {
    memdaemon::LayerBytes out{layer.name, {}};
    for (const models::FactsTensor& t : layer.tensors) out.tensors.push_back({t.name, t.bytes});
    bytes.layers.push_back(std::move(out));
  }
  return bytes;
}

}  // namespace pswitch::worker
