#include "pipeline/wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace pswitch::pipeline {
namespace {

constexpr uint32_t kMagic = 0x4c505350;  // "PSPL"
constexpr uint16_t kVersion = 1;

struct WireHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  int32_t iteration;
  int32_t microbatch;
  uint8_t dtype;
  uint8_t ndim;
  uint8_t reserved[6];
  int64_t shape[kMaxWireDims];
  uint64_t payload_bytes;
};
static_assert(sizeof(WireHeader) == 80, "the header layout is part of the wire format");

// A dim this large is a corrupt header, not a tensor (and keeps the product below overflow).
constexpr int64_t kMaxDim = int64_t{1} << 40;

bool KnownKind(uint16_t kind) { return (kind >= 1 && kind <= 3) || (kind >= 10 && kind <= 16); }

bool KnownDType(uint8_t dtype) { return dtype >= 1 && dtype <= 3; }

// Payload bytes implied by dtype and shape; nullopt-like -1 on a bad dim or overflow.
int64_t ImpliedBytes(WireDType dtype, const int64_t* shape, int ndim) {
  __int128 bytes = static_cast<__int128>(WireDTypeBytes(dtype));
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0 || shape[i] > kMaxDim) return -1;
    bytes *= shape[i];
    if (bytes > std::numeric_limits<int64_t>::max()) return -1;
  }
  return static_cast<int64_t>(bytes);
}

// Waits until `fd` is ready for `events` or `deadline` passes.
absl::Status WaitReady(int fd, short events, absl::Time deadline, absl::string_view what) {
  while (true) {
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
      }
      // Round up so a sub-millisecond remainder does not spin.
      timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(left + absl::Milliseconds(1)));
    }
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, timeout_ms);
    if (r > 0) return absl::OkStatus();
    if (r < 0 && errno != EINTR) return ErrnoStatus(absl::StrCat(what, ": poll"));
  }
}

// Reads exactly `size` bytes. `got_any` tells a clean close (no byte of the message yet) from a
// truncated message.
absl::Status ReadFull(int fd, uint8_t* data, size_t size, absl::Time deadline, bool* got_any) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::recv(fd, data + done, size - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      *got_any = true;
      continue;
    }
    if (n == 0) {
      return *got_any ? absl::DataLossError("peer closed mid-message")
                      : absl::UnavailableError("peer closed");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      PSWITCH_RETURN_IF_ERROR(WaitReady(fd, POLLIN, deadline, "receive"));
      continue;
    }
    if (errno == ECONNRESET) return absl::UnavailableError("peer reset the connection");
    return ErrnoStatus("recv");
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view MessageKindName(MessageKind kind) {
  switch (kind) {
    case MessageKind::kActivation:
      return "activation";
    case MessageKind::kGradient:
      return "gradient";
    case MessageKind::kTiedGradient:
      return "tied-weight gradient";
    case MessageKind::kProfile:
      return "profile";
    case MessageKind::kReady:
      return "ready";
    case MessageKind::kPlan:
      return "plan";
    case MessageKind::kStart:
      return "start";
    case MessageKind::kDone:
      return "done";
    case MessageKind::kStop:
      return "stop";
    case MessageKind::kError:
      return "error";
  }
  return "unknown";
}

size_t WireDTypeBytes(WireDType dtype) {
  switch (dtype) {
    case WireDType::kU8:
      return 1;
    case WireDType::kF32:
      return 4;
    case WireDType::kI64:
      return 8;
  }
  return 0;
}

Message TextMessage(MessageKind kind, int iteration, absl::string_view text) {
  Message m;
  m.kind = kind;
  m.iteration = iteration;
  m.tensor.dtype = WireDType::kU8;
  m.tensor.shape = {static_cast<int64_t>(text.size())};
  m.tensor.data.assign(text.begin(), text.end());
  return m;
}

absl::string_view MessageText(const Message& message) {
  return absl::string_view(reinterpret_cast<const char*>(message.tensor.data.data()),
                           message.tensor.data.size());
}

