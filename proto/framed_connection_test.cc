#include "proto/framed_connection.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/accept_retry.h"
#include "proto/frame_channel.h"
#include "proto/framing.h"
#include "proto/memdaemon_generated.h"
#include "proto/wire_status.h"

namespace pswitch::proto {
namespace {

std::vector<uint8_t> Finish(flatbuffers::FlatBufferBuilder& b) {
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

std::vector<uint8_t> ErrorReply(const absl::Status& status) {
  flatbuffers::FlatBufferBuilder b;
  auto error = CreateWireError(b, status);
  proto::Finish(b, CreateMemReply(b, 0, MemReplyBody::Error, error.Union()));
  return Finish(b);
}

// A tiny lease server: answers RequestLease with LeaseGranted{offset = bytes}.
class LeaseServer {
 public:
  LeaseServer()
      : dir_(std::filesystem::temp_directory_path() / ("pswitch-fc-" + std::to_string(::getpid()))),
        acceptor_(io_) {
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "s.sock").string();
    asio::local::stream_protocol::endpoint endpoint(path_);
    acceptor_.open(endpoint.protocol());
    acceptor_.bind(endpoint);
    acceptor_.listen();
    Accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~LeaseServer() {
    io_.stop();
    thread_.join();
    (void)base::RemoveTree(dir_);
  }
  const std::string& path() const { return path_; }
  int closed_with_error() const { return closed_with_error_.load(); }

 private:
  void Accept() {
    acceptor_.async_accept(
        [this](const asio::error_code& ec, asio::local::stream_protocol::socket socket) {
          if (ec) return;
          FramedConnection::Socket generic(
              io_, asio::generic::stream_protocol(AF_UNIX, SOCK_STREAM), socket.release());
          auto conn = FramedConnection::Create(
              std::move(generic), ConnectionLimits{.max_frame_bytes = 4096},
              [](FramedConnection& c, std::vector<uint8_t> payload) {
                auto request = VerifyPayload<MemRequest>(payload, "memdaemon request");
                if (!request.ok()) {
                  c.Reject(ErrorReply(request.status()));
                  return;
                }
                flatbuffers::FlatBufferBuilder b;
                auto lease = (*request)->body_as_RequestLease();
                uint64_t bytes = lease != nullptr ? lease->bytes() : 0;
                auto granted = CreateLeaseGranted(b, bytes, bytes);
                proto::Finish(b, CreateMemReply(b, (*request)->request_id(),
                                                MemReplyBody::LeaseGranted, granted.Union()));
                c.Send(Finish(b));
              },
              ErrorReply,
              [this](FramedConnection&, const absl::Status& why) {
                if (!why.ok()) closed_with_error_++;
              });
          conn->Start();
          Accept();
        });
  }

  std::filesystem::path dir_;
  std::string path_;
  asio::io_context io_;
  asio::local::stream_protocol::acceptor acceptor_;
  std::thread thread_;
  std::atomic<int> closed_with_error_{0};
};

absl::StatusOr<const MemReply*> Ask(FrameChannel& channel, uint64_t bytes, ReceivedFrame* frame) {
  flatbuffers::FlatBufferBuilder b;
  auto lease = CreateRequestLease(b, b.CreateString("t"), bytes);
  proto::Finish(b, CreateMemRequest(b, bytes, MemRequestBody::RequestLease, lease.Union()));
  if (auto s = channel.Send(b); !s.ok()) return s;
  auto received = channel.Receive(absl::Seconds(10));
  if (!received.ok()) return received.status();
  *frame = std::move(*received);
  return VerifyPayload<MemReply>(frame->payload, "memdaemon reply");
}

TEST(FramedConnectionTest, BadFrameGetsErrorReplyAndClosesOnlyThatConnection) {
  LeaseServer server;
  auto good = FrameChannel::Connect(server.path());
  auto bad = FrameChannel::Connect(server.path());
  ASSERT_TRUE(good.ok() && bad.ok());

  ReceivedFrame frame;
  auto reply = Ask(**good, 4096, &frame);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ((*reply)->body_as_LeaseGranted()->bytes(), 4096u);

  // A well-framed payload that is not a FlatBuffer.
  const uint8_t junk[] = {0xde, 0xad, 0xbe, 0xef, 0x01, 0x02, 0x03, 0x04};
  ASSERT_TRUE((*bad)->Send(junk).ok());
  auto error_frame = (*bad)->Receive(absl::Seconds(10));
  ASSERT_TRUE(error_frame.ok()) << error_frame.status();
  auto error = VerifyPayload<MemReply>(error_frame->payload, "memdaemon reply");
  ASSERT_TRUE(error.ok());
  ASSERT_EQ((*error)->body_type(), MemReplyBody::Error);
  EXPECT_EQ(FromWireError((*error)->body_as_Error()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*bad)->Receive(absl::Seconds(10)).status().code(), absl::StatusCode::kUnavailable);

  // The other connection is untouched.
  auto again = Ask(**good, 128, &frame);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->body_as_LeaseGranted()->bytes(), 128u);
  EXPECT_EQ(server.closed_with_error(), 1);
}

TEST(FramedConnectionTest, OversizeLengthPrefixGetsErrorReply) {
  LeaseServer server;
  auto raw = FrameChannel::Connect(server.path());
  ASSERT_TRUE(raw.ok());
  const uint8_t header[4] = {0xff, 0xff, 0xff, 0x0f};
  ASSERT_EQ(::write((*raw)->fd(), header, 4), 4);
  auto error_frame = (*raw)->Receive(absl::Seconds(10));
  ASSERT_TRUE(error_frame.ok()) << error_frame.status();
  auto error = VerifyPayload<MemReply>(error_frame->payload, "memdaemon reply");
  ASSERT_TRUE(error.ok());
  auto status = FromWireError((*error)->body_as_Error());
  EXPECT_NE(status.message().find("exceeds the maximum"), absl::string_view::npos) << status;
  EXPECT_EQ((*raw)->Receive(absl::Seconds(10)).status().code(), absl::StatusCode::kUnavailable);
}

// Graceful shutdown: what was queued reaches the peer, then the connection closes.
TEST(FramedConnectionTest, CloseAfterWritesDeliversQueuedFramesFirst) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  FrameChannel peer{UniqueFd(fds[1])};
  asio::io_context io;
  absl::Status closed_with = absl::UnknownError("not closed");
  auto conn = FramedConnection::Create(
      FramedConnection::Socket(io, asio::generic::stream_protocol(AF_UNIX, SOCK_STREAM), fds[0]),
      ConnectionLimits{.max_frame_bytes = 1 << 20}, [](FramedConnection&, std::vector<uint8_t>) {},
      ErrorReply, [&](FramedConnection&, const absl::Status& why) { closed_with = why; });
  conn->Start();
  // Large enough that the writes cannot all complete in one go.
  const std::vector<uint8_t> first(600 << 10, 1), second(600 << 10, 2);
  conn->Send(first);
  conn->Send(second);
  conn->CloseAfterWrites();
  EXPECT_FALSE(conn->closed());
  std::thread loop([&] { io.run(); });
  auto a = peer.Receive(absl::Seconds(10));
  auto b = peer.Receive(absl::Seconds(10));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(a->payload, first);
  EXPECT_EQ(b->payload, second);
  EXPECT_EQ(peer.Receive(absl::Seconds(10)).status().code(), absl::StatusCode::kUnavailable);
  loop.join();  // nothing left to do once closed: the loop runs dry
  EXPECT_TRUE(closed_with.ok()) << closed_with;
}

// One FramedConnection over a socketpair, served on its own event-loop thread: the test holds
// the raw peer end. Frames are echoed back.
class Served {
 public:
  explicit Served(ConnectionLimits limits, FramedConnection::IdlePolicy idle = nullptr) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    peer_ = UniqueFd(fds[1]);
    conn_ = FramedConnection::Create(
        FramedConnection::Socket(io_, asio::generic::stream_protocol(AF_UNIX, SOCK_STREAM), fds[0]),
        std::move(limits),
        [](FramedConnection& c, std::vector<uint8_t> payload) { c.Send(std::move(payload)); },
        ErrorReply,
        [this](FramedConnection&, const absl::Status& why) {
          closed_with_ = why;
          closed_.Notify();
        });
    if (idle) conn_->SetIdlePolicy(std::move(idle));
    conn_->Start();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~Served() {
    peer_.Reset();
    if (!closed_.WaitForNotificationWithTimeout(absl::Seconds(20))) io_.stop();
    thread_.join();
  }
  int peer() const { return peer_.get(); }
  FramedConnection& conn() { return *conn_; }
  asio::io_context& io() { return io_; }
  // The reason the connection closed, once it has (nullopt: still open after `wait`).
  std::optional<absl::Status> ClosedWithin(absl::Duration wait) {
    if (!closed_.WaitForNotificationWithTimeout(wait)) return std::nullopt;
    return closed_with_;
  }

