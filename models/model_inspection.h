// A registration's one look at a model: build it (a zoo architecture with seeded random weights,
// or a pswitch.export archive), apply its checkpoint, collect its facts (models/model_facts.h)
// and, for an "auto" plan, profile its layers. pswitchd runs this in a bounded pswitch-worker
// child (registry/inspection_child.h) and never links libtorch; library users and tests run it
// in their own process (InspectInProcess).
#ifndef PSWITCH_MODELS_MODEL_INSPECTION_H_
#define PSWITCH_MODELS_MODEL_INSPECTION_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model_dtype.h"
#include "models/model_facts.h"
#include "models/zoo_model.h"

namespace pswitch::models {

// libtorch's scalar type for a model precision.
at::ScalarType TorchDType(ModelDType dtype);

// For each layer of `mode_layers` (a mode's execution order), the index of the layer with the
// same name in `eval_layers` (the layout's order). NotFound for a layer the layout lacks.
absl::StatusOr<std::vector<int>> MapToLayoutOrder(const std::vector<Layer>& mode_layers,
                                                  const std::vector<Layer>& eval_layers);

// `model`'s facts: its layers in eval (layout) order and their weights (references to the host
// bytes the result keeps alive), the order a training forward runs them in, optimizer-slot size,
// trainability, and input and output from one forward pass of its example input at
// `example_batch` (the batch a profile is about to run: the pass is then its warm-up too). The
// model is left in eval mode.
absl::StatusOr<ModelFacts> InspectModel(ZooModel& model, uint32_t example_batch = 1);

// The whole look `request` asks for, profiles measured as `profile` says. Reads the request's
// descriptors without closing them. NotFound for an unknown zoo model; InvalidArgument for a bad
// archive or checkpoint; FailedPrecondition, with the remedy, when the profile's device fails.
absl::StatusOr<ModelFacts> Inspect(const InspectionRequest& request,
                                   const AutoPlanProfile& profile);

// What a standby inspector does before its request comes (registry/inspection_child.h): the
// one-off set-up every inspection pays, done while no registration waits. Two small models are
// built, recorded and run (on a GPU profile's device also trained once): libtorch's first-use
// costs, the device's context and its cuDNN and cuBLAS handles. FailedPrecondition when that
// device cannot be used (the inspection then reports it, with the remedy).
absl::Status PrepareInspection(const AutoPlanProfile& profile);

// Inspect in this process, as a registry::ModelInspector (library use, tests).
std::function<absl::StatusOr<ModelFacts>(const InspectionRequest&)> InspectInProcess(
    AutoPlanProfile profile = {});

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_MODEL_INSPECTION_H_
