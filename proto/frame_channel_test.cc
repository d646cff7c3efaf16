#include "proto/frame_channel.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"

namespace pswitch::proto {
namespace {

std::pair<std::unique_ptr<FrameChannel>, std::unique_ptr<FrameChannel>> Pair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  return {std::make_unique<FrameChannel>(UniqueFd(fds[0])),
          std::make_unique<FrameChannel>(UniqueFd(fds[1]))};
}

TEST(FrameChannelTest, PassesAnFdWithItsFrame) {
  auto [a, b] = Pair();
  UniqueFd memfd(::memfd_create("frame-channel-test", MFD_CLOEXEC));
  ASSERT_TRUE(memfd.valid());
  ASSERT_EQ(::write(memfd.get(), "arena", 5), 5);

  const uint8_t first[] = {1, 2, 3};
  const uint8_t second[] = {9, 8, 7, 6};
  ASSERT_TRUE(a->Send(first).ok());
  ASSERT_TRUE(a->Send(second, memfd.get()).ok());

  auto f1 = b->Receive(absl::Seconds(5));
  ASSERT_TRUE(f1.ok()) << f1.status();
  EXPECT_EQ(f1->payload, std::vector<uint8_t>(first, first + 3));
  EXPECT_FALSE(f1->fd.valid());
  auto f2 = b->Receive(absl::Seconds(5));
  ASSERT_TRUE(f2.ok()) << f2.status();
  EXPECT_EQ(f2->payload.size(), 4u);
  ASSERT_TRUE(f2->fd.valid());
  EXPECT_NE(f2->fd.get(), memfd.get());
  char content[5];
  ASSERT_EQ(::pread(f2->fd.get(), content, 5, 0), 5);
  EXPECT_EQ(std::memcmp(content, "arena", 5), 0);
}

TEST(FrameChannelTest, ReportsPeerCloseAndTimeout) {
  auto [a, b] = Pair();
  auto timed_out = b->Receive(absl::Milliseconds(20));
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded);
  a.reset();
  EXPECT_EQ(b->Receive(absl::Seconds(5)).status().code(), absl::StatusCode::kUnavailable);
}

TEST(FrameChannelTest, OversizeLengthPrefixIsAnError) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  UniqueFd raw(fds[0]);
  FrameChannel channel(UniqueFd(fds[1]), /*max_frame_bytes=*/1024);
  const uint8_t header[4] = {0x00, 0x10, 0x00, 0x00};  // 4096 bytes
  ASSERT_EQ(::write(raw.get(), header, 4), 4);
  EXPECT_EQ(channel.Receive(absl::Seconds(5)).status().code(), absl::StatusCode::kInvalidArgument);
}

// Header and payload go out as one scatter-gather message: what the peer reads is exactly the
// encoded frame, and a large frame's fd arrives with it, not with the small frame after it.
TEST(FrameChannelTest, ScatterGatherFramesMatchTheEncodingAndKeepTheirFd) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  UniqueFd sender(fds[0]);
  FrameChannel receiver{UniqueFd(fds[1])};
  std::vector<uint8_t> big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7 + (i >> 16));
  const uint8_t small[] = {5, 6, 7};
  UniqueFd memfd(::memfd_create("scatter-gather-test", MFD_CLOEXEC));
  ASSERT_TRUE(memfd.valid());
  // The socket holds less than the frame: the sender thread loops on partial writes while this
  // one receives.
  std::thread writer([&] {
    EXPECT_TRUE(SendFrameWithFd(sender.get(), big, memfd.get()).ok());
    EXPECT_TRUE(SendFrameWithFd(sender.get(), small, -1).ok());
  });
  auto first = receiver.Receive(absl::Seconds(10));
  auto second = receiver.Receive(absl::Seconds(10));
  writer.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->payload, big);
  EXPECT_TRUE(first->fd.valid());
  EXPECT_EQ(second->payload, std::vector<uint8_t>(small, small + 3));
  EXPECT_FALSE(second->fd.valid());
  // Recycled, the big payload's memory takes the next large frame.
  const uint8_t* memory = first->payload.data();
  receiver.Recycle(std::move(first->payload));
  std::thread again([&] { EXPECT_TRUE(SendFrameWithFd(sender.get(), big, -1).ok()); });
  auto third = receiver.Receive(absl::Seconds(10));
  again.join();
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->payload.data(), memory);
  EXPECT_EQ(third->payload, big);
}

// SendPartsOnce never blocks: on a full socket it returns 0, and resuming at an offset sends the
// rest of the parts exactly once.
TEST(FrameChannelTest, SendPartsOnceResumesAtAnOffsetWithoutBlocking) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  UniqueFd a(fds[0]), b(fds[1]);
  std::vector<uint8_t> head = {1, 2, 3, 4}, body(8 << 20, 0xab);
  const std::span<const uint8_t> parts[] = {head, body};
  size_t sent = 0;
  while (true) {
    auto n = SendPartsOnce(a.get(), parts, sent, -1);
    ASSERT_TRUE(n.ok()) << n.status();
    if (*n == 0) break;  // full: nobody reads b
    sent += *n;
  }
  ASSERT_GT(sent, 4u);
  ASSERT_LT(sent, head.size() + body.size());
  // Drain b while the rest goes out.
  std::vector<uint8_t> got;
  std::thread reader([&] {
    std::vector<uint8_t> buf(1 << 16);
    while (got.size() < head.size() + body.size()) {
      ssize_t r = ::read(b.get(), buf.data(), buf.size());
      if (r <= 0) break;
      got.insert(got.end(), buf.begin(), buf.begin() + r);
    }
  });
  while (sent < head.size() + body.size()) {
    auto n = SendPartsOnce(a.get(), parts, sent, -1);
    ASSERT_TRUE(n.ok());
    if (*n == 0) {
      pollfd pfd{a.get(), POLLOUT, 0};
      ::poll(&pfd, 1, 1000);
    }
    sent += *n;
  }
  reader.join();
  ASSERT_EQ(got.size(), head.size() + body.size());
  EXPECT_TRUE(std::equal(head.begin(), head.end(), got.begin()));
  EXPECT_TRUE(std::all_of(got.begin() + 4, got.end(), [](uint8_t v) { return v == 0xab; }));
}

TEST(FrameChannelTest, ConnectToMissingSocketNamesThePath) {
  auto channel = FrameChannel::Connect("/nonexistent/pswitch.sock");
  ASSERT_FALSE(channel.ok());
  EXPECT_NE(channel.status().message().find("/nonexistent/pswitch.sock"), absl::string_view::npos);
}

}  // namespace
}  // namespace pswitch::proto
