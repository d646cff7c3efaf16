// One framed, asynchronous connection on an Asio stream socket (TCP or Unix), as the servers
// (controller, memdaemon) use it: frames (on a Unix socket optionally with fds) in, frames
// (optionally with one fd) out, and a bad frame answered with an error reply before that
// connection alone is closed.
//
// Files passed with a frame (SCM_RIGHTS) arrive with the first bytes of the sender's sendmsg,
// which start the frame. A connection that receives fds therefore never reads past the end of
// the frame it is reading (the header first, then exactly the rest), so every fd received while
// a frame is read is that frame's, and the handler gets them together.
#ifndef PSWITCH_PROTO_FRAMED_CONNECTION_H_
#define PSWITCH_PROTO_FRAMED_CONNECTION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "asio.hpp"
#include "base/unique_fd.h"
#include "proto/framing.h"

namespace pswitch::proto {

// Keeps count of what one connection holds for its peer (incomplete frames and queued replies)
// against bounds kept elsewhere, e.g. a byte budget every connection of a server shares.
// `held_bytes` is what the connection holds from now on. Growing may fail (ResourceExhausted
// naming the bound reached; nothing is charged then), shrinking must not. Called on the
// connection's executor; proto/ knows nothing of whom the bytes are charged to.
using HeldBytesHook = std::function<absl::Status(size_t held_bytes)>;

// What a connection counts for each queued reply beside its bytes (the deque slot and the
// allocation's header): a peer asking for many tiny replies pays for them too.
inline constexpr size_t kQueuedFrameOverheadBytes = 64;

// What one connection may hold and for how long, as a server configures it (nginx's
// client_body_timeout, keepalive_timeout and buffer limits play the same roles).
struct ConnectionLimits {
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  // A frame begun must be complete within this, however steadily it arrives: a peer trickling
  // bytes is cut (a deadline for the whole frame, so 64 MiB in 30 s needs about 2.2 MB/s).
  absl::Duration frame_timeout = absl::InfiniteDuration();
  // Replies queued for a peer that does not read them; beyond this the connection is closed
  // (one reply larger than this is still sent when nothing else is queued).
  size_t max_queued_bytes = SIZE_MAX;
  // Told every change of what the connection holds (unset: no bound beyond the above). An
  // incomplete frame that does not fit is answered with the hook's error before the close; a
  // reply that does not fit closes the connection with it.
  HeldBytesHook held_bytes;
  // Unix sockets only: files a peer may pass with one frame (SCM_RIGHTS); more close the
  // connection with an error reply, and the extras are closed. 0: none are received (any a peer
  // sends are closed by the kernel unread), and reads may span frames.
  size_t max_fds_per_frame = 0;
  // Raw bytes a frame may be followed by (ReceivePayload: ClientRequest.payload_bytes); 0: none.
  // With payloads allowed, reads never span a frame's end (as with fds), so whatever follows a
  // frame is still in the socket when its handler decides where that frame's payload goes.
  uint64_t max_payload_bytes = 0;
};

// Thread-safety: every member must run on the socket's executor (one io_context thread);
// other threads post to it. The connection keeps itself alive (shared_from_this) while a read
// or write is outstanding and is destroyed once closed and idle.
class FramedConnection : public std::enable_shared_from_this<FramedConnection> {
 public:
  using Socket = asio::generic::stream_protocol::socket;
  // Called once per complete frame; the handler verifies the payload itself.
  using FrameHandler = std::function<void(FramedConnection&, std::vector<uint8_t> payload)>;
  // The same, with the files passed with the frame (at most max_fds_per_frame; the handler owns
  // them, and those it drops are closed).
  using FrameWithFdsHandler =
      std::function<void(FramedConnection&, std::vector<uint8_t> payload, std::vector<UniqueFd>)>;
  // Builds the protocol's error reply for a connection-level failure (bad length prefix).
  using ErrorReplyBuilder = std::function<std::vector<uint8_t>(const absl::Status&)>;
  // Called exactly once when the connection closes, with the reason (OK for a clean close).
  using CloseHandler = std::function<void(FramedConnection&, const absl::Status&)>;

  static std::shared_ptr<FramedConnection> Create(Socket socket, ConnectionLimits limits,
                                                  FrameHandler on_frame,
                                                  ErrorReplyBuilder error_reply,
                                                  CloseHandler on_close);
  static std::shared_ptr<FramedConnection> Create(Socket socket, ConnectionLimits limits,
                                                  FrameWithFdsHandler on_frame,
                                                  ErrorReplyBuilder error_reply,
                                                  CloseHandler on_close);
  // How long the connection may now sit with no complete frame and no reply before it is closed
  // (infinite: for ever, e.g. while the peer awaits a result), part-way through a frame or not.
  // Asked after each read and reply and whenever the time is up; unset: no idle limit. Call
  // before Start.
  using IdlePolicy = std::function<absl::Duration()>;
  void SetIdlePolicy(IdlePolicy policy) { idle_policy_ = std::move(policy); }
  FramedConnection(const FramedConnection&) = delete;
  FramedConnection& operator=(const FramedConnection&) = delete;

