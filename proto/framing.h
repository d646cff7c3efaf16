// Framing for every pswitch byte stream: a 4-byte little-endian payload length, then one
// FlatBuffer. Lengths of zero or above the connection's maximum are protocol errors, and every
// payload is run through the FlatBuffers verifier before any field is read.
#ifndef PSWITCH_PROTO_FRAMING_H_
#define PSWITCH_PROTO_FRAMING_H_

#include <array>
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
// The 4-byte header alone, for senders that write header and payload as one scatter-gather
// message (no copy of the payload); the same errors as EncodeFrame.
absl::StatusOr<std::array<uint8_t, kFrameHeaderBytes>> EncodeFrameHeader(
    size_t payload_bytes, uint32_t max_frame_bytes = kDefaultMaxFrameBytes);

// Splits a byte stream into frame payloads. Not thread-safe.
//
// Memory: small frames go through one receive buffer that is kept and reused between frames
// (cleared, not freed, while its capacity is at most kKeptBufferBytes; a connection that once
// needed more gives it back as soon as it is between frames). A frame of kDirectBodyBytes or
// more is received straight into its own payload vector: space for it is reserved once its
// header has arrived (address space only; pages are touched as bytes arrive, so a peer that
// sends a large header and nothing else costs no memory) and Next hands that vector out without
// a copy. A payload the caller is done with may come back through Recycle, so the next large
// frame reuses memory that is already faulted in instead of faulting a fresh mapping.
class FrameDecoder {
 public:
  static constexpr size_t kKeptBufferBytes = 256 << 10;
  static constexpr size_t kDirectBodyBytes = 64 << 10;
  // The largest payload vector Recycle keeps for reuse.
  static constexpr size_t kKeptSpareBytes = 64 << 20;

  explicit FrameDecoder(uint32_t max_frame_bytes = kDefaultMaxFrameBytes)
      : max_frame_bytes_(max_frame_bytes) {}

  // Takes bytes read elsewhere (a copy into the decoder's buffer or a large frame's payload).
  void Append(std::span<const uint8_t> bytes);
  // Where the next read should land, for readers that receive in place: never past the end of
  // the current frame's header, or of its payload once the header is in (so an fd passed with a
  // frame is always read with that frame), and at most kBodyChunkBytes of a large payload at a
  // time. Follow with Commit(n) for the n bytes actually written (n may be 0). Empty once the
  // decoder has failed or a complete frame waits for Next.
  std::span<uint8_t> ReceiveSpace();
  void Commit(size_t n);
  // The next complete payload; std::nullopt when more bytes are needed; InvalidArgument (and the
  // decoder stays failed) when the length prefix is zero or too large.
  absl::StatusOr<std::optional<std::vector<uint8_t>>> Next();
  // Bytes still missing to complete the next frame's header, or its payload once the header is
  // in (at least 1). Readers that must not read past a frame boundary size their reads by it.
  size_t BytesNeeded() const;
  // Bytes received and not yet returned by Next (0: between frames).
  size_t buffered() const {
    // Space offered by ReceiveSpace and not yet committed holds no bytes yet.
    return buffer_.size() - consumed_ + (in_body() ? kFrameHeaderBytes + body_.size() : 0) -
           offered_;
  }
  // Capacity the decoder holds on to (its buffer, a large frame's reserved payload, the spare).
  size_t retained_bytes() const {
    return buffer_.capacity() + body_.capacity() + spare_.capacity();
  }
  // Gives back a payload Next returned once its bytes are no longer needed; kept (at most one,
  // at most kKeptSpareBytes of capacity) for the next large frame.
  void Recycle(std::vector<uint8_t> spent);
  // Drops (and frees) every byte buffered and the kept spare: for a connection that is being
  // closed, or one gone idle.
  void Discard();

 private:
  static constexpr size_t kBodyChunkBytes = 1 << 20;
  bool in_body() const { return body_length_ > 0; }
  bool body_complete() const { return in_body() && body_.size() == body_length_; }
  // Bytes of the current small frame (or its header) still missing from buffer_.
  size_t BufferNeeded() const;
  // When buffer_ holds the valid header of a large frame, moves that frame into body_.
  void MaybeStartBody();
  // Between frames: keeps the buffer's memory for the next frame, unless it grew past the cap.
  void ResetBufferIfEmpty();

  const uint32_t max_frame_bytes_;
  std::vector<uint8_t> buffer_;
  size_t consumed_ = 0;
  std::vector<uint8_t> body_;   // a large frame's payload, received in place
  size_t body_length_ = 0;      // its declared length; 0: no large frame in progress
  size_t offered_ = 0;          // bytes ReceiveSpace handed out, not yet committed
  std::vector<uint8_t> spare_;  // a recycled payload's memory
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
