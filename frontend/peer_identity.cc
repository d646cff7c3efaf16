// The loopback lookup asks the kernel's socket diagnostics (NETLINK_SOCK_DIAG) for the one TCP
// socket whose local end is the client's address and port and whose remote end is ours: an exact
// lookup (no NLM_F_DUMP), answered by the socket's own record, which carries the uid that created
// it. Nothing in the answer is trusted until it names exactly the 4-tuple asked for: a client
// that closed and a listener that took its port must not lend their owner's uid.
#include "frontend/peer_identity.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace pswitch::frontend {
namespace {

// The kernel answers an exact lookup at once; a second is a generous bound that keeps a wedged
// netlink socket from holding the caller.
constexpr int kNetlinkTimeoutMs = 1000;

bool IsLoopback(const asio::ip::address& address) {
  if (address.is_v4()) return address.to_v4().is_loopback();
  const asio::ip::address_v6 v6 = address.to_v6();
  if (v6.is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, v6).is_loopback();
  }
  return v6.is_loopback();
}

// An IPv4 peer seen through a dual-stack listener is asked about as the IPv4 socket it is (the
// kernel finds a v6 socket speaking v4 through the same lookup).
asio::ip::address Unmapped(const asio::ip::address& address) {
  if (address.is_v6() && address.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6());
  }
  return address;
}

// Writes `address` in inet_diag's layout: IPv4 in the first word, IPv6 in all four.
void PutAddress(const asio::ip::address& address, __be32 out[4]) {
  std::memset(out, 0, 4 * sizeof(__be32));
  if (address.is_v4()) {
    const auto bytes = address.to_v4().to_bytes();
    std::memcpy(out, bytes.data(), bytes.size());
  } else {
    const auto bytes = address.to_v6().to_bytes();
    std::memcpy(out, bytes.data(), bytes.size());
  }
}

bool SameAddress(const __be32 a[4], const __be32 b[4], bool v4) {
  return std::memcmp(a, b, (v4 ? 1 : 4) * sizeof(__be32)) == 0;
}

struct DiagRequest {
  nlmsghdr header;
  inet_diag_req_v2 body;
};

}  // namespace

bool IsLoopbackAddress(const asio::ip::address& address) { return IsLoopback(address); }

absl::StatusOr<uid_t> UnixPeerUid(int fd) {
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    return ErrnoStatus("getsockopt(SO_PEERCRED)");
  }
  if (length != sizeof(credentials)) {
    return absl::InternalError("getsockopt(SO_PEERCRED): short answer");
  }
  return credentials.uid;
}

