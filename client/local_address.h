// Which pswitchd socket a client address names: "unix:/path", or TCP "HOST:PORT", where a local
// pswitchd's default Unix socket stands in for its default TCP port (docs/python.md, "When the
// Unix socket is used"). The rules are Client::Connect's; here so they are stated once.
#ifndef PSWITCH_CLIENT_LOCAL_ADDRESS_H_
#define PSWITCH_CLIENT_LOCAL_ADDRESS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/frame_channel.h"

namespace pswitch::client {

// The TCP port pswitchd listens on by default (--listen=127.0.0.1:7300).
inline constexpr int kDefaultPort = 7300;

enum class Transport {
  // The Unix socket when the address says so or the server is local (Client::Connect), else TCP.
  kAuto,
  // TCP always, even to a local server (e.g. to measure or test the TCP path).
  kTcp,
};

// Where pswitchd's default Unix socket may be, in the order tried: $PSWITCH_UNIX_SOCKET alone when
// it is set and not empty; else /run/pswitch/pswitchd.sock (pswitchd under systemd's
// RuntimeDirectory=pswitch, or run as root), then $XDG_RUNTIME_DIR/pswitch/pswitchd.sock
// (pswitchd run by hand by this user).
std::vector<std::string> DefaultUnixSocketPaths();

struct DialedChannel {
  std::unique_ptr<proto::FrameChannel> channel;
  bool local = false;  // the Unix socket
};

// Connects as Client::Connect documents: "unix:/path"; "" or a loopback host with port 7300: the
// first default Unix socket that accepts (unless `transport` is kTcp), else TCP; anything else:
// TCP. InvalidArgument for "unix:" with kTcp; the connect's error otherwise.
absl::StatusOr<DialedChannel> DialPswitchd(absl::string_view address, Transport transport,
                                           uint32_t max_frame_bytes);

}  // namespace pswitch::client

#endif  // PSWITCH_CLIENT_LOCAL_ADDRESS_H_
