#include "base/fd_message.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace pswitch::base {
namespace {

struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
    a = UniqueFd(fds[0]);
    b = UniqueFd(fds[1]);
  }
  UniqueFd a, b;
};

UniqueFd PipeReadEnd(const char* text) {
  int p[2];
  EXPECT_EQ(::pipe2(p, O_CLOEXEC), 0);
  EXPECT_EQ(::write(p[1], text, std::strlen(text)), static_cast<ssize_t>(std::strlen(text)));
  ::close(p[1]);
  return UniqueFd(p[0]);
}

TEST(FdMessageTest, AMessageArrivesWholeWithItsDescriptorsInOrder) {
  Pair pair;
  UniqueFd first = PipeReadEnd("one"), second = PipeReadEnd("two");
  const std::vector<int> fds = {first.get(), second.get()};
  ASSERT_TRUE(SendMessageWithFds(pair.a.get(), "{\"x\":1}", fds).ok());
  auto got = ReceiveMessageWithFds(pair.b.get(), 64, 2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bytes, "{\"x\":1}");
  ASSERT_EQ(got->fds.size(), 2u);
  char buf[4] = {};
  ASSERT_EQ(::read(got->fds[0].get(), buf, 3), 3);
  EXPECT_STREQ(buf, "one");
  ASSERT_EQ(::read(got->fds[1].get(), buf, 3), 3);
  EXPECT_STREQ(buf, "two");
  EXPECT_EQ(::fcntl(got->fds[0].get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

TEST(FdMessageTest, OversizedMessagesAndTooManyDescriptorsAreRefused) {
  Pair pair;
  ASSERT_TRUE(SendMessageWithFds(pair.a.get(), std::string(100, 'x'), {}).ok());
  EXPECT_EQ(ReceiveMessageWithFds(pair.b.get(), 64, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  UniqueFd one = PipeReadEnd("1"), two = PipeReadEnd("2");
  const std::vector<int> fds = {one.get(), two.get()};
  ASSERT_TRUE(SendMessageWithFds(pair.a.get(), "m", fds).ok());
  EXPECT_EQ(ReceiveMessageWithFds(pair.b.get(), 64, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int> bad = {-1};
  EXPECT_EQ(SendMessageWithFds(pair.a.get(), "m", bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SendMessageWithFds(pair.a.get(), "", {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(FdMessageTest, APeerThatHasGoneIsSaidOnBothSides) {
  Pair pair;
  pair.a.Reset();
  EXPECT_EQ(ReceiveMessageWithFds(pair.b.get(), 64, 0).status().code(),
            absl::StatusCode::kCancelled);
  // No SIGPIPE: the sender hears it as a status.
  EXPECT_EQ(SendMessageWithFds(pair.b.get(), "m", {}).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pswitch::base
