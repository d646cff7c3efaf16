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

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_LISTEN_ADDRESS_H_
