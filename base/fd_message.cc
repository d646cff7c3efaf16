#include "base/fd_message.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::base {

absl::Status SendMessageWithFds(int socket_fd, absl::string_view bytes, std::span<const int> fds,
                                bool wait) {
  if (bytes.empty()) return absl::InvalidArgumentError("an empty message");
  if (fds.size() > kMaxMessageFds) {
    return absl::InvalidArgumentError(
        absl::StrCat(fds.size(), " descriptors in one message; at most ", kMaxMessageFds));
  }
  for (int fd : fds) {
    if (fd < 0) return absl::InvalidArgumentError("a negative descriptor in a message");
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  while ((n = ::sendmsg(socket_fd, &msg, MSG_NOSIGNAL | (wait ? 0 : MSG_DONTWAIT))) < 0 &&
         errno == EINTR) {
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return absl::UnavailableError("the socket's buffer is full");
  }
  if (n < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)) {
    return absl::FailedPreconditionError("the peer has gone");
  }
  if (n < 0) return ErrnoStatus("sendmsg");
  if (static_cast<size_t>(n) != bytes.size()) {
    return absl::InternalError(absl::StrCat("sendmsg sent ", n, " of ", bytes.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MessageWithFds> ReceiveMessageWithFds(int socket_fd, size_t max_bytes,
                                                     size_t max_fds) {
  MessageWithFds message;
  message.bytes.resize(max_bytes + 1);  // one more: a longer message shows as truncated
  iovec iov{message.bytes.data(), message.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxMessageFds)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  while ((n = ::recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  if (n < 0) return ErrnoStatus("recvmsg");
  // Every descriptor that came is owned before anything is judged, so none leaks.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      message.fds.emplace_back(fd);
    }
  }
  if (n == 0 && message.fds.empty()) return absl::CancelledError("the peer closed the socket");
  if (static_cast<size_t>(n) > max_bytes || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a message over ", max_bytes, " bytes or ", kMaxMessageFds, " descriptors"));
  }
  if (message.fds.size() > max_fds) {
    return absl::InvalidArgumentError(
        absl::StrCat("a message with ", message.fds.size(), " descriptors; at most ", max_fds));
  }
  message.bytes.resize(static_cast<size_t>(n));
  return message;
}

}  // namespace pswitch::base
