#include "client/local_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::client {

std::vector<std::string> DefaultUnixSocketPaths() {
  const char* env = std::getenv("PSWITCH_UNIX_SOCKET");
  if (env != nullptr && env[0] != '\0') return {env};
  std::vector<std::string> paths = {"/run/pswitch/pswitchd.sock"};
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && runtime[0] == '/') {
    paths.push_back(absl::StrCat(runtime, "/pswitch/pswitchd.sock"));
  }
  return paths;
}

namespace {

constexpr absl::string_view kUnixPrefix = "unix:";

// "localhost", an IPv4 address in 127.0.0.0/8, or ::1 (bracketed or not).
bool IsLoopbackHost(std::string host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost" || host == "ip6-localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// Whether a TCP "HOST:PORT" names pswitchd's default port on this machine.
bool IsLocalDefaultPort(absl::string_view host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == absl::string_view::npos) return false;
  int port = 0;
  return absl::SimpleAtoi(host_port.substr(colon + 1), &port) && port == kDefaultPort &&
         IsLoopbackHost(std::string(host_port.substr(0, colon)));
}

}  // namespace

absl::StatusOr<DialedChannel> DialPswitchd(absl::string_view address, Transport transport,
                                           uint32_t max_frame_bytes) {
  const std::string default_tcp = absl::StrCat("127.0.0.1:", kDefaultPort);
  if (absl::StartsWith(address, kUnixPrefix)) {
    if (transport == Transport::kTcp) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", address, "' is a Unix socket but TCP was asked for"));
    }
    PSWITCH_ASSIGN_OR_RETURN(
        std::unique_ptr<proto::FrameChannel> channel,
        proto::FrameChannel::Connect(address.substr(kUnixPrefix.size()), max_frame_bytes));
    return DialedChannel{std::move(channel), true};
  }
  const std::string tcp = address.empty() ? default_tcp : std::string(address);
  if (transport == Transport::kAuto && (address.empty() || IsLocalDefaultPort(address))) {
    // A socket that is missing, refuses us, or has nobody listening: the next, then TCP.
    for (const std::string& path : DefaultUnixSocketPaths()) {
      auto unix = proto::FrameChannel::Connect(path, max_frame_bytes);
      if (unix.ok()) return DialedChannel{*std::move(unix), true};
    }
  }
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<proto::FrameChannel> channel,
                           proto::FrameChannel::ConnectTcp(tcp, max_frame_bytes));
  return DialedChannel{std::move(channel), false};
}

}  // namespace pswitch::client
