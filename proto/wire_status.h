// The one place absl::Status and the wire's Error table meet.
#ifndef PSWITCH_PROTO_WIRE_STATUS_H_
#define PSWITCH_PROTO_WIRE_STATUS_H_

#include "absl/status/status.h"
#include "flatbuffers/flatbuffers.h"
#include "proto/common_generated.h"

namespace pswitch::proto {

ErrorCode ToWireCode(absl::StatusCode code);
absl::StatusCode FromWireCode(ErrorCode code);

// Serialises a non-OK `status` as an Error table in `builder`.
flatbuffers::Offset<Error> CreateWireError(flatbuffers::FlatBufferBuilder& builder,
                                           const absl::Status& status);
// The Status an Error table describes; a null table is Unknown.
absl::Status FromWireError(const Error* error);

}  // namespace pswitch::proto

#endif  // PSWITCH_PROTO_WIRE_STATUS_H_
