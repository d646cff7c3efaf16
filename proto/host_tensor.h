// A tensor as it crosses the wire (task inputs and outputs): dtype, shape and raw bytes, with
// no dependency on libtorch, so clients can build against proto/ and client/ alone.
#ifndef PSWITCH_PROTO_HOST_TENSOR_H_
#define PSWITCH_PROTO_HOST_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "flatbuffers/flatbuffers.h"
#include "proto/common_generated.h"

namespace pswitch::proto {

inline constexpr int kMaxTensorDims = 8;

// `length` bytes at `offset` of a transfer region (docs/dataplane.md) or of a frame's raw
// payload, as the wire's Slice.
struct ByteSlice {
  uint64_t region = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const ByteSlice&) const = default;
};

struct HostTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // Place::Inline: little-endian, row-major, contiguous
  // Where the bytes are: in `data`, or (Place::Region, Place::Payload) at `slice`, `data` empty.
  Place place = Place::Inline;
  ByteSlice slice;
};

// The bytes `tensor` holds or points at (data's size, or the slice's length).
uint64_t ByteLength(const HostTensor& tensor);

// Bytes per element of `dtype`; 0 for an unknown value.
size_t DTypeBytes(DType dtype);
// Elements implied by `shape`; InvalidArgument for a negative dim, too many dims or overflow.
absl::StatusOr<uint64_t> ElementCount(const std::vector<int64_t>& shape);
// The bytes `shape` of `dtype` needs; InvalidArgument (no name) for an unknown dtype, a bad
// shape or an overflow.
absl::StatusOr<uint64_t> ShapeBytes(DType dtype, const std::vector<int64_t>& shape);
// InvalidArgument naming the tensor unless dtype, shape and byte length (data's or the slice's)
// agree, and an inline tensor has no slice, a placed one no data. A slice's place within its
// region is checked by whoever maps the region (dataplane/).
absl::Status ValidateHostTensor(const HostTensor& tensor);

flatbuffers::Offset<Tensor> CreateWireTensor(flatbuffers::FlatBufferBuilder& builder,
                                             const HostTensor& tensor);
flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<Tensor>>> CreateWireTensors(
    flatbuffers::FlatBufferBuilder& builder, const std::vector<HostTensor>& tensors);
// Copies and validates a verified wire tensor; a null vector is an empty list.
absl::StatusOr<HostTensor> FromWireTensor(const Tensor& tensor);
absl::StatusOr<std::vector<HostTensor>> FromWireTensors(
    const flatbuffers::Vector<flatbuffers::Offset<Tensor>>* tensors);

}  // namespace pswitch::proto

#endif  // PSWITCH_PROTO_HOST_TENSOR_H_