absl::Status SendMessage(int fd, const Message& message, absl::Time deadline) {
  const WireTensor& t = message.tensor;
  if (t.shape.size() > static_cast<size_t>(kMaxWireDims)) {
    return absl::InvalidArgumentError(absl::StrCat("send ", MessageKindName(message.kind),
                                                   ": rank ", t.shape.size(), " above ",
                                                   kMaxWireDims));
  }
  WireHeader h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.kind = static_cast<uint16_t>(message.kind);
  h.iteration = message.iteration;
  h.microbatch = message.microbatch;
  h.dtype = static_cast<uint8_t>(t.dtype);
  h.ndim = static_cast<uint8_t>(t.shape.size());
  for (size_t i = 0; i < t.shape.size(); ++i) h.shape[i] = t.shape[i];
  h.payload_bytes = t.data.size();
  const int64_t implied = ImpliedBytes(t.dtype, h.shape, h.ndim);
  if (implied < 0 || static_cast<uint64_t>(implied) != t.data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("send ", MessageKindName(message.kind), ": ",
                                                   t.data.size(), " bytes for a ",
                                                   DescribeSpec(t.dtype, t.shape), " tensor"));
  }
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t*>(t.data.data()), t.data.size()}};
  size_t total = sizeof(h) + t.data.size(), sent = 0;
  while (sent < total) {
    // Skip what has gone out already across the two buffers.
    iovec parts[2];
    int count = 0;
    size_t skip = sent;
    for (const iovec& v : iov) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      parts[count++] = {static_cast<uint8_t*>(v.iov_base) + skip, v.iov_len - skip};
      skip = 0;
    }
    msghdr msg{};
    msg.msg_iov = parts;
    msg.msg_iovlen = count;
    // Non-blocking with poll, so a peer that stops reading costs at most `deadline`.
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      PSWITCH_RETURN_IF_ERROR(WaitReady(fd, POLLOUT, deadline, "send"));
      continue;
    }
    if (errno == EPIPE || errno == ECONNRESET) return absl::UnavailableError("peer closed");
    return ErrnoStatus("sendmsg");
  }
  return absl::OkStatus();
}

absl::StatusOr<Message> ReceiveMessage(int fd, uint64_t max_payload_bytes, absl::Time deadline) {
  WireHeader h;
  bool got_any = false;
  PSWITCH_RETURN_IF_ERROR(
      ReadFull(fd, reinterpret_cast<uint8_t*>(&h), sizeof(h), deadline, &got_any));
  if (h.magic != kMagic || h.version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad message header (magic ", h.magic, ", version ", h.version, ")"));
  }
  if (!KnownKind(h.kind) || !KnownDType(h.dtype) || h.ndim > kMaxWireDims) {
    return absl::InvalidArgumentError(absl::StrCat("bad message header (kind ", h.kind, ", dtype ",
                                                   h.dtype, ", rank ", h.ndim, ")"));
  }
  Message m;
  m.kind = static_cast<MessageKind>(h.kind);
  m.iteration = h.iteration;
  m.microbatch = h.microbatch;
  m.tensor.dtype = static_cast<WireDType>(h.dtype);
  m.tensor.shape.assign(h.shape, h.shape + h.ndim);
  const int64_t implied = ImpliedBytes(m.tensor.dtype, h.shape, h.ndim);
  if (implied < 0 || static_cast<uint64_t>(implied) != h.payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(MessageKindName(m.kind), " message: header says ", h.payload_bytes,
                     " bytes for a ", DescribeSpec(m.tensor.dtype, m.tensor.shape), " tensor"));
  }
  if (h.payload_bytes > max_payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(MessageKindName(m.kind), " message of ",
                                                   h.payload_bytes, " bytes exceeds the limit of ",
                                                   max_payload_bytes));
  }
  m.tensor.data.resize(h.payload_bytes);
  PSWITCH_RETURN_IF_ERROR(
      ReadFull(fd, m.tensor.data.data(), m.tensor.data.size(), deadline, &got_any));
  return m;
}

std::string DescribeSpec(WireDType dtype, const std::vector<int64_t>& shape) {
  const char* name = dtype == WireDType::kF32 ? "f32" : dtype == WireDType::kI64 ? "i64" : "u8";
  return absl::StrCat(name, "[", absl::StrJoin(shape, ", "), "]");
}

absl::Status ExpectMessage(const Message& message, absl::string_view link, MessageKind kind,
                           int iteration, int microbatch, const TensorSpec& spec) {
  if (message.kind != kind || message.iteration != iteration || message.microbatch != microbatch) {
    return absl::InvalidArgumentError(
        absl::StrCat(link, ": expected the ", MessageKindName(kind), " of iteration ", iteration,
                     " micro-batch ", microbatch, ", got the ", MessageKindName(message.kind),
                     " of iteration ", message.iteration, " micro-batch ", message.microbatch));
  }
  if (message.tensor.dtype != spec.dtype || message.tensor.shape != spec.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(link, ": ", MessageKindName(kind), " of micro-batch ", microbatch,
                     ": expected ", DescribeSpec(spec.dtype, spec.shape), ", got ",
                     DescribeSpec(message.tensor.dtype, message.tensor.shape)));
  }
  return absl::OkStatus();
}

}  // namespace pswitch::pipeline
