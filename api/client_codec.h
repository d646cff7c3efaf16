// The client protocol's codec for the shared types (api/types.h): the one place they are turned
// into proto/client.fbs tables and back. Enums convert by name, never by cast, and a value this
// build does not know (a newer peer) is an error, not a wrong state.
#ifndef PSWITCH_API_CLIENT_CODEC_H_
#define PSWITCH_API_CLIENT_CODEC_H_

#include "absl/status/statusor.h"
#include "api/types.h"
#include "flatbuffers/flatbuffers.h"
#include "proto/client_generated.h"

namespace pswitch::api {

proto::TaskState ToWire(TaskState state);
absl::StatusOr<TaskState> FromWire(proto::TaskState state);
proto::FillState ToWire(FillState state);
absl::StatusOr<FillState> FromWire(proto::FillState state);
proto::FillKind ToWire(FillKind kind);
absl::StatusOr<FillKind> FromWire(proto::FillKind kind);

flatbuffers::Offset<proto::TaskStatus> Encode(flatbuffers::FlatBufferBuilder& b,
                                              const TaskStatus& status);
absl::StatusOr<TaskStatus> Decode(const proto::TaskStatus& wire);
flatbuffers::Offset<proto::FillStatus> Encode(flatbuffers::FlatBufferBuilder& b,
                                              const FillJobStatus& status);
absl::StatusOr<FillJobStatus> Decode(const proto::FillStatus& wire);
flatbuffers::Offset<proto::FillStats> Encode(flatbuffers::FlatBufferBuilder& b,
                                             const FillStats& stats);
FillStats Decode(const proto::FillStats& wire);

}  // namespace pswitch::api

#endif  // PSWITCH_API_CLIENT_CODEC_H_
