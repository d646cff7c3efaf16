// Moving tensors between libtorch and safetensors files, and loading checkpoints into zoo models.
#ifndef PSWITCH_MODELS_WEIGHTS_H_
#define PSWITCH_MODELS_WEIGHTS_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/safetensors.h"

namespace pswitch::models {

class ZooModel;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// A CPU tensor holding a copy of `tensor`'s bytes with its dtype and shape.
absl::StatusOr<at::Tensor> ToTorch(const SafetensorsTensor& tensor);
absl::StatusOr<DType> ToDType(at::ScalarType type);

// Reads every tensor of a safetensors file, in file order.
absl::StatusOr<NamedTensors> ReadTensors(const std::string& path);
// Writes `tensors` (any device; copied to the CPU, made contiguous) in the given order.
absl::Status WriteTensors(const std::string& path, const NamedTensors& tensors);

// The model's state_dict (parameters + buffers), in layer execution order of its current mode.
absl::StatusOr<NamedTensors> StateDict(ZooModel& model);

// Copies a checkpoint into the model's parameters and buffers. Strict like PyTorch's
// load_state_dict(strict=True): a missing key, an unexpected key (other than ones the model
// declares ignorable) or a shape mismatch is an error naming the key; floating-point dtypes are
// converted, but a floating-point / integer mismatch is an error.
absl::Status LoadWeights(ZooModel& model, const SafetensorsFile& checkpoint);
absl::Status LoadWeights(ZooModel& model, const std::string& path);

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_WEIGHTS_H_
