// Messages between pipeline stages (activations forward, gradients backward, the tied-weight
// gradient between the two ends) and between the coordinator and a stage (control), over a
// connected Unix stream socket.
//
// A message is a fixed 80-byte header (magic, version, kind, iteration, micro-batch, dtype,
// rank, up to kMaxWireDims dims, payload size) followed by the payload: a row-major tensor, or
// JSON text (dtype u8, one dim) for control. Both ends run on one machine, so the header is in
// host byte order. Every received header is validated before any payload byte is read: magic,
// version, known kind and dtype, rank and dims in range, payload size equal to what the shape
// implies and within the receiver's limit. A receiver then checks the message against what it
// expects at this point of the schedule (ExpectMessage).
#ifndef PSWITCH_PIPELINE_WIRE_H_
#define PSWITCH_PIPELINE_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pswitch::pipeline {

enum class MessageKind : uint16_t {
  // Stage <-> stage.
  kActivation = 1,    // stage s -> s+1, forward output of one micro-batch
  kGradient = 2,      // stage s+1 -> s, gradient of that output
  kTiedGradient = 3,  // first <-> last stage, gradient of a weight both hold
  // Coordinator <-> stage; JSON payloads, see internal/control.h.
  kProfile = 10,  // coordinator: measure your op costs
  kReady = 11,    // stage: my costs
  kPlan = 12,     // coordinator: every stage's costs
  kStart = 13,    // coordinator: run iteration N
  kDone = 14,     // stage: iteration N finished, with its measurements
  kStop = 15,     // coordinator: exit cleanly
  kError = 16,    // stage: I failed, here is why
};

enum class WireDType : uint8_t { kU8 = 1, kF32 = 2, kI64 = 3 };

inline constexpr int kMaxWireDims = 6;
// Default cap on one payload; a receiver may set less.
inline constexpr uint64_t kDefaultMaxPayloadBytes = 1ull << 30;

absl::string_view MessageKindName(MessageKind kind);
size_t WireDTypeBytes(WireDType dtype);

// A dense row-major tensor as bytes.
struct WireTensor {
  WireDType dtype = WireDType::kU8;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

struct Message {
  MessageKind kind = MessageKind::kError;
  int32_t iteration = 0;
  int32_t microbatch = 0;
  WireTensor tensor;
};

// A message whose payload is `text` (control messages).
Message TextMessage(MessageKind kind, int iteration, absl::string_view text);
absl::string_view MessageText(const Message& message);

// Sends `message` on stream socket `fd`, looping on partial writes. DeadlineExceeded when the
// peer does not take it by `deadline`, Unavailable when the peer has closed, InvalidArgument
// when the tensor's size disagrees with its shape.
absl::Status SendMessage(int fd, const Message& message, absl::Time deadline);

// Receives one message. Unavailable when the peer closed at a message boundary, DataLoss when it
// closed mid-message, DeadlineExceeded at `deadline`, InvalidArgument for a malformed header or a
// payload above `max_payload_bytes`.
absl::StatusOr<Message> ReceiveMessage(int fd, uint64_t max_payload_bytes, absl::Time deadline);

// What a receiver expects a tensor to be.
struct TensorSpec {
  WireDType dtype = WireDType::kF32;
  std::vector<int64_t> shape;
};

std::string DescribeSpec(WireDType dtype, const std::vector<int64_t>& shape);

// OK when `message` is the `kind` message of `iteration`/`microbatch` with exactly `spec`'s
// dtype and shape; InvalidArgument naming `link` and both sides of the mismatch otherwise.
absl::Status ExpectMessage(const Message& message, absl::string_view link, MessageKind kind,
                           int iteration, int microbatch, const TensorSpec& spec);

}  // namespace pswitch::pipeline

#endif  // PSWITCH_PIPELINE_WIRE_H_