 private:
  asio::io_context io_;
  UniqueFd peer_;
  std::shared_ptr<FramedConnection> conn_;
  absl::Notification closed_;
  absl::Status closed_with_;
  std::thread thread_;
};

void WriteAll(int fd, const std::vector<uint8_t>& bytes) {
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

std::vector<uint8_t> Header(uint32_t length) {
  return {static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
          static_cast<uint8_t>(length >> 16), static_cast<uint8_t>(length >> 24)};
}

// Trust-boundary issue, item 6: a client sending one byte every 100 ms held its connection (and
// the buffer of its announced frame) for ever. A frame begun must be whole within the timeout.
TEST(ConnectionLimitsTest, ASlowSenderIsCutAtTheFrameTimeout) {
  Served served(
      ConnectionLimits{.max_frame_bytes = 4096, .frame_timeout = absl::Milliseconds(300)});
  WriteAll(served.peer(), Header(100));
  const absl::Time start = absl::Now();
  std::optional<absl::Status> closed;
  for (int i = 0; i < 100 && !closed; ++i) {
    const uint8_t byte = 1;
    if (::send(served.peer(), &byte, 1, MSG_NOSIGNAL) != 1) break;  // already closed
    closed = served.ClosedWithin(absl::Milliseconds(50));
  }
  if (!closed) closed = served.ClosedWithin(absl::Seconds(10));
  ASSERT_TRUE(closed.has_value()) << "still open after trickling 100 bytes";
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  // The peer is told why before the close.
  FrameChannel peer{UniqueFd(::dup(served.peer()))};
  auto error_frame = peer.Receive(absl::Seconds(5));
  ASSERT_TRUE(error_frame.ok()) << error_frame.status();
  auto error = VerifyPayload<MemReply>(error_frame->payload, "reply");
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(FromWireError((*error)->body_as_Error()).code(), absl::StatusCode::kDeadlineExceeded);
}

// A connection is closed once idle for what its policy allows, and never while the policy says
// the peer awaits an answer; frames keep it alive.
TEST(ConnectionLimitsTest, AnIdleConnectionIsClosedUnlessItsPeerAwaitsAnAnswer) {
  std::atomic<bool> awaiting{true};
  Served served(ConnectionLimits{.max_frame_bytes = 4096}, [&awaiting] {
    return awaiting.load() ? absl::InfiniteDuration() : absl::Milliseconds(200);
  });
  EXPECT_FALSE(served.ClosedWithin(absl::Milliseconds(600)).has_value());
  // The policy changes with a reply (here: an echoed frame), after which idling counts.
  awaiting = false;
  FrameChannel peer{UniqueFd(::dup(served.peer()))};
  const uint8_t ping[] = {1, 2, 3};
  ASSERT_TRUE(peer.Send(ping).ok());
  ASSERT_TRUE(peer.Receive(absl::Seconds(5)).ok());
  std::optional<absl::Status> closed = served.ClosedWithin(absl::Seconds(10));
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->code(), absl::StatusCode::kDeadlineExceeded) << *closed;
}

// A bound shared by several connections, as a server's byte budget is: each connection's hook
// reports what it holds, and growth beyond the limit is refused.
class SharedBound {
 public:
  explicit SharedBound(size_t limit) : limit_(limit) {}
  HeldBytesHook Hook() {
    auto mine = std::make_shared<size_t>(0);
    return [this, mine](size_t held) {
      absl::MutexLock lock(&mu_);
      if (held > *mine && held - *mine > limit_ - used_) {
        return absl::ResourceExhaustedError(absl::StrCat("over the bound of ", limit_));
      }
      used_ = used_ - *mine + held;
      *mine = held;
      return absl::OkStatus();
    };
  }
  size_t used() const {
    absl::MutexLock lock(&mu_);
    return used_;
  }
  // Waits until used() is `bytes` (the connections' threads report asynchronously).
  bool Reaches(size_t bytes) const {
    for (int i = 0; i < 5000; ++i) {
      if (used() == bytes) return true;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return false;
  }

 private:
  const size_t limit_;
  mutable absl::Mutex mu_;
  size_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

// Trust-boundary issue, item 6: 16 connections each holding 48 MiB of a 60 MiB frame raised RSS
// by 841 MiB. Incomplete frames are reported to the server's bound: the connection that would
// exceed it is refused and closed, the others go on, and closing gives the bytes back.
TEST(ConnectionLimitsTest, IncompleteFramesShareOneBound) {
  SharedBound bound(1000);
  Served a(ConnectionLimits{.max_frame_bytes = 4096, .held_bytes = bound.Hook()});
  Served b(ConnectionLimits{.max_frame_bytes = 4096, .held_bytes = bound.Hook()});
  WriteAll(a.peer(), Header(900));
  WriteAll(a.peer(), std::vector<uint8_t>(600, 7));
  // a's 604 bytes are charged before b's arrive (the loops run independently).
  ASSERT_TRUE(bound.Reaches(604));
  WriteAll(b.peer(), Header(900));
  WriteAll(b.peer(), std::vector<uint8_t>(600, 7));
  std::optional<absl::Status> refused = b.ClosedWithin(absl::Seconds(10));
  ASSERT_TRUE(refused.has_value());
  FrameChannel b_peer{UniqueFd(::dup(b.peer()))};
  auto error_frame = b_peer.Receive(absl::Seconds(5));
  ASSERT_TRUE(error_frame.ok()) << error_frame.status();
  auto error = VerifyPayload<MemReply>(error_frame->payload, "reply");
  ASSERT_TRUE(error.ok());
  const absl::Status reason = FromWireError((*error)->body_as_Error());
  EXPECT_EQ(reason.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reason.message(), "over the bound of 1000");
  // a completes its frame and is answered; nothing stays charged.
  WriteAll(a.peer(), std::vector<uint8_t>(300, 7));
  FrameChannel a_peer{UniqueFd(::dup(a.peer()))};
  auto echoed = a_peer.Receive(absl::Seconds(5));
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  EXPECT_EQ(echoed->payload.size(), 900u);
  // Released just after the echo went out, on the connection's thread.
  EXPECT_TRUE(bound.Reaches(0)) << bound.used();
}

// Issue 27, item 7: replies a peer did not read were bounded per connection only (six such
// connections held 1.46 GB). Queued replies count against the same bound as incomplete frames:
// the reply that does not fit closes its connection with the reason, and the close gives back
// everything the connection held.
TEST(ConnectionLimitsTest, QueuedRepliesCountAgainstTheSharedBound) {
  SharedBound bound(4 << 20);
  Served held(ConnectionLimits{.max_frame_bytes = 2 << 20, .held_bytes = bound.Hook()});
  Served flooded(ConnectionLimits{.max_frame_bytes = 2 << 20, .held_bytes = bound.Hook()});
  // 1 MiB held by the first connection (its peer reads nothing either).
  asio::post(held.io(), [&held] { held.conn().Send(std::vector<uint8_t>(1 << 20, 1)); });
  ASSERT_TRUE(bound.Reaches((1 << 20) + kFrameHeaderBytes + kQueuedFrameOverheadBytes));
  // The second floods 64 replies of 128 KiB (8 MiB), with no queue limit of its own.
  asio::post(flooded.io(), [&flooded] {
    for (int i = 0; i < 64; ++i) flooded.conn().Send(std::vector<uint8_t>(128 << 10, 1));
  });
  std::optional<absl::Status> closed = flooded.ClosedWithin(absl::Seconds(10));
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->code(), absl::StatusCode::kResourceExhausted) << *closed;
  EXPECT_THAT(std::string(closed->message()), ::testing::HasSubstr("over the bound"));
  // Everything the closed connection held is back; the first still holds its reply.
  EXPECT_TRUE(bound.Reaches((1 << 20) + kFrameHeaderBytes + kQueuedFrameOverheadBytes))
      << bound.used();
  EXPECT_FALSE(held.ClosedWithin(absl::ZeroDuration()).has_value());
}

// Replies queued for a peer that never reads them are bounded: past the bound the connection
// is closed rather than holding every reply in memory.
TEST(ConnectionLimitsTest, RepliesAPeerDoesNotReadAreBounded) {
  Served served(ConnectionLimits{.max_frame_bytes = 1 << 20, .max_queued_bytes = 1 << 20});
  asio::post(served.io(), [&served] {
    for (int i = 0; i < 64; ++i) served.conn().Send(std::vector<uint8_t>(128 << 10, 1));
  });
  std::optional<absl::Status> closed = served.ClosedWithin(absl::Seconds(10));
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->code(), absl::StatusCode::kResourceExhausted) << *closed;
}

TEST(AcceptAgainLaterTest, RetriesATransientFailureButNotAClosedAcceptor) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::tcp::v4(), 0));
  int accepts = 0;
  const auto started = std::chrono::steady_clock::now();
  AcceptAgainLater(acceptor, asio::error::no_descriptors, "test", [&] { ++accepts; });
  AcceptAgainLater(acceptor, asio::error::operation_aborted, "test", [&] { accepts += 100; });
  io.run();
  EXPECT_EQ(accepts, 1);
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(90));

  acceptor.close();
  io.restart();
  AcceptAgainLater(acceptor, asio::error::no_descriptors, "test", [&] { ++accepts; });
  io.run();
  EXPECT_EQ(accepts, 1);
}

