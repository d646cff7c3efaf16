// A listen address as pswitchd's flags give it: "HOST:PORT", an IPv6 host in brackets, port 0
// for any free one. Shared by the TCP and HTTP ports.
#ifndef PSWITCH_FRONTEND_LISTEN_ADDRESS_H_
#define PSWITCH_FRONTEND_LISTEN_ADDRESS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pswitch::frontend {

struct ListenAddress {
  std::string host;  // without brackets
  uint16_t port = 0;
};

// InvalidArgument naming `listen` unless it is HOST:PORT with a port in [0, 65535].
absl::StatusOr<ListenAddress> SplitListen(const std::string& listen);

// Has the kernel hand a listening TCP socket's connections to accept() only once their first
// bytes have arrived, or after `max_wait` (TCP_DEFER_ACCEPT, as nginx's `deferred`): a flood of
// connections that never send costs pswitchd no slot, fd or eviction, and a client's first frame
// is already there when its connection is accepted. Best effort: a no-op where unsupported.
void DeferAcceptUntilData(int listening_fd, int max_wait_s);

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_LISTEN_ADDRESS_H_
