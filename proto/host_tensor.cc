#include "proto/host_tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "proto/dtype.h"

namespace pswitch::proto {

size_t DTypeBytes(DType dtype) {
  const DTypeInfo* info = FindDType(dtype);
  return info == nullptr ? 0 : info->bytes;
}

absl::StatusOr<uint64_t> ElementCount(const std::vector<int64_t>& shape) {
  if (shape.size() > kMaxTensorDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(shape.size(), " dimensions (at most ", kMaxTensorDims, ")"));
  }
  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", dim));
    if (dim != 0 && count > UINT64_MAX / static_cast<uint64_t>(dim)) {
      return absl::InvalidArgumentError("shape overflows 64 bits");
    }
    count *= static_cast<uint64_t>(dim);
  }
  return count;
}

absl::StatusOr<uint64_t> ShapeBytes(DType dtype, const std::vector<int64_t>& shape) {
  const size_t element_bytes = DTypeBytes(dtype);
  if (element_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  PSWITCH_ASSIGN_OR_RETURN(uint64_t count, ElementCount(shape));
  if (count > UINT64_MAX / element_bytes) {
    return absl::InvalidArgumentError("shape's byte size overflows 64 bits");
  }
  return count * element_bytes;
}

uint64_t ByteLength(const HostTensor& tensor) {
  return tensor.place == Place::Inline ? tensor.data.size() : tensor.slice.length;
}

absl::Status ValidateHostTensor(const HostTensor& tensor) {
  absl::StatusOr<uint64_t> bytes = ShapeBytes(tensor.dtype, tensor.shape);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name, "': ", bytes.status().message()));
  }
  switch (tensor.place) {
    case Place::Inline:
      if (tensor.slice != ByteSlice{}) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", tensor.name, "': inline data with a slice"));
      }
      break;
    case Place::Region:
    case Place::Payload:
      if (!tensor.data.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", tensor.name, "': both inline data and a slice"));
      }
      if (tensor.place == Place::Payload && tensor.slice.region != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", tensor.name, "': a payload slice names a region"));
      }
      if (tensor.slice.offset > UINT64_MAX - tensor.slice.length) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", tensor.name, "': slice offset + length overflows"));
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", tensor.name, "': unknown place ", static_cast<int>(tensor.place)));
  }
  if (*bytes != ByteLength(tensor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name, "': shape needs ", *bytes, " bytes but ",
                     ByteLength(tensor), " bytes were given"));
  }
  return absl::OkStatus();
}

flatbuffers::Offset<Tensor> CreateWireTensor(flatbuffers::FlatBufferBuilder& builder,
                                             const HostTensor& tensor) {
  auto name = builder.CreateString(tensor.name);
  auto shape = builder.CreateVector(tensor.shape);
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> data = 0;
  if (tensor.place == Place::Inline) {
    // Tensor payloads are read as typed arrays on the other side: align them.
    builder.ForceVectorAlignment(tensor.data.size(), sizeof(uint8_t), 16);
    data = builder.CreateVector(tensor.data);
  }
  const Slice slice(tensor.slice.region, tensor.slice.offset, tensor.slice.length);
  return CreateTensor(builder, name, tensor.dtype, shape, data, tensor.place,
                      tensor.place == Place::Inline ? nullptr : &slice);
}

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<Tensor>>> CreateWireTensors(
    flatbuffers::FlatBufferBuilder& builder, const std::vector<HostTensor>& tensors) {
  std::vector<flatbuffers::Offset<Tensor>> offsets;
  offsets.reserve(tensors.size());
  for (const HostTensor& t : tensors) offsets.push_back(CreateWireTensor(builder, t));
  return builder.CreateVector(offsets);
}

absl::StatusOr<HostTensor> FromWireTensor(const Tensor& tensor) {
  HostTensor out;
  out.name = tensor.name() != nullptr ? tensor.name()->str() : "";
  out.dtype = tensor.dtype();
  if (tensor.shape() != nullptr) {
    // The verifier checks only a vector's 4-byte length prefix for alignment, so a crafted [long]
    // can start 4 bytes off an 8-byte boundary: copy each dim bytewise instead of loading it as
    // an int64_t (a misaligned load, which UBSan reports).
    const flatbuffers::Vector<int64_t>& shape = *tensor.shape();
    out.shape.resize(shape.size());
    for (flatbuffers::uoffset_t i = 0; i < shape.size(); ++i) {
      int64_t dim;
      std::memcpy(&dim, shape.Data() + i * sizeof(int64_t), sizeof(dim));
      out.shape[i] = flatbuffers::EndianScalar(dim);
    }
  }
  if (tensor.data() != nullptr) out.data.assign(tensor.data()->begin(), tensor.data()->end());
  out.place = tensor.place();
  if (const Slice* slice = tensor.slice(); slice != nullptr) {
    out.slice = ByteSlice{slice->region(), slice->offset(), slice->length()};
  }
  PSWITCH_RETURN_IF_ERROR(ValidateHostTensor(out));
  return out;
}

absl::StatusOr<std::vector<HostTensor>> FromWireTensors(
    const flatbuffers::Vector<flatbuffers::Offset<Tensor>>* tensors) {
  std::vector<HostTensor> out;
  if (tensors == nullptr) return out;
  out.reserve(tensors->size());
  for (const Tensor* t : *tensors) {
    PSWITCH_ASSIGN_OR_RETURN(HostTensor host, FromWireTensor(*t));
    out.push_back(std::move(host));
  }
  return out;
}

}  // namespace pswitch::proto
