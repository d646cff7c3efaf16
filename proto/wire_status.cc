#include "proto/wire_status.h"

#include <string>

namespace pswitch::proto {

ErrorCode ToWireCode(absl::StatusCode code) {
  int value = static_cast<int>(code);
  // absl's canonical codes 0..16 map one to one; anything else is Unknown.
  if (value < 0 || value > static_cast<int>(ErrorCode::MAX)) return ErrorCode::Unknown;
  return static_cast<ErrorCode>(value);
}

absl::StatusCode FromWireCode(ErrorCode code) {
  int value = static_cast<int>(code);
  if (value > static_cast<int>(ErrorCode::MAX)) return absl::StatusCode::kUnknown;
  return static_cast<absl::StatusCode>(value);
}

flatbuffers::Offset<Error> CreateWireError(flatbuffers::FlatBufferBuilder& builder,
                                           const absl::Status& status) {
  auto message = builder.CreateString(std::string(status.message()));
  return CreateError(builder, ToWireCode(status.code()), message);
}

absl::Status FromWireError(const Error* error) {
  if (error == nullptr) return absl::UnknownError("error reply without details");
  absl::StatusCode code = FromWireCode(error->code());
  std::string message = error->message() != nullptr ? error->message()->str() : "";
  // An "Ok" error on the wire is a peer bug, never success.
  if (code == absl::StatusCode::kOk)
    return absl::UnknownError("error reply with code Ok: " + message);
  return absl::Status(code, message);
}

}  // namespace pswitch::proto
