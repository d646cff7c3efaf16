// One framed, asynchronous connection on an Asio stream socket (TCP or Unix), as the servers
// (controller, memdaemon) use it: frames in, frames (optionally with one fd) out, and a bad
// frame answered with an error reply before that connection alone is closed.
#ifndef PSWITCH_PROTO_FRAMED_CONNECTION_H_
#define PSWITCH_PROTO_FRAMED_CONNECTION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "asio.hpp"
#include "proto/framing.h"
#include "base/unique_fd.h"

namespace pswitch::proto {

// Thread-safety: every member must run on the socket's executor (one io_context thread);
// other threads post to it. The connection keeps itself alive (shared_from_this) while a read
// or write is outstanding and is destroyed once closed and idle.
class FramedConnection : public std::enable_shared_from_this<FramedConnection> {
 public:
  using Socket = asio::generic::stream_protocol::socket;
  // Called once per complete frame; the handler verifies the payload itself.
  using FrameHandler = std::function<void(FramedConnection&, std::vector<uint8_t> payload)>;
  // Builds the protocol's error reply for a connection-level failure (bad length prefix).
  using ErrorReplyBuilder = std::function<std::vector<uint8_t>(const absl::Status&)>;
  // Called exactly once when the connection closes, with the reason (OK for a clean close).
  using CloseHandler = std::function<void(FramedConnection&, const absl::Status&)>;

  static std::shared_ptr<FramedConnection> Create(Socket socket, uint32_t max_frame_bytes,
                                                  FrameHandler on_frame,
                                                  ErrorReplyBuilder error_reply,
                                                  CloseHandler on_close);
  FramedConnection(const FramedConnection&) = delete;
  FramedConnection& operator=(const FramedConnection&) = delete;

  // Starts reading. Call once, on the executor.
  void Start();
  // Queues one frame; `fd` (if valid) is passed with it over a Unix socket (SCM_RIGHTS).
  void Send(std::vector<uint8_t> payload, UniqueFd fd = UniqueFd());
  // Sends `error_payload`, then closes: the policy for any malformed input on this connection.
  void Reject(std::vector<uint8_t> error_payload);
  // Stops reading, sends what is queued, then closes with `why` (graceful shutdown).
  void CloseAfterWrites(const absl::Status& why = absl::OkStatus());
  // Closes now; queued frames are dropped.
  void Close(const absl::Status& why = absl::OkStatus());

  bool closed() const { return closed_; }
  Socket& socket() { return socket_; }

 private:
  struct Outgoing {
    std::vector<uint8_t> frame;
    UniqueFd fd;
  };
  FramedConnection(Socket socket, uint32_t max_frame_bytes, FrameHandler on_frame,
                   ErrorReplyBuilder error_reply, CloseHandler on_close);
  void ReadMore();
  void WriteNext();

  Socket socket_;
  const uint32_t max_frame_bytes_;
  FrameHandler on_frame_;
  ErrorReplyBuilder error_reply_;
  CloseHandler on_close_;
  FrameDecoder decoder_;
  std::vector<uint8_t> read_buffer_;
  std::deque<Outgoing> outgoing_;
  bool writing_ = false;
  bool close_after_writes_ = false;
  absl::Status close_after_writes_why_;  // what on_close hears then
  bool closed_ = false;
};

}  // namespace pswitch::proto

#endif  // PSWITCH_PROTO_FRAMED_CONNECTION_H_
