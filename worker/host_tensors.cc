#include "worker/host_tensors.h"

#include <torch/torch.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "dataplane/guarded_copy.h"
#include "dataplane/stream_copy.h"
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

absl::Status SetInput(models::ModelInput& input, const std::string& name, at::Tensor tensor) {
  if (name == "input") {
    input.input = std::move(tensor);
  } else if (name == "attention_mask") {
    input.attention_mask = std::move(tensor);
  } else if (name == "token_type_ids") {
    input.token_type_ids = std::move(tensor);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected input tensor '", name,
                     "' (expected 'input', optionally 'attention_mask' and 'token_type_ids')"));
  }
  return absl::OkStatus();
}

// Copies between a region's mapping and memory of ours: guarded where the file may shrink.
absl::Status CopyRegionBytes(void* dst, const void* src, uint64_t bytes, const RegionBytes& region,
                             const std::string& what) {
  if (bytes == 0) return absl::OkStatus();
  if (region.may_shrink) return dataplane::GuardedCopy(dst, src, bytes, what);
  dataplane::StreamCopy(dst, src, bytes);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<at::Tensor> ViewHostTensor(const proto::HostTensor& host) {
  PSWITCH_RETURN_IF_ERROR(proto::ValidateHostTensor(host));
  if (host.place != proto::Place::Inline) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", host.name, "' is not inline: its bytes are in a region"));
  }
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

absl::StatusOr<std::vector<proto::HostTensor>> ToHostTensors(const models::ModelInput& input) {
  std::vector<proto::HostTensor> out;
  for (const auto& [name, tensor] :
       {std::pair<const char*, const at::Tensor&>{"input", input.input},
        {"attention_mask", input.attention_mask},
        {"token_type_ids", input.token_type_ids}}) {
    if (!tensor.defined()) continue;
    PSWITCH_ASSIGN_OR_RETURN(proto::HostTensor host, ToHostTensor(name, tensor));
    out.push_back(std::move(host));
  }
  return out;
}

absl::StatusOr<models::ModelInput> ToModelInput(const std::vector<proto::HostTensor>& inputs) {
  models::ModelInput input;
  for (const proto::HostTensor& host : inputs) {
    PSWITCH_ASSIGN_OR_RETURN(at::Tensor view, ViewHostTensor(host));
    PSWITCH_RETURN_IF_ERROR(SetInput(input, host.name, std::move(view)));
  }
  if (!input.input.defined()) return absl::InvalidArgumentError("missing input tensor 'input'");
  return input;
}

models::ModelInput ModelInputOn(const models::ModelInput& input, c10::Device device) {
  // non_blocking: pinned or registered sources are DMA'd asynchronously; a pageable one is
  // staged by the driver before the call returns, so it may go away right after.
  auto on = [&](const at::Tensor& t) {
    return t.defined() ? t.to(t.options().device(device), /*non_blocking=*/true) : t;
  };
  models::ModelInput out = input;
  out.input = on(input.input);
  out.attention_mask = on(input.attention_mask);
  out.token_type_ids = on(input.token_type_ids);
  return out;
}

absl::StatusOr<models::ModelInput> TaskInputOn(const std::vector<proto::HostTensor>& inputs,
                                               const RegionMap& regions, c10::Device device) {
  models::ModelInput input;
  for (const proto::HostTensor& host : inputs) {
    at::Tensor tensor;
    switch (host.place) {
      case proto::Place::Inline: {
        PSWITCH_ASSIGN_OR_RETURN(at::Tensor view, ViewHostTensor(host));
        tensor = view.to(view.options().device(device), /*non_blocking=*/true);
        break;
      }
      case proto::Place::Region: {
        PSWITCH_ASSIGN_OR_RETURN(tensor, TensorFromRegion(host, regions, device));
        break;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", host.name, "': a raw payload reaches a worker only in a staging region"));
    }
    PSWITCH_RETURN_IF_ERROR(SetInput(input, host.name, std::move(tensor)));
  }
  if (!input.input.defined()) return absl::InvalidArgumentError("missing input tensor 'input'");
  return input;
}

absl::StatusOr<at::Tensor> TensorFromRegion(const proto::HostTensor& host, const RegionMap& regions,
                                            c10::Device device) {
  if (host.place != proto::Place::Region) {
    return absl::InvalidArgumentError(absl::StrCat("input '", host.name, "' is not in a region"));
  }
  // dtype x shape == the slice's length, and offset + length does not overflow.
  PSWITCH_RETURN_IF_ERROR(proto::ValidateHostTensor(host));
  PSWITCH_ASSIGN_OR_RETURN(const RegionBytes src, regions.Slice(host.slice));
  PSWITCH_ASSIGN_OR_RETURN(const at::ScalarType type, ToScalarType(host.dtype));
  const auto options = torch::TensorOptions().dtype(type);
  const std::string what = absl::StrCat("input '", host.name, "' in ", src.what);
  if (src.on_device) {
    if (!device.is_cuda()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " is device memory; this worker computes on ", device.str()));
    }
    return torch::from_blob(src.data, host.shape, options.device(device)).clone();
  }
  if (!device.is_cuda()) {
    // The host backend's one pass: a tensor of the task's own (from its activation lease).
    at::Tensor tensor = at::empty(host.shape, options);
    PSWITCH_RETURN_IF_ERROR(CopyRegionBytes(tensor.data_ptr(), src.data, src.bytes, src, what));
    return tensor;
  }
  at::Tensor tensor = at::empty(host.shape, options.device(device));
  if (src.registered) {
    // Page-locked: the DMA reads the mapping asynchronously, queued on the compute stream ahead
    // of group 0's wait, so it overlaps the weights' transmission.
    tensor.copy_(torch::from_blob(src.data, host.shape, options), /*non_blocking=*/true);
    return tensor;
  }
  // A file that may shrink is never page-locked: bounce through pinned memory, reading it under
  // the guard. The pinned block is libtorch's caching host allocator's, which keeps it from reuse
  // until the copy that reads it has finished.
  at::Tensor pinned = at::empty(host.shape, options.pinned_memory(true));
  PSWITCH_RETURN_IF_ERROR(CopyRegionBytes(pinned.data_ptr(), src.data, src.bytes, src, what));
  tensor.copy_(pinned, /*non_blocking=*/true);
  return tensor;
}