  // Starts reading. Call once, on the executor.
  void Start();
  // Queues one frame; `fd` (if valid) is passed with it over a Unix socket (SCM_RIGHTS).
  void Send(std::vector<uint8_t> payload, UniqueFd fd = UniqueFd());
  // Queues one frame followed by `raw` (ControllerReply.payload_bytes), both sent by one
  // scatter-gather write from where they lie: `raw` is not copied, and `keep` (which must keep
  // `raw` valid) is held until the write completes or the connection drops it.
  void SendWithPayload(std::vector<uint8_t> payload, std::span<const uint8_t> raw,
                       std::shared_ptr<const void> keep);

  // Called when a frame's raw payload has been received (OK) or will never be (the connection
  // closed: the deadline, the peer went away; the reason). Runs exactly once, on the executor.
  using PayloadDone = std::function<void(FramedConnection&, const absl::Status&)>;
  // From the frame handler only, for the frame it was just handed: that frame is followed on
  // the stream by `bytes` raw bytes (at most max_payload_bytes, else InvalidArgument and nothing
  // changes). They are read straight into `into` (`bytes` long; the caller keeps it valid until
  // `done` runs), or read and dropped when `into` is null (a refused request's payload: the
  // stream stays in step). No frame is read meanwhile, and the frame's deadline (from its first
  // byte) covers the payload too. `keep` keeps `into` valid: it is held until no read into it
  // can still be outstanding, which may be after `done` reported a failure. The caller accounts
  // for `into`'s memory; dropping holds none.
  absl::Status ReceivePayload(uint64_t bytes, uint8_t* into, std::shared_ptr<const void> keep,
                              PayloadDone done);
  // When the first byte of the frame being handled arrived (CLOCK_MONOTONIC ns), for the frame
  // handler and a PayloadDone: a request's arrival, payload included.
  int64_t frame_arrival_ns() const { return handled_frame_ns_; }

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
    std::span<const uint8_t> raw;       // sent after `frame` (SendWithPayload)
    std::shared_ptr<const void> keep;   // keeps `raw` valid
  };
  // Reads the rest of the payload ReceivePayload announced; then frames again.
  void ReadPayload();
  // Runs a pending PayloadDone with `why` (an error): the payload will not arrive.
  void FailPayload(const absl::Status& why);
  // Queues `frame` (encoded) with its raw tail; the checks Send makes.
  void Queue(std::vector<uint8_t> payload, UniqueFd fd, std::span<const uint8_t> raw,
             std::shared_ptr<const void> keep);
  FramedConnection(Socket socket, ConnectionLimits limits, FrameWithFdsHandler on_frame,
                   ErrorReplyBuilder error_reply, CloseHandler on_close);
  void ReadMore();
  // ReadMore for a connection that receives fds: recvmsg of at most the current frame's rest.
  void ReadWithFds();
  // Feeds `n` bytes just read into read_buffer_ to the decoder and hands out complete frames;
  // then reads on, unless the connection is closing.
  void OnBytes(size_t n);
  void WriteNext();
  // Tells the hook what the connection now holds (the decoder's bytes and the queued replies);
  // its error when that is more than it may.
  absl::Status UpdateHeld();
  // Re-arms the timer for whichever comes first: the frame deadline or the idle deadline.
  void ArmTimer();
  void OnTimer();

  Socket socket_;
  const ConnectionLimits limits_;
  FrameWithFdsHandler on_frame_;
  ErrorReplyBuilder error_reply_;
  CloseHandler on_close_;
  FrameDecoder decoder_;
  std::vector<uint8_t> read_buffer_;
  std::vector<UniqueFd> frame_fds_;  // received with the frame being read
  std::deque<Outgoing> outgoing_;
  size_t queued_bytes_ = 0;  // in outgoing_, each with kQueuedFrameOverheadBytes
  size_t held_ = 0;          // as the hook last accepted
  IdlePolicy idle_policy_;
  asio::steady_timer timer_;
  absl::Time frame_started_ = absl::InfiniteFuture();  // first byte of a frame not yet complete
  int64_t frame_started_ns_ = 0;  // the same, CLOCK_MONOTONIC
  int64_t handled_frame_ns_ = 0;  // frame_started_ns_ of the frame last handed out
  absl::Time handled_frame_started_ = absl::InfiniteFuture();
  // A payload being received (ReceivePayload): what is left, where it goes (null: dropped).
  uint64_t payload_left_ = 0;
  uint8_t* payload_into_ = nullptr;
  std::shared_ptr<const void> payload_keep_;  // keeps payload_into_ valid
  PayloadDone payload_done_;
  absl::Time last_activity_;  // the last complete frame or reply (or Start)
  absl::Time closing_since_;  // CloseAfterWrites
  absl::Time armed_for_ = absl::InfiniteFuture();
  uint64_t timer_generation_ = 0;  // of the wait armed last
  bool writing_ = false;
  bool close_after_writes_ = false;
  absl::Status close_after_writes_why_;  // what on_close hears then
  bool closed_ = false;
};

}  // namespace pswitch::proto

#endif  // PSWITCH_PROTO_FRAMED_CONNECTION_H_
