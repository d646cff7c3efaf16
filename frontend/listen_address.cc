#include "frontend/listen_address.h"

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

}  // namespace pswitch::frontend
