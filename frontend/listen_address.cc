#include "frontend/listen_address.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pswitch::frontend {

absl::StatusOr<ListenAddress> SplitListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad listen address '", listen, "' (expected HOST:PORT)"));
  }
  ListenAddress address{listen.substr(0, colon), static_cast<uint16_t>(port)};
  if (address.host.size() > 2 && address.host.front() == '[' && address.host.back() == ']') {
    address.host = address.host.substr(1, address.host.size() - 2);
  }
  return address;
}

void DeferAcceptUntilData(int listening_fd, int max_wait_s) {
#ifdef TCP_DEFER_ACCEPT
  const int seconds = max_wait_s < 1 ? 1 : max_wait_s;
  (void)::setsockopt(listening_fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &seconds, sizeof(seconds));
#else
  (void)listening_fd;
  (void)max_wait_s;
#endif
}

}  // namespace pswitch::frontend
