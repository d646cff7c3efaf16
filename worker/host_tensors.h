// Converting task inputs and outputs between the wire's HostTensor and libtorch.
#ifndef PSWITCH_WORKER_HOST_TENSORS_H_
#define PSWITCH_WORKER_HOST_TENSORS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/zoo_model.h"
#include "proto/host_tensor.h"
#include "worker/region_map.h"

namespace pswitch::worker {

// A CPU tensor viewing `host`'s bytes (which must outlive it).
absl::StatusOr<at::Tensor> ViewHostTensor(const proto::HostTensor& host);
// A contiguous CPU copy of `tensor` named `name`.
absl::StatusOr<proto::HostTensor> ToHostTensor(const std::string& name, const at::Tensor& tensor);
// "input" (required), "attention_mask" and "token_type_ids" (optional); any other name is an
// InvalidArgument naming it.
absl::StatusOr<models::ModelInput> ToModelInput(const std::vector<proto::HostTensor>& inputs);
// The inverse, as a client sends a model's input: each defined tensor of `input` as a host
// tensor under its name ("input", then "attention_mask", "token_type_ids").
absl::StatusOr<std::vector<proto::HostTensor>> ToHostTensors(const models::ModelInput& input);
// `input` with each defined tensor moved to `device` (tensors already there are shared, not
// copied). On CUDA the copy is non_blocking on the current stream (the task's compute stream),
// so it is queued ahead of the gates' flag waits instead of stalling the CPU. A libtorch call
// like any other: it throws c10::Error, so call it inside the task's exception boundary.
models::ModelInput ModelInputOn(const models::ModelInput& input, c10::Device device);

// A task's inputs as tensors on `device`: inline ones as ToModelInput + ModelInputOn (the framed
// baseline), Place::Region ones copied once out of `regions` (TensorFromRegion). Place::Payload
// reaches a worker only through a staging region: InvalidArgument. Throws c10::Error like
// ModelInputOn.
absl::StatusOr<models::ModelInput> TaskInputOn(const std::vector<proto::HostTensor>& inputs,
                                               const RegionMap& regions, c10::Device device);

// A tensor of the task's own on `device` holding the bytes of `host` (a Place::Region tensor),
// after checking its dtype, shape and slice against the worker's mapping. The one copy:
//   host backend: a guarded copy (when the file may shrink) into a new CPU tensor;
//   CUDA from a registered mapping: one asynchronous host-to-device copy on the current stream;
//   CUDA from a file that may shrink: a guarded copy into pinned memory, then that async copy;
//   CUDA IPC region: one device-to-device copy on the current stream.
// The copy isolates the model from the client writing or shrinking the region mid-compute.
// Errors: NotFound/OutOfRange for the slice, DataLoss when the file shrank under the copy.
// Throws c10::Error like ModelInputOn.
absl::StatusOr<at::Tensor> TensorFromRegion(const proto::HostTensor& host, const RegionMap& regions,
                                            c10::Device device);

// Outputs written into a region are packed in order, each at an offset (from the slice's start)
// that is a multiple of this.
inline constexpr uint64_t kOutputAlignment = 64;

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// Writes `outputs` packed into `to` (a slice of a mapped region), each at a kOutputAlignment
// offset, and returns their Place::Region descriptors. ResourceExhausted naming the bytes needed
// and available when they do not fit, and then nothing is written; NotFound/OutOfRange for a
// slice the worker has not mapped; PermissionDenied for a read-only mapping; DataLoss when the
// file shrank under the copy. On CUDA the device-to-host copies into a registered mapping are
// asynchronous on the current stream: synchronise it before the descriptors are sent. Throws
// c10::Error like ModelInputOn.
absl::StatusOr<std::vector<proto::HostTensor>> WriteOutputsToRegion(
    const std::vector<NamedTensor>& outputs, const proto::ByteSlice& to, const RegionMap& regions);

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_HOST_TENSORS_H_