// Sends `bytes` with `fds` attached (SCM_RIGHTS) in one sendmsg.
void SendWithFds(int sock, const std::vector<uint8_t>& bytes, const std::vector<int>& fds) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(fds.size() * sizeof(int)));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  ASSERT_EQ(::sendmsg(sock, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

// A frame of `size` bytes (framed), each byte `tag`.
std::vector<uint8_t> TaggedFrame(uint8_t tag, uint32_t size) {
  std::vector<uint8_t> frame = Header(size);
  frame.insert(frame.end(), size, tag);
  return frame;
}

// A memory file of `bytes` bytes: its size names it when it comes back.
UniqueFd MemFileOfSize(size_t bytes) {
  UniqueFd fd(::memfd_create("framed-connection-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  return fd;
}

size_t OpenFdCount() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}

// A connection that takes fds with its frames, recording each frame's tag and the sizes of the
// files that came with it; every frame is answered with an empty-ish reply.
class FdReceiver {
 public:
  explicit FdReceiver(size_t max_fds) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    peer_ = UniqueFd(fds[1]);
    conn_ = FramedConnection::Create(
        FramedConnection::Socket(io_, asio::generic::stream_protocol(AF_UNIX, SOCK_STREAM), fds[0]),
        ConnectionLimits{.max_frame_bytes = 1 << 20, .max_fds_per_frame = max_fds},
        [this](FramedConnection& c, std::vector<uint8_t> payload, std::vector<UniqueFd> files) {
          std::vector<off_t> sizes;
          for (const UniqueFd& f : files) {
            struct stat st;
            sizes.push_back(::fstat(f.get(), &st) == 0 ? st.st_size : -1);
          }
          {
            absl::MutexLock lock(&mu_);
            frames_.emplace_back(payload.empty() ? 0 : payload[0], std::move(sizes));
          }
          c.Send(std::vector<uint8_t>{payload[0]});
        },
        ErrorReply,
        [this](FramedConnection&, const absl::Status& why) {
          closed_with_ = why;
          closed_.Notify();
        });
    conn_->Start();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~FdReceiver() {
    peer_.Reset();
    if (!closed_.WaitForNotificationWithTimeout(absl::Seconds(20))) io_.stop();
    thread_.join();
  }
  int peer() const { return peer_.get(); }
  // Waits (bounded) for `n` frames and returns them.
  std::vector<std::pair<uint8_t, std::vector<off_t>>> Frames(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return frames_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return frames_;
  }
  std::optional<absl::Status> ClosedWithin(absl::Duration wait) {
    if (!closed_.WaitForNotificationWithTimeout(wait)) return std::nullopt;
    return closed_with_;
  }

 private:
  asio::io_context io_;
  UniqueFd peer_;
  std::shared_ptr<FramedConnection> conn_;
  absl::Mutex mu_;
  std::vector<std::pair<uint8_t, std::vector<off_t>>> frames_ ABSL_GUARDED_BY(mu_);
  absl::Notification closed_;
  absl::Status closed_with_;
  std::thread thread_;
};

// Issue 26: areas and files travel as fds with their frame. Three frames in two sendmsgs (the
// first carrying two frames' bytes and two files, the second one frame with one file): each
// frame gets exactly the files sent with its first byte, never its neighbour's.
TEST(FramedConnectionFdsTest, FilesArriveWithTheFrameTheyWereSentWith) {
  FdReceiver receiver(/*max_fds=*/4);
  UniqueFd a = MemFileOfSize(111), b = MemFileOfSize(222), c = MemFileOfSize(333);
  std::vector<uint8_t> first = TaggedFrame(1, 100);
  std::vector<uint8_t> second = TaggedFrame(2, 70000);  // more than one read buffer
  first.insert(first.end(), second.begin(), second.end());
  SendWithFds(receiver.peer(), first, {a.get(), b.get()});
  SendWithFds(receiver.peer(), TaggedFrame(3, 5), {c.get()});
  auto frames = receiver.Frames(3);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].first, 1);
  EXPECT_THAT(frames[0].second, ::testing::ElementsAre(111, 222));
  EXPECT_EQ(frames[1].first, 2);
  EXPECT_TRUE(frames[1].second.empty());
  EXPECT_EQ(frames[2].first, 3);
  EXPECT_THAT(frames[2].second, ::testing::ElementsAre(333));
  // Each reply came back; the connection is still open.
  uint8_t replies[3 * 5];
  size_t got = 0;
  while (got < sizeof(replies)) {
    const ssize_t n = ::read(receiver.peer(), replies + got, sizeof(replies) - got);
    ASSERT_GT(n, 0);
    got += static_cast<size_t>(n);
  }
  EXPECT_FALSE(receiver.ClosedWithin(absl::ZeroDuration()).has_value());
}

// More files than a frame may carry: an error reply, the connection closed, and none of the
// files kept open here (the kernel drops what does not fit, the connection closes the rest).
TEST(FramedConnectionFdsTest, TooManyFilesCloseTheConnectionAndLeakNone) {
  std::vector<UniqueFd> files;
  std::vector<int> raw;
  for (int i = 0; i < 6; ++i) {
    files.push_back(MemFileOfSize(10 + i));
    raw.push_back(files.back().get());
  }
  const size_t before = OpenFdCount();
  {
    FdReceiver receiver(/*max_fds=*/2);
    const size_t with_receiver = OpenFdCount();
    SendWithFds(receiver.peer(), TaggedFrame(9, 8), raw);
    std::optional<absl::Status> closed = receiver.ClosedWithin(absl::Seconds(10));
    ASSERT_TRUE(closed.has_value());
    EXPECT_FALSE(closed->ok());
    EXPECT_TRUE(receiver.Frames(0).empty());
    // The error reply came back before the close.
    std::vector<uint8_t> reply(4096);
    EXPECT_GT(::read(receiver.peer(), reply.data(), reply.size()), 4);
    // Only the test's peer end stays (the served end is closed).
    EXPECT_EQ(OpenFdCount(), with_receiver - 1);
  }
  EXPECT_EQ(OpenFdCount(), before);
}

// A connection that does not take fds (TCP, or a Unix peer that must not pass any) never keeps
// one: the kernel closes files sent to a plain read.
TEST(FramedConnectionFdsTest, AConnectionWithoutFdsKeepsNone) {
  UniqueFd file = MemFileOfSize(5);
  const size_t before = OpenFdCount();
  {
    FdReceiver receiver(/*max_fds=*/0);
    const size_t with_receiver = OpenFdCount();
    SendWithFds(receiver.peer(), TaggedFrame(4, 8), {file.get()});
    auto frames = receiver.Frames(1);
    ASSERT_EQ(frames.size(), 1u);
    EXPECT_TRUE(frames[0].second.empty());
    EXPECT_EQ(OpenFdCount(), with_receiver);
  }
  EXPECT_EQ(OpenFdCount(), before);
}

}  // namespace
}  // namespace pswitch::proto

