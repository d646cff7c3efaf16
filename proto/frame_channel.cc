#include "proto/frame_channel.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::proto {

absl::StatusOr<size_t> SendPartsOnce(int socket_fd, std::span<const std::span<const uint8_t>> parts,
                                     size_t offset, int fd_to_pass) {
  constexpr size_t kMaxParts = 8;
  iovec iov[kMaxParts];
  size_t count = 0, skip = offset;
  for (std::span<const uint8_t> part : parts) {
    if (skip >= part.size()) {
      skip -= part.size();
      continue;
    }
    if (count == kMaxParts) return absl::InvalidArgumentError("too many parts for one sendmsg");
    iov[count++] = iovec{const_cast<uint8_t*>(part.data() + skip), part.size() - skip};
    skip = 0;
  }
  if (count == 0) return 0;
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = count;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd_to_pass >= 0 && offset == 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd_to_pass, sizeof(int));
  }
  while (true) {
    const ssize_t n = ::sendmsg(socket_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return ErrnoStatus("sendmsg");
  }
}

namespace {

// Sends every byte of `parts`, waiting for the socket whenever it is full.
absl::Status SendAllParts(int socket_fd, std::span<const std::span<const uint8_t>> parts,
                          int fd_to_pass) {
  size_t total = 0;
  for (std::span<const uint8_t> part : parts) total += part.size();
  size_t sent = 0;
  while (sent < total) {
    PSWITCH_ASSIGN_OR_RETURN(size_t n, SendPartsOnce(socket_fd, parts, sent, fd_to_pass));
    if (n == 0) {
      pollfd pfd{socket_fd, POLLOUT, 0};
      ::poll(&pfd, 1, -1);
      continue;
    }
    sent += n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SendAllWithFd(int socket_fd, std::span<const uint8_t> bytes, int fd_to_pass) {
  const std::span<const uint8_t> parts[] = {bytes};
  return SendAllParts(socket_fd, parts, fd_to_pass);
}

absl::Status SendFrameWithFd(int socket_fd, std::span<const uint8_t> payload, int fd_to_pass,
                             uint32_t max_frame_bytes) {
  PSWITCH_ASSIGN_OR_RETURN(auto header, EncodeFrameHeader(payload.size(), max_frame_bytes));
  const std::span<const uint8_t> parts[] = {header, payload};
  return SendAllParts(socket_fd, parts, fd_to_pass);
}

FrameChannel::FrameChannel(UniqueFd socket, uint32_t max_frame_bytes)
    : socket_(std::move(socket)), decoder_(max_frame_bytes) {}

absl::StatusOr<std::unique_ptr<FrameChannel>> FrameChannel::Connect(absl::string_view path,
                                                                    uint32_t max_frame_bytes) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad Unix socket path '", path, "'"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket(AF_UNIX)");
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(absl::StrCat("connect to '", path, "'"));
  }
  return std::make_unique<FrameChannel>(std::move(fd), max_frame_bytes);
}

absl::StatusOr<std::unique_ptr<FrameChannel>> FrameChannel::ConnectTcp(absl::string_view host_port,
                                                                       uint32_t max_frame_bytes) {
  size_t colon = host_port.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == host_port.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad server address '", host_port, "' (expected HOST:PORT)"));
  }
  std::string host(host_port.substr(0, colon));
  std::string port(host_port.substr(colon + 1));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host_port, "': ", ::gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for '", host_port, "'"));
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = ErrnoStatus("socket");
      continue;
    }
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = ErrnoStatus(absl::StrCat("connect to ", host_port));
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::freeaddrinfo(found);
    return std::make_unique<FrameChannel>(std::move(fd), max_frame_bytes);
  }
  ::freeaddrinfo(found);
  return last;
}

absl::Status FrameChannel::Send(std::span<const uint8_t> payload, int fd_to_pass) {
  return SendFrameWithFd(socket_.get(), payload, fd_to_pass);
}

absl::Status FrameChannel::Send(const flatbuffers::FlatBufferBuilder& builder, int fd_to_pass) {
  return Send(std::span<const uint8_t>(builder.GetBufferPointer(), builder.GetSize()), fd_to_pass);
}

absl::Status FrameChannel::ReadSome(absl::Time deadline, UniqueFd* passed_fd) {
  while (true) {
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError("timed out waiting for a frame");
      }
      timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    }
    pollfd pfd{socket_.get(), POLLIN, 0};
    int ready = ::poll(&pfd, 1, timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll");
    }
    if (ready == 0) continue;  // re-checks the deadline

    // Never read past the current frame: Linux delivers an fd with whatever read first touches
    // its segment, so reading frame by frame is what ties each fd to its own frame. The bytes
    // land where the decoder keeps them (a large frame: its payload), not in a bounce buffer.
    std::span<uint8_t> space = decoder_.ReceiveSpace();
    if (space.empty()) return absl::InternalError("frame decoder offered no receive space");
    iovec iov{space.data(), space.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(socket_.get(), &msg, MSG_CMSG_CLOEXEC);
    const int recv_errno = errno;
    decoder_.Commit(n > 0 ? static_cast<size_t>(n) : 0);
    if (n < 0) {
      if (recv_errno == EINTR || recv_errno == EAGAIN) continue;
      errno = recv_errno;
      return ErrnoStatus("recvmsg");
    }
    // Take ownership of every passed fd first so none leaks, whatever happens next.
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        UniqueFd owned(fd);
        if (!passed_fd->valid()) *passed_fd = std::move(owned);
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0) {
      return absl::InvalidArgumentError("peer passed more file descriptors than expected");
    }
    if (n == 0) return absl::UnavailableError("peer closed the connection");
    return absl::OkStatus();
  }
}

absl::StatusOr<ReceivedFrame> FrameChannel::Receive(absl::Duration timeout) {
  absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  while (true) {
    PSWITCH_ASSIGN_OR_RETURN(std::optional<std::vector<uint8_t>> payload, decoder_.Next());
    if (payload.has_value()) {
      ReceivedFrame frame;
      frame.payload = std::move(*payload);
      frame.fd = std::move(pending_fd_);
      return frame;
    }
    UniqueFd passed;
    PSWITCH_RETURN_IF_ERROR(ReadSome(deadline, &passed));
    if (passed.valid()) {
      if (pending_fd_.valid()) {
        return absl::InvalidArgumentError("peer passed a second fd before the first was claimed");
      }
      pending_fd_ = std::move(passed);
    }
  }
}

}  // namespace pswitch::proto
