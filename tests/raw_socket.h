// Raw loopback TCP for tests that play a hostile client byte by byte (slow senders, floods,
// oversized headers), where a real client library would do too much for them.
#ifndef PSWITCH_TESTS_RAW_SOCKET_H_
#define PSWITCH_TESTS_RAW_SOCKET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pswitch::testing {

// A connection to 127.0.0.1:`port`, or -1.
inline int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends all of `bytes`; false once the peer has closed (no SIGPIPE).
inline bool SendAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// What the peer sends until it closes, or until `timeout`; `*closed` (if given) says which.
inline std::string ReadUntilClose(int fd, absl::Duration timeout, bool* closed = nullptr) {
  std::string out;
  const absl::Time end = absl::Now() + timeout;
  if (closed != nullptr) *closed = false;
  for (;;) {
    const int64_t left_ms = absl::ToInt64Milliseconds(end - absl::Now());
    if (left_ms <= 0) return out;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left_ms)) <= 0) return out;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (closed != nullptr) *closed = true;
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace pswitch::testing

#endif  // PSWITCH_TESTS_RAW_SOCKET_H_
