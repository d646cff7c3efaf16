// One message with a few descriptors (SCM_RIGHTS) over a SOCK_SEQPACKET socket: a parent's
// request to a helper it started, e.g. pswitchd's to a standby inspector. A message is sent and
// received whole or not at all.
#ifndef PSWITCH_BASE_FD_MESSAGE_H_
#define PSWITCH_BASE_FD_MESSAGE_H_

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_fd.h"

namespace pswitch::base {

// At most this many descriptors travel with one message.
inline constexpr size_t kMaxMessageFds = 4;

// Sends `bytes` (at least one) with `fds` (at most kMaxMessageFds; negative ones are an error).
// FailedPrecondition when the peer has gone (no SIGPIPE); with `wait` false, Unavailable instead
// of blocking when the socket's buffer is full; the errno's status otherwise.
absl::Status SendMessageWithFds(int socket_fd, absl::string_view bytes, std::span<const int> fds,
                                bool wait = true);

struct MessageWithFds {
  std::string bytes;
  std::vector<UniqueFd> fds;  // owned, close-on-exec
};

// Blocks until a message arrives. Cancelled when the peer closed the socket first;
// InvalidArgument for a message over `max_bytes` or with more than `max_fds` descriptors (those
// that came are closed).
absl::StatusOr<MessageWithFds> ReceiveMessageWithFds(int socket_fd, size_t max_bytes,
                                                     size_t max_fds);

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_FD_MESSAGE_H_
