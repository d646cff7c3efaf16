// Framing for every pswitch byte stream: a 4-byte little-endian payload length, then one
// FlatBuffer. Lengths of zero or above the connection's maximum are protocol errors, and every
// payload is run through the FlatBuffers verifier before any field is read.
#ifndef PSWITCH_PROTO_FRAMING_H_
#define PSWITCH_PROTO_FRAMING_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "flatbuffers/flatbuffers.h"

namespace pswitch::proto {

inline constexpr size_t kFrameHeaderBytes = 4;
// Large enough for a batch of inputs; a server may configure less, never more.
inline constexpr uint32_t kDefaultMaxFrameBytes = 64u << 20;
inline constexpr uint32_t kMaxFrameBytesLimit = 1u << 30;

// Returns header + payload, or InvalidArgument if the payload is empty or over the limit.
absl::StatusOr<std::vector<uint8_t>> EncodeFrame(std::span<const uint8_t> payload,
                                                 uint32_t max_frame_bytes = kDefaultMaxFrameBytes);
// Encodes the finished contents of `builder`.
absl::StatusOr<std::vector<uint8_t>> EncodeFrame(const flatbuffers::FlatBufferBuilder& builder,
                                                 uint32_t max_frame_bytes = kDefaultMaxFrameBytes);

// Splits a byte stream into frame payloads. Not thread-safe.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame_bytes = kDefaultMaxFrameBytes)
      : max_frame_bytes_(max_frame_bytes) {}

  void Append(std::span<const uint8_t> bytes);
  // The next complete payload; std::nullopt when more bytes are needed; InvalidArgument (and the
  // decoder stays failed) when the length prefix is zero or too large.
  absl::StatusOr<std::optional<std::vector<uint8_t>>> Next();
  // Bytes still missing to complete the next frame's header, or its payload once the header is
  // in (at least 1). Readers that must not read past a frame boundary size their reads by it.
  size_t BytesNeeded() const;
  // Bytes received and not yet returned by Next (0: between frames).
  size_t buffered() const { return buffer_.size() - consumed_; }
  // Drops (and frees) every byte buffered: for a connection that is being closed.
  void Discard() {
    std::vector<uint8_t>().swap(buffer_);
    consumed_ = 0;
  }

 private:
  const uint32_t max_frame_bytes_;
  std::vector<uint8_t> buffer_;
  size_t consumed_ = 0;
  absl::Status error_;
};

// Every root message carries a 4-byte identifier naming its type (FlatBuffers' file_identifier,
// set per message by Finish below), so a frame of another protocol or message type (a reply
// sent back as a request) fails verification instead of being read as something it is not.
struct ClientRequest;
struct ControllerReply;
struct WorkerCommand;
struct WorkerEvent;
struct MemRequest;
struct MemReply;
template <typename T>
struct RootIdentifier;  // deliberately undefined: only the messages below are roots
template <> struct RootIdentifier<ClientRequest> { static constexpr char kValue[] = "PSCQ"; };
template <> struct RootIdentifier<ControllerReply> { static constexpr char kValue[] = "PSCR"; };
template <> struct RootIdentifier<WorkerCommand> { static constexpr char kValue[] = "PSWC"; };
template <> struct RootIdentifier<WorkerEvent> { static constexpr char kValue[] = "PSWE"; };
template <> struct RootIdentifier<MemRequest> { static constexpr char kValue[] = "PSMQ"; };
template <> struct RootIdentifier<MemReply> { static constexpr char kValue[] = "PSMR"; };

// Finishes `builder` with root message `root`, stamped with its type's identifier.
template <typename T>
void Finish(flatbuffers::FlatBufferBuilder& builder, flatbuffers::Offset<T> root) {
  builder.Finish(root, RootIdentifier<T>::kValue);
}

// Verifies `payload` as a root `T` (its identifier included) and returns it; InvalidArgument
// naming `what` otherwise. The returned pointer borrows `payload`, which must outlive its use.
template <typename T>
absl::StatusOr<const T*> VerifyPayload(std::span<const uint8_t> payload, absl::string_view what) {
  // Depth and table limits bound the verifier's own work on hostile input.
  flatbuffers::Verifier verifier(payload.data(), payload.size(), /*max_depth=*/32,
                                 /*max_tables=*/1u << 20);
  if (payload.size() < sizeof(flatbuffers::uoffset_t) + flatbuffers::kFileIdentifierLength ||
      !verifier.VerifyBuffer<T>(RootIdentifier<T>::kValue)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what, " frame (", payload.size(),
                                                   " bytes) failed verification"));
  }
  return flatbuffers::GetRoot<T>(payload.data());
}

}  // namespace pswitch::proto

#endif  // PSWITCH_PROTO_FRAMING_H_
