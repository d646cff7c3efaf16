// Converting task inputs and outputs between the wire's HostTensor and libtorch.
#ifndef PSWITCH_WORKER_HOST_TENSORS_H_
#define PSWITCH_WORKER_HOST_TENSORS_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/zoo_model.h"
#include "proto/host_tensor.h"

namespace pswitch::worker {

// A CPU tensor viewing `host`'s bytes (which must outlive it).
absl::StatusOr<at::Tensor> ViewHostTensor(const proto::HostTensor& host);
// A contiguous CPU copy of `tensor` named `name`.
absl::StatusOr<proto::HostTensor> ToHostTensor(const std::string& name, const at::Tensor& tensor);
// "input" (required), "attention_mask" and "token_type_ids" (optional); any other name is an
// InvalidArgument naming it.
absl::StatusOr<models::ModelInput> ToModelInput(const std::vector<proto::HostTensor>& inputs);
// `input` with each defined tensor moved to `device` (tensors already there are shared, not
// copied). A libtorch call like any other: it throws c10::Error, so call it inside the task's
// exception boundary.
models::ModelInput ModelInputOn(const models::ModelInput& input, c10::Device device);

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_HOST_TENSORS_H_