absl::StatusOr<std::vector<proto::HostTensor>> WriteOutputsToRegion(
    const std::vector<NamedTensor>& outputs, const proto::ByteSlice& to, const RegionMap& regions) {
  // Lay everything out and check it fits before a byte is written.
  std::vector<proto::HostTensor> placed;
  placed.reserve(outputs.size());
  uint64_t end = 0;
  for (const NamedTensor& out : outputs) {
    proto::HostTensor host;
    host.name = out.name;
    PSWITCH_ASSIGN_OR_RETURN(host.dtype, ToWireDType(out.tensor.scalar_type()));
    host.shape.assign(out.tensor.sizes().begin(), out.tensor.sizes().end());
    PSWITCH_ASSIGN_OR_RETURN(const uint64_t bytes, proto::ShapeBytes(host.dtype, host.shape));
    if (end > UINT64_MAX - (kOutputAlignment - 1)) {
      return absl::ResourceExhaustedError("outputs overflow 64 bits");
    }
    const uint64_t offset = (end + kOutputAlignment - 1) / kOutputAlignment * kOutputAlignment;
    if (bytes > UINT64_MAX - offset)
      return absl::ResourceExhaustedError("outputs overflow 64 bits");
    end = offset + bytes;
    host.place = proto::Place::Region;
    host.slice = proto::ByteSlice{to.region, offset, bytes};  // relative to `to` until checked
    placed.push_back(std::move(host));
  }
  PSWITCH_ASSIGN_OR_RETURN(const RegionBytes dst, regions.Slice(to));
  if (end > dst.bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the outputs need ", end, " bytes but outputs_to holds ", dst.bytes, " (", dst.what, ")"));
  }
  if (!dst.writable) {
    return absl::PermissionDeniedError(
        absl::StrCat(dst.what, " is mapped read-only: outputs cannot be written into it"));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    proto::HostTensor& host = placed[i];
    const at::Tensor tensor = outputs[i].tensor.detach();
    std::byte* out = dst.data + host.slice.offset;
    const auto options = torch::TensorOptions().dtype(tensor.scalar_type());
    const std::string what = absl::StrCat("output '", host.name, "' in ", dst.what);
    if (dst.on_device) {
      torch::from_blob(out, host.shape, options.device(tensor.device()))
          .copy_(tensor, /*non_blocking=*/true);
    } else if (tensor.is_cuda() && dst.registered) {
      // Device-to-host DMA straight into the page-locked mapping, on the compute stream.
      torch::from_blob(out, host.shape, options).copy_(tensor, /*non_blocking=*/true);
    } else {
      const at::Tensor cpu = tensor.to(torch::kCPU).contiguous();
      PSWITCH_RETURN_IF_ERROR(CopyRegionBytes(out, cpu.data_ptr(), host.slice.length, dst, what));
    }
    host.slice.offset += to.offset;  // inside the region: `to` lies inside it, so no overflow
  }
  return placed;
}

}  // namespace pswitch::worker
