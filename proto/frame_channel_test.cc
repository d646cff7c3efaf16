#include "proto/frame_channel.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

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

TEST(FrameChannelTest, ConnectToMissingSocketNamesThePath) {
  auto channel = FrameChannel::Connect("/nonexistent/pswitch.sock");
  ASSERT_FALSE(channel.ok());
  EXPECT_NE(channel.status().message().find("/nonexistent/pswitch.sock"), absl::string_view::npos);
}

}  // namespace
}  // namespace pswitch::proto
