#include "controller/worker_outbox.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"
#include "proto/frame_channel.h"

namespace pswitch::controller {
namespace {

struct Pair {
  UniqueFd ours, peer;
};
Pair SocketPair() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

// A peer that never reads: every Send still returns at once (the writer thread holds the
// backlog), the backlog's bound is enforced without queueing anything more, and UnsentSince says
// since when the peer has taken nothing.
TEST(WorkerOutboxTest, APeerThatNeverReadsNeverBlocksTheSenderAndTheBacklogIsBounded) {
  Pair sockets = SocketPair();
  WorkerOutbox outbox(sockets.ours.get(), OutboxLimits{.max_bytes = 16 << 20, .max_frames = 64});
  EXPECT_EQ(outbox.UnsentSince(), absl::InfiniteFuture());
  std::vector<uint8_t> frame(4 << 20, 0x5a);
  const absl::Time before = absl::Now();
  int accepted = 0;
  absl::Status refused;
  // The socket takes at most a few hundred kilobytes; the rest waits in the queue.
  for (int i = 0; i < 16; ++i) {
    absl::Status sent = outbox.Send(frame, -1);
    if (!sent.ok()) {
      refused = sent;
      break;
    }
    ++accepted;
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("has not taken its commands"), absl::string_view::npos);
  EXPECT_GE(accepted, 3);
  EXPECT_LE(outbox.queued_bytes(), size_t{16} << 20);
  const absl::Time stalled = outbox.UnsentSince();
  EXPECT_GE(stalled, before);
  EXPECT_LE(stalled, absl::Now());
  outbox.Close();  // returns although the writer is waiting on a full socket
  EXPECT_EQ(outbox.Send(frame, -1).code(), absl::StatusCode::kUnavailable);
}

// Frames go out in order, whole, each fd with its own frame; the outbox holds its own copy of a
// passed fd, so the caller may close its copy at once.
TEST(WorkerOutboxTest, FramesArriveInOrderWithTheirFdsAfterTheCallerClosedItsCopy) {
  Pair sockets = SocketPair();
  WorkerOutbox outbox(sockets.ours.get(), OutboxLimits());
  proto::FrameChannel peer{std::move(sockets.peer)};
  std::vector<uint8_t> big(2 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 13);
  const uint8_t small[] = {1, 2, 3};
  {
    UniqueFd memfd(::memfd_create("outbox-test", MFD_CLOEXEC));
    ASSERT_TRUE(memfd.valid());
    ASSERT_EQ(::write(memfd.get(), "region", 6), 6);
    ASSERT_TRUE(outbox.Send(big, -1).ok());
    ASSERT_TRUE(outbox.Send(small, memfd.get()).ok());
  }  // the caller's copy is closed before the frame can have been sent
  auto first = peer.Receive(absl::Seconds(10));
  auto second = peer.Receive(absl::Seconds(10));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->payload, big);
  EXPECT_FALSE(first->fd.valid());
  EXPECT_EQ(second->payload, std::vector<uint8_t>(small, small + 3));
  ASSERT_TRUE(second->fd.valid());
  char content[6];
  ASSERT_EQ(::pread(second->fd.get(), content, 6, 0), 6);
  EXPECT_EQ(std::memcmp(content, "region", 6), 0);
  // The writer drops a frame from its queue after its last byte went out, which may be after the
  // peer read it: nothing waits once it has (bounded: 10 s).
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (outbox.UnsentSince() != absl::InfiniteFuture() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(outbox.UnsentSince(), absl::InfiniteFuture());
}

// A frame bigger than the socket holds, with an fd: Send writes what the socket takes itself (the
// fd with the first byte) and the writer sends the rest; a frame sent after it waits its turn.
TEST(WorkerOutboxTest, AFrameTheSocketTakesInPartArrivesWholeWithItsFdAndInOrder) {
  Pair sockets = SocketPair();
  WorkerOutbox outbox(sockets.ours.get(), OutboxLimits());
  proto::FrameChannel peer{std::move(sockets.peer)};
  std::vector<uint8_t> big(8 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7 + 1);
  const uint8_t small[] = {9, 8, 7};
  {
    UniqueFd memfd(::memfd_create("outbox-test", MFD_CLOEXEC));
    ASSERT_TRUE(memfd.valid());
    ASSERT_EQ(::write(memfd.get(), "first", 5), 5);
    ASSERT_TRUE(outbox.Send(big, memfd.get()).ok());
    // The socket took part of it (it holds far less than 8 MiB): the rest is queued.
    EXPECT_GT(outbox.queued_bytes(), 0u);
    ASSERT_TRUE(outbox.Send(small, -1).ok());
  }
  auto first = peer.Receive(absl::Seconds(10));
  auto second = peer.Receive(absl::Seconds(10));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->payload, big);
  ASSERT_TRUE(first->fd.valid());
  char content[5];
  ASSERT_EQ(::pread(first->fd.get(), content, 5, 0), 5);
  EXPECT_EQ(std::memcmp(content, "first", 5), 0);
  EXPECT_EQ(second->payload, std::vector<uint8_t>(small, small + 3));
  EXPECT_FALSE(second->fd.valid());
}

// With nothing queued and room in the socket, a small command is in the socket when Send
// returns (written by the caller itself, not handed to the writer thread).
TEST(WorkerOutboxTest, ASmallCommandIsInTheSocketWhenSendReturns) {
  Pair sockets = SocketPair();
  WorkerOutbox outbox(sockets.ours.get(), OutboxLimits());
  const uint8_t small[] = {4, 5, 6, 7};
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(outbox.Send(small, -1).ok());
    EXPECT_EQ(outbox.queued_bytes(), 0u);
    uint8_t got[proto::kFrameHeaderBytes + sizeof(small)];
    // MSG_DONTWAIT: the bytes must already be there.
    ASSERT_EQ(::recv(sockets.peer.get(), got, sizeof(got), MSG_DONTWAIT | MSG_WAITALL),
              static_cast<ssize_t>(sizeof(got)));
    EXPECT_EQ(std::memcmp(got + proto::kFrameHeaderBytes, small, sizeof(small)), 0);
  }
}

}  // namespace
}  // namespace pswitch::controller
