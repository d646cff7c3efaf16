// Reading pswitchd's client-protocol replies in tests that speak the raw protocol (the Unix
// socket's and the TCP payload's end-to-end tests), and reading exactly n bytes off a socket.
#ifndef PSWITCH_TESTS_CONTROLLER_REPLIES_H_
#define PSWITCH_TESTS_CONTROLLER_REPLIES_H_

#include <poll.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/client_generated.h"
#include "proto/framing.h"

namespace pswitch::testing {

// The verified reply in `bytes`, or null.
inline const proto::ControllerReply* Reply(const std::vector<uint8_t>& bytes) {
  auto reply = proto::VerifyPayload<proto::ControllerReply>(bytes, "reply");
  return reply.ok() ? *reply : nullptr;
}

// The reply's error code (OK for any other reply; Unknown when there was none).
inline absl::StatusCode ErrorCode(const std::vector<uint8_t>& bytes) {
  const proto::ControllerReply* reply = Reply(bytes);
  if (reply == nullptr) return absl::StatusCode::kUnknown;
  if (reply->body_type() != proto::ControllerReplyBody::Error) return absl::StatusCode::kOk;
  return static_cast<absl::StatusCode>(reply->body_as_Error()->code());
}

// The reply's error message ("" for any other reply).
inline std::string ErrorMessage(const std::vector<uint8_t>& bytes) {
  const proto::ControllerReply* reply = Reply(bytes);
  if (reply == nullptr || reply->body_type() != proto::ControllerReplyBody::Error) return "";
  const auto* message = reply->body_as_Error()->message();
  return message != nullptr ? message->str() : "";
}

// Reads exactly `n` bytes of `fd` into `out` before `deadline`; false on a timeout or a close.
inline bool ReadExactly(int fd, uint8_t* out, size_t n, absl::Time deadline) {
  size_t got = 0;
  while (got < n) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left_ms)) <= 0) return false;
    const ssize_t r = ::recv(fd, out + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace pswitch::testing

#endif  // PSWITCH_TESTS_CONTROLLER_REPLIES_H_
