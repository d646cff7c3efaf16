// ScriptModel: a user's own PyTorch model, exported by `pswitch.export` (python/pswitch/export.py)
// as a TorchScript archive, served like a zoo model: pipelined transmission, preemption,
// checkpoint-exact training and fill tasks all go through the ZooModel interface.
//
// The archive (docs/export.md) is the model itself, scripted or traced, with a call of the
// operator `pswitch::gate(int layer) -> ()` before each leaf module (gates 1..N; gate 0, the model
// itself, is called by this loader at the forward's entry), and the extra file `pswitch/layers.json` naming each gate's module
// path and the model's input, output and training target. This file registers that operator:
// inside a ScriptModel's forward pass it is the layer tape's gate (the worker's wait for the
// layer's group; on CUDA an enqueued stream wait), elsewhere a no-op.
//
// Layers are gate *calls*, as for zoo models (a leaf called twice is two layers, the repeat
// owning nothing). Tensor ownership is decided here, from the archive's own module tree and one
// recorded eval-mode pass, never taken from the table: a tensor goes with the first executed
// gate whose module holds it directly, every other tensor (held by a non-leaf module, or only by
// leaves that do not run in eval) with gate 0, which runs before anything else. Tied weights are
// one tensor held by several modules (owned by the earliest); distinct tensors sharing memory,
// tensor attributes that are neither parameters nor buffers, non-float32 parameters and tensors
// off the CPU are refused at load with the offending name.
//
// The mirror: every unique tensor is also registered in a plain torch::nn::Module tree under its
// state_dict name (same TensorImpl), so parameters(), named_buffers(), to() and checkpoint
// loading work unchanged, and rebinding a tensor to the arena (Tensor::set_data) is seen by the
// TorchScript module.
//
// Thread-compatibility: like every ZooModel, one forward pass at a time.
#ifndef PSWITCH_MODELS_SCRIPT_MODEL_H_
#define PSWITCH_MODELS_SCRIPT_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/model_source.h"
#include "models/zoo_model.h"

namespace pswitch::models {

// Loads an archive made by pswitch.export. InvalidArgument naming the problem (no layer table,
// a gate order that does not cover the model, shared memory, wrong dtype or device, an operator
// this libtorch lacks); nothing is kept on failure. `origin` names the file in messages.
absl::StatusOr<std::shared_ptr<ZooModel>> LoadScriptModel(const std::string& model_name,
                                                          absl::string_view bytes,
                                                          const std::string& origin);

// A zoo model (seed 0, CreateModel) or a script model, in eval mode on the CPU.
absl::StatusOr<std::shared_ptr<ZooModel>> CreateModelFrom(const ModelSource& source,
                                                          const std::string& model_name);

// True for models loaded by LoadScriptModel.
bool IsScriptModel(const ZooModel& model);

// OK unless `model` is a script model exported without a loss: FailedPrecondition saying how to
// export one that trains.
absl::Status CheckTrainable(const ZooModel& model);

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_SCRIPT_MODEL_H_