absl::StatusOr<uid_t> LoopbackPeerUid(const asio::ip::tcp::endpoint& local,
                                      const asio::ip::tcp::endpoint& remote) {
  if (!IsLoopback(remote.address())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer ", remote.address().to_string(), " is not on loopback: the kernel cannot name it"));
  }
  const asio::ip::address client = Unmapped(remote.address());
  const asio::ip::address server = Unmapped(local.address());
  if (client.is_v4() != server.is_v4()) {
    return absl::FailedPreconditionError("peer and local address families differ");
  }
  const bool v4 = client.is_v4();

  UniqueFd sock(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!sock.valid()) return ErrnoStatus("socket(NETLINK_SOCK_DIAG)");
  timeval timeout{};
  timeout.tv_sec = kNetlinkTimeoutMs / 1000;
  timeout.tv_usec = (kNetlinkTimeoutMs % 1000) * 1000;
  if (::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)) != 0 ||
      ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout)) != 0) {
    return ErrnoStatus("setsockopt(netlink timeout)");
  }

  DiagRequest request{};
  request.header.nlmsg_len = sizeof(request);
  request.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  request.header.nlmsg_flags = NLM_F_REQUEST;
  request.header.nlmsg_seq = 1;
  request.body.sdiag_family = v4 ? AF_INET : AF_INET6;
  request.body.sdiag_protocol = IPPROTO_TCP;
  request.body.idiag_states = ~0u;
  // The client's socket: its source is the peer we see, its destination is us.
  request.body.id.idiag_sport = htons(remote.port());
  request.body.id.idiag_dport = htons(local.port());
  PutAddress(client, request.body.id.idiag_src);
  PutAddress(server, request.body.id.idiag_dst);
  request.body.id.idiag_if = 0;
  request.body.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  request.body.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(sock.get(), &request, sizeof(request), 0, reinterpret_cast<sockaddr*>(&kernel),
               sizeof(kernel)) != static_cast<ssize_t>(sizeof(request))) {
    return ErrnoStatus("send sock_diag request");
  }

  // One answer to an exact lookup: the socket's record or an error. Aligned for nlmsghdr.
  alignas(nlmsghdr) std::array<char, 8192> buffer;
  sockaddr_nl from{};
  socklen_t from_length = sizeof(from);
  const ssize_t n = ::recvfrom(sock.get(), buffer.data(), buffer.size(), 0,
                               reinterpret_cast<sockaddr*>(&from), &from_length);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::DeadlineExceededError("sock_diag: no answer from the kernel within 1 s");
    }
    return ErrnoStatus("receive sock_diag answer");
  }
  if (from_length != sizeof(from) || from.nl_family != AF_NETLINK || from.nl_pid != 0) {
    return absl::InternalError("sock_diag: answer not from the kernel");
  }
  const auto* header = reinterpret_cast<const nlmsghdr*>(buffer.data());
  if (!NLMSG_OK(header, static_cast<size_t>(n)) || header->nlmsg_seq != request.header.nlmsg_seq) {
    return absl::InternalError("sock_diag: malformed answer");
  }
  if (header->nlmsg_type == NLMSG_ERROR) {
    if (header->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) {
      return absl::InternalError("sock_diag: short error answer");
    }
    const auto* error = static_cast<const nlmsgerr*>(NLMSG_DATA(header));
    if (error->error == -ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("no local socket at ", remote.address().to_string(), ":", remote.port()));
    }
    return absl::InternalError(
        absl::StrCat("sock_diag: ", std::strerror(error->error < 0 ? -error->error : EIO)));
  }
  if (header->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
      header->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
    return absl::InternalError("sock_diag: unexpected answer");
  }
  const auto* msg = static_cast<const inet_diag_msg*>(NLMSG_DATA(header));
  // The record must be the client's connected socket, not a listener or another connection,
  // and still a file some process holds: a socket its owner closed (orphaned, TIME_WAIT) reports
  // uid 0 and inode 0, which must never pass for root.
  const bool live = msg->idiag_inode != 0 &&
                    (msg->idiag_state == TCP_ESTABLISHED || msg->idiag_state == TCP_FIN_WAIT1 ||
                     msg->idiag_state == TCP_FIN_WAIT2 || msg->idiag_state == TCP_CLOSE_WAIT);
  if (!live) {
    return absl::NotFoundError(absl::StrCat("the local socket at ", remote.address().to_string(),
                                            ":", remote.port(), " is closed"));
  }
  if (msg->idiag_family != request.body.sdiag_family || msg->idiag_state == TCP_LISTEN ||
      msg->id.idiag_sport != request.body.id.idiag_sport ||
      msg->id.idiag_dport != request.body.id.idiag_dport ||
      !SameAddress(msg->id.idiag_src, request.body.id.idiag_src, v4) ||
      !SameAddress(msg->id.idiag_dst, request.body.id.idiag_dst, v4)) {
    return absl::NotFoundError(absl::StrCat("no connected local socket at ",
                                            remote.address().to_string(), ":", remote.port()));
  }
  return static_cast<uid_t>(msg->idiag_uid);
}

Principal PrincipalOfUid(uid_t uid, const TokenTable* tokens) {
  if (tokens != nullptr) {
    if (std::optional<Principal> mapped = tokens->FindUid(uid)) return *mapped;
  }
  Principal principal;
  principal.name = absl::StrCat("uid:", uid);
  principal.role = uid == ::geteuid() ? Role::kAdmin : Role::kUser;
  return principal;
}

}  // namespace pswitch::frontend
