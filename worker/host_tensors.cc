#include "worker/host_tensors.h"

#include <torch/torch.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::worker {
namespace {

absl::StatusOr<at::ScalarType> ToScalarType(proto::DType dtype) {
  switch (dtype) {
    case proto::DType::F32:
      return at::kFloat;
    case proto::DType::F16:
      return at::kHalf;
    case proto::DType::BF16:
      return at::kBFloat16;
    case proto::DType::I64:
      return at::kLong;
    case proto::DType::I32:
      return at::kInt;
    case proto::DType::U8:
      return at::kByte;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
}

absl::StatusOr<proto::DType> ToWireDType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return proto::DType::F32;
    case at::kHalf:
      return proto::DType::F16;
    case at::kBFloat16:
      return proto::DType::BF16;
    case at::kLong:
      return proto::DType::I64;
    case at::kInt:
      return proto::DType::I32;
    case at::kByte:
      return proto::DType::U8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", c10::toString(type), " cannot be sent over the wire"));
  }
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
