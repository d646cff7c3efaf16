#include "worker/host_tensors.h"

#include <torch/torch.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "proto/dtype.h"

namespace pswitch::worker {
namespace {

// proto/dtype.h keeps libtorch's scalar types as numbers; each must be the one libtorch means.
static_assert(static_cast<int>(at::kFloat) == 6 && static_cast<int>(at::kHalf) == 5 &&
                  static_cast<int>(at::kBFloat16) == 15 && static_cast<int>(at::kLong) == 4 &&
                  static_cast<int>(at::kInt) == 3 && static_cast<int>(at::kByte) == 0,
              "proto/dtype.h's torch_scalar_type column no longer matches c10::ScalarType");

absl::StatusOr<at::ScalarType> ToScalarType(proto::DType dtype) {
  const proto::DTypeInfo* info = proto::FindDType(dtype);
  if (info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  return static_cast<at::ScalarType>(info->torch_scalar_type);
}

absl::StatusOr<proto::DType> ToWireDType(at::ScalarType type) {
  const proto::DTypeInfo* info = proto::DTypeByTorch(static_cast<int>(type));
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", c10::toString(type), " cannot be sent over the wire"));
  }
  return info->wire;
}

}  // namespace

absl::StatusOr<at::Tensor> ViewHostTensor(const proto::HostTensor& host) {
  PSWITCH_RETURN_IF_ERROR(proto::ValidateHostTensor(host));
  PSWITCH_ASSIGN_OR_RETURN(at::ScalarType type, ToScalarType(host.dtype));
  return torch::from_blob(const_cast<uint8_t*>(host.data.data()), host.shape,
                          torch::TensorOptions().dtype(type));
}

absl::StatusOr<proto::HostTensor> ToHostTensor(const std::string& name, const at::Tensor& tensor) {
  proto::HostTensor host;
  host.name = name;
  PSWITCH_ASSIGN_OR_RETURN(host.dtype, ToWireDType(tensor.scalar_type()));
  at::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
  host.shape.assign(cpu.sizes().begin(), cpu.sizes().end());
  host.data.resize(cpu.nbytes());
  if (!host.data.empty()) std::memcpy(host.data.data(), cpu.data_ptr(), host.data.size());
  return host;
}

absl::StatusOr<models::ModelInput> ToModelInput(const std::vector<proto::HostTensor>& inputs) {
  models::ModelInput input;
  for (const proto::HostTensor& host : inputs) {
    PSWITCH_ASSIGN_OR_RETURN(at::Tensor view, ViewHostTensor(host));
    if (host.name == "input") {
      input.input = view;
    } else if (host.name == "attention_mask") {
      input.attention_mask = view;
    } else if (host.name == "token_type_ids") {
      input.token_type_ids = view;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected input tensor '", host.name,
                       "' (expected 'input', optionally 'attention_mask' and 'token_type_ids')"));
    }
  }
  if (!input.input.defined()) return absl::InvalidArgumentError("missing input tensor 'input'");
  return input;
}

models::ModelInput ModelInputOn(const models::ModelInput& input, c10::Device device) {
  auto on = [&](const at::Tensor& t) { return t.defined() ? t.to(device) : t; };
  models::ModelInput out = input;
  out.input = on(input.input);
  out.attention_mask = on(input.attention_mask);
  out.token_type_ids = on(input.token_type_ids);
  return out;
}

}  // namespace pswitch::worker