namespace pswitch::proto {
namespace {

// A frame of 9 bytes announces a raw payload: 8 bytes of its length, then 1 to receive it into
// a buffer (answered with a one-byte frame followed by the same bytes as a raw payload, from
// that buffer) or 0 to drop it (answered with a frame "dropped"). Any other frame is echoed.
class PayloadServed {
 public:
  explicit PayloadServed(ConnectionLimits limits) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    peer_ = std::make_unique<FrameChannel>(UniqueFd(fds[1]));
    conn_ = FramedConnection::Create(
        FramedConnection::Socket(io_, asio::generic::stream_protocol(AF_UNIX, SOCK_STREAM), fds[0]),
        std::move(limits),
        [this](FramedConnection& c, std::vector<uint8_t> frame) { Handle(c, std::move(frame)); },
        ErrorReply,
        [this](FramedConnection&, const absl::Status& why) {
          closed_with_ = why;
          closed_.Notify();
        });
    conn_->Start();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~PayloadServed() {
    ::shutdown(peer_->fd(), SHUT_RDWR);
    if (!closed_.WaitForNotificationWithTimeout(absl::Seconds(20))) io_.stop();
    thread_.join();
  }
  FrameChannel& peer() { return *peer_; }
  std::optional<absl::Status> ClosedWithin(absl::Duration wait) {
    if (!closed_.WaitForNotificationWithTimeout(wait)) return std::nullopt;
    return closed_with_;
  }
  // The last payload buffer, while anything (a read, a reply) still holds it.
  std::weak_ptr<std::vector<uint8_t>> last_buffer() {
    absl::MutexLock lock(&mu_);
    return last_buffer_;
  }
  std::optional<absl::Status> payload_failure() {
    absl::MutexLock lock(&mu_);
    return payload_failure_;
  }

