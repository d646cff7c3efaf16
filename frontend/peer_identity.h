// Who is on the other end of a local connection, as the kernel says (docs/dataplane.md,
// "Identity"): the peer's uid from SO_PEERCRED on the Unix socket, and, for a TCP connection
// from this machine (loopback), the uid that owns the peer's socket from the kernel's socket
// diagnostics (NETLINK_SOCK_DIAG), the way `ss -e` finds it. No one can forge either.
#ifndef PSWITCH_FRONTEND_PEER_IDENTITY_H_
#define PSWITCH_FRONTEND_PEER_IDENTITY_H_

#include <sys/types.h>

#include <optional>

#include "absl/status/statusor.h"
#include "asio.hpp"
#include "frontend/auth.h"

namespace pswitch::frontend {

// Whether `address` is a loopback address, an IPv4-mapped one (::ffff:127.0.0.1) included.
bool IsLoopbackAddress(const asio::ip::address& address);

// The uid of the process that connected Unix socket `fd` (SO_PEERCRED).
absl::StatusOr<uid_t> UnixPeerUid(int fd);

// The uid that owns the client end of a loopback TCP connection whose server end is `local` and
// client end `remote`. NotFound when the kernel knows no such socket (the peer closed, or it is
// not on this machine), FailedPrecondition when `remote` is not a loopback address.
absl::StatusOr<uid_t> LoopbackPeerUid(const asio::ip::tcp::endpoint& local,
                                      const asio::ip::tcp::endpoint& remote);

// Who a local peer with `uid` is when it presents no token (docs/dataplane.md): the principal
// the token file maps `uid` to (its optional UID column), else pswitchd's own uid is an admin
// named "uid:N" and every other uid a user named "uid:N".
Principal PrincipalOfUid(uid_t uid, const TokenTable* tokens);

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_PEER_IDENTITY_H_
