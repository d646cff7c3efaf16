// A blocking, framed message channel over a connected Unix stream socket, able to pass one file
// descriptor with a frame (SCM_RIGHTS). Used by processes that talk to one peer from one thread:
// a worker to its memdaemon and controller.
#ifndef PSWITCH_PROTO_FRAME_CHANNEL_H_
#define PSWITCH_PROTO_FRAME_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/framing.h"
#include "base/unique_fd.h"

namespace pswitch::proto {

struct ReceivedFrame {
  std::vector<uint8_t> payload;
  UniqueFd fd;  // valid only when the peer attached one
};

// Not thread-safe: one sender and one receiver thread at most, or external locking.
class FrameChannel {
 public:
  // Takes a connected SOCK_STREAM Unix socket.
  explicit FrameChannel(UniqueFd socket, uint32_t max_frame_bytes = kDefaultMaxFrameBytes);
  FrameChannel(const FrameChannel&) = delete;
  FrameChannel& operator=(const FrameChannel&) = delete;

  // Connects to the Unix socket at `path`.
  static absl::StatusOr<std::unique_ptr<FrameChannel>> Connect(
      absl::string_view path, uint32_t max_frame_bytes = kDefaultMaxFrameBytes);

  // Connects over TCP to "HOST:PORT" (Nagle off: frames are latency-bound).
  static absl::StatusOr<std::unique_ptr<FrameChannel>> ConnectTcp(
      absl::string_view host_port, uint32_t max_frame_bytes = kDefaultMaxFrameBytes);

  // Sends one frame, header and payload as one scatter-gather message (the payload is not
  // copied); `fd_to_pass` (if >= 0) travels with its first byte. The caller keeps ownership of
  // `fd_to_pass`. Blocks until the peer has taken the whole frame.
  absl::Status Send(std::span<const uint8_t> payload, int fd_to_pass = -1);
  absl::Status Send(const flatbuffers::FlatBufferBuilder& builder, int fd_to_pass = -1);
  // Receives one frame. Unavailable when the peer closed, DeadlineExceeded on timeout,
  // InvalidArgument for a bad length prefix.
  absl::StatusOr<ReceivedFrame> Receive(absl::Duration timeout = absl::InfiniteDuration());

  // Gives back a payload Receive returned, once it is no longer needed: the next large frame
  // reuses its memory (FrameDecoder::Recycle).
  void Recycle(std::vector<uint8_t> spent) { decoder_.Recycle(std::move(spent)); }

  int fd() const { return socket_.get(); }

 private:
  absl::Status ReadSome(absl::Time deadline, UniqueFd* passed_fd);

  UniqueFd socket_;
  FrameDecoder decoder_;
  UniqueFd pending_fd_;  // an fd that arrived with bytes of a frame not yet complete
};

// Sends `frame` bytes with optional ancillary fd on a stream socket, looping on partial writes
// (and waiting for the socket when it is full).
absl::Status SendAllWithFd(int socket_fd, std::span<const uint8_t> bytes, int fd_to_pass);
// Frames `payload` and sends header and payload with one sendmsg per write (an iovec; no copy),
// looping as SendAllWithFd does. InvalidArgument for an empty or oversize payload.
absl::Status SendFrameWithFd(int socket_fd, std::span<const uint8_t> payload, int fd_to_pass,
                             uint32_t max_frame_bytes = kDefaultMaxFrameBytes);
// One non-blocking sendmsg of bytes [offset, end) of the concatenation of `parts` (scatter-
// gather: up to 8 parts). `fd_to_pass` (if >= 0) travels only when offset is 0, with the first
// byte. Returns the bytes the socket took: 0 when it is full (EAGAIN); Unavailable-like errors
// from sendmsg otherwise (EPIPE when the peer is gone).
absl::StatusOr<size_t> SendPartsOnce(int socket_fd, std::span<const std::span<const uint8_t>> parts,
                                     size_t offset, int fd_to_pass);

}  // namespace pswitch::proto

#endif  // PSWITCH_PROTO_FRAME_CHANNEL_H_
