// A connection's peer uid, looked up once (frontend/peer_identity.h): the kernel's socket
// diagnostics name the uid that created the peer's socket, which stays the same for the
// connection's whole life, so a keep-alive connection's later requests need not ask the kernel
// again (one NETLINK_SOCK_DIAG round trip per request before). Kept apart from peer_identity.h
// so the HTTP transport can hold one per connection without its Asio headers.
#ifndef PSWITCH_FRONTEND_PEER_UID_MEMO_H_
#define PSWITCH_FRONTEND_PEER_UID_MEMO_H_

#include <sys/types.h>

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace pswitch::frontend {

// One per connection, shared by its requests. Thread-safe (requests are served on handler
// threads).
class PeerUidMemo {
 public:
  PeerUidMemo() = default;
  PeerUidMemo(const PeerUidMemo&) = delete;
  PeerUidMemo& operator=(const PeerUidMemo&) = delete;

  // The uid found before, else `lookup`'s answer. Only a found uid is kept: a failure (the peer
  // not found, netlink refused) is asked again by the next request, and refuses this one.
  absl::StatusOr<uid_t> Get(absl::FunctionRef<absl::StatusOr<uid_t>()> lookup) {
    absl::MutexLock lock(&mu_);
    if (uid_.has_value()) return *uid_;
    absl::StatusOr<uid_t> found = lookup();
    if (found.ok()) uid_ = *found;
    return found;
  }

 private:
  absl::Mutex mu_;
  std::optional<uid_t> uid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_PEER_UID_MEMO_H_