  static std::vector<uint8_t> Announce(uint64_t bytes, bool keep) {
    std::vector<uint8_t> frame(9);
    std::memcpy(frame.data(), &bytes, 8);
    frame[8] = keep ? 1 : 0;
    return frame;
  }

 private:
  void Handle(FramedConnection& c, std::vector<uint8_t> frame) {
    if (frame.size() != 9) return c.Send(std::move(frame));
    uint64_t bytes;
    std::memcpy(&bytes, frame.data(), 8);
    if (frame[8] == 0) {
      absl::Status s = c.ReceivePayload(bytes, nullptr, nullptr,
                                        [](FramedConnection& c, const absl::Status& got) {
                                          if (got.ok()) c.Send({'d', 'r', 'o', 'p', 'p', 'e', 'd'});
                                        });
      if (!s.ok()) c.Reject(ErrorReply(s));
      return;
    }
    auto buffer = std::make_shared<std::vector<uint8_t>>(bytes);
    {
      absl::MutexLock lock(&mu_);
      last_buffer_ = buffer;
    }
    absl::Status s = c.ReceivePayload(
        bytes, buffer->data(), buffer, [this, buffer](FramedConnection& c, const absl::Status& got) {
          if (!got.ok()) {
            absl::MutexLock lock(&mu_);
            payload_failure_ = got;
            return;
          }
          c.SendWithPayload({'r'}, *buffer, buffer);
        });
    if (!s.ok()) c.Reject(ErrorReply(s));
  }

  asio::io_context io_;
  std::unique_ptr<FrameChannel> peer_;
  std::shared_ptr<FramedConnection> conn_;
  absl::Notification closed_;
  absl::Status closed_with_;
  absl::Mutex mu_;
  std::weak_ptr<std::vector<uint8_t>> last_buffer_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> payload_failure_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

// Reads exactly `n` raw bytes from `fd` (FrameChannel never reads past a frame's end).
std::vector<uint8_t> ReadRaw(int fd, size_t n) {
  std::vector<uint8_t> out(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, out.data() + got, n - got, 0);
    if (r <= 0) return {};
    got += static_cast<size_t>(r);
  }
  return out;
}

TEST(FramedConnectionPayloadTest, APayloadIsReadIntoItsBufferAndTheStreamGoesOnAfterIt) {
  PayloadServed served(ConnectionLimits{.max_frame_bytes = 4096, .max_payload_bytes = 1 << 20});
  const std::vector<uint8_t> kept = Pattern(300'000, 1), dropped = Pattern(200'000, 2);
  const std::vector<uint8_t> echo = {'e', 'c', 'h', 'o'};
  // Everything at once, from another thread (more than the socket holds): frames and raw bytes
  // must be told apart by the announcements alone.
  std::thread writer([&] {
    auto send_frame = [&](const std::vector<uint8_t>& f) { ASSERT_TRUE(served.peer().Send(f).ok()); };
    send_frame(PayloadServed::Announce(kept.size(), true));
    ASSERT_TRUE(SendAllWithFd(served.peer().fd(), kept, -1).ok());
    send_frame(PayloadServed::Announce(dropped.size(), false));
    ASSERT_TRUE(SendAllWithFd(served.peer().fd(), dropped, -1).ok());
    send_frame(echo);
  });
  auto reply = served.peer().Receive(absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->payload, std::vector<uint8_t>{'r'});
  EXPECT_EQ(ReadRaw(served.peer().fd(), kept.size()), kept);  // sent from the buffer itself
  auto second = served.peer().Receive(absl::Seconds(10));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->payload, (std::vector<uint8_t>{'d', 'r', 'o', 'p', 'p', 'e', 'd'}));
  auto third = served.peer().Receive(absl::Seconds(10));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->payload, echo);
  writer.join();
  EXPECT_FALSE(served.ClosedWithin(absl::ZeroDuration()).has_value());
}

TEST(FramedConnectionPayloadTest, APayloadOverTheBoundIsRefused) {
  PayloadServed served(ConnectionLimits{.max_frame_bytes = 4096, .max_payload_bytes = 1000});
  ASSERT_TRUE(served.peer().Send(PayloadServed::Announce(1001, true)).ok());
  auto reply = served.peer().Receive(absl::Seconds(10));
  ASSERT_TRUE(reply.ok()) << reply.status();
  auto error = VerifyPayload<MemReply>(reply->payload, "reply");
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(FromWireError((*error)->body_as_Error()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(served.ClosedWithin(absl::Seconds(10)).has_value());
}

TEST(FramedConnectionPayloadTest, AStalledPayloadIsCutAtTheFrameDeadlineAndItsBufferLetGo) {
  PayloadServed served(ConnectionLimits{.max_frame_bytes = 4096,
                                        .frame_timeout = absl::Milliseconds(200),
                                        .max_payload_bytes = 1 << 20});
  ASSERT_TRUE(served.peer().Send(PayloadServed::Announce(100'000, true)).ok());
  ASSERT_TRUE(SendAllWithFd(served.peer().fd(), Pattern(1000, 3), -1).ok());
  auto cut = served.peer().Receive(absl::Seconds(10));
  ASSERT_TRUE(cut.ok()) << cut.status();
  auto error = VerifyPayload<MemReply>(cut->payload, "reply");
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(FromWireError((*error)->body_as_Error()).code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(served.ClosedWithin(absl::Seconds(10)).has_value());
  const std::optional<absl::Status> failure = served.payload_failure();
  ASSERT_TRUE(failure.has_value());
  EXPECT_FALSE(failure->ok());
  // Nothing holds the buffer once the connection has closed: no read can still land in it.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!served.last_buffer().expired() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(served.last_buffer().expired());
}

}  // namespace
}  // namespace pswitch::proto
