#include "frontend/peer_identity.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "frontend/peer_uid_memo.h"
#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

using asio::ip::tcp;

// A connected loopback pair on `address`: `client` is ours, `server` the accepted end.
struct LoopbackPair {
  explicit LoopbackPair(const asio::ip::address& address)
      : acceptor(io, tcp::endpoint(address, 0)), client(io), server(io) {
    client.connect(acceptor.local_endpoint());
    acceptor.accept(server);
  }
  asio::io_context io;
  tcp::acceptor acceptor;
  tcp::socket client;
  tcp::socket server;
};

TEST(LoopbackPeerUidTest, NamesOurOwnUidOverIpv4) {
  LoopbackPair pair(asio::ip::make_address("127.0.0.1"));
  auto uid = LoopbackPeerUid(pair.server.local_endpoint(), pair.server.remote_endpoint());
  ASSERT_TRUE(uid.ok()) << uid.status();
  EXPECT_EQ(*uid, ::geteuid());
}

TEST(LoopbackPeerUidTest, NamesOurOwnUidOverIpv6) {
  asio::error_code ec;
  asio::io_context probe_io;
  tcp::acceptor probe(probe_io);
  probe.open(tcp::v6(), ec);
  if (!ec) probe.bind(tcp::endpoint(asio::ip::address_v6::loopback(), 0), ec);
  if (ec) GTEST_SKIP() << "no IPv6 loopback here: " << ec.message();
  probe.close();
  LoopbackPair pair(asio::ip::address_v6::loopback());
  auto uid = LoopbackPeerUid(pair.server.local_endpoint(), pair.server.remote_endpoint());
  ASSERT_TRUE(uid.ok()) << uid.status();
  EXPECT_EQ(*uid, ::geteuid());
}

TEST(LoopbackPeerUidTest, AClosedPeerOrAWrongPortIsNotFound) {
  LoopbackPair pair(asio::ip::make_address("127.0.0.1"));
  const tcp::endpoint local = pair.server.local_endpoint();
  const tcp::endpoint remote = pair.server.remote_endpoint();
  // A port nobody's socket uses from that address: no uid to lend.
  tcp::endpoint wrong = remote;
  wrong.port(static_cast<unsigned short>(remote.port() == 65535 ? 1 : remote.port() + 1));
  // That port could by chance be another test's; only "not this uid's record" is certain when
  // it is found, so demand NotFound only when the kernel has nothing there.
  auto other = LoopbackPeerUid(local, wrong);
  if (!other.ok()) EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound) << other.status();

  // The client gone (RST, so no TIME_WAIT record stays): the kernel has no such socket.
  pair.client.set_option(asio::socket_base::linger(true, 0));
  pair.client.close();
  auto gone = LoopbackPeerUid(local, remote);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
}

// A client that closed normally leaves an orphaned socket (FIN_WAIT2, then TIME_WAIT) that no
// process holds: the kernel reports it with inode 0, and from TIME_WAIT on with uid 0. Its uid
// must never be lent to whoever asks (a closed socket passing for root's).
TEST(LoopbackPeerUidTest, AClosedClientsOrphanedSocketIsNoOnesNotRoots) {
  LoopbackPair pair(asio::ip::make_address("127.0.0.1"));
  const tcp::endpoint local = pair.server.local_endpoint();
  const tcp::endpoint remote = pair.server.remote_endpoint();
  pair.client.close();  // a FIN, not a reset: the socket stays in the kernel's table
  auto orphan = LoopbackPeerUid(local, remote);
  ASSERT_FALSE(orphan.ok()) << "an orphaned socket was taken for uid " << *orphan;
  EXPECT_EQ(orphan.status().code(), absl::StatusCode::kNotFound) << orphan.status();
  // Once the server closes too, the client's end sits in TIME_WAIT (uid 0 in the kernel's
  // answer): still no one.
  pair.server.close();
  for (int i = 0; i < 50; ++i) {
    auto later = LoopbackPeerUid(local, remote);
    ASSERT_FALSE(later.ok()) << "a closed socket was taken for uid " << *later;
    ::usleep(2000);
  }
}

TEST(LoopbackPeerUidTest, IPv4MappedLoopbackIsLoopback) {
  EXPECT_TRUE(IsLoopbackAddress(asio::ip::make_address("::ffff:127.0.0.1")));
  EXPECT_TRUE(IsLoopbackAddress(asio::ip::make_address("127.0.0.9")));
  EXPECT_TRUE(IsLoopbackAddress(asio::ip::make_address("::1")));
  EXPECT_FALSE(IsLoopbackAddress(asio::ip::make_address("::ffff:192.0.2.7")));
  EXPECT_FALSE(IsLoopbackAddress(asio::ip::make_address("0.0.0.0")));
}

TEST(LoopbackPeerUidTest, ARemoteAddressIsRefused) {
  auto uid = LoopbackPeerUid(tcp::endpoint(asio::ip::make_address("127.0.0.1"), 7000),
                             tcp::endpoint(asio::ip::make_address("192.0.2.7"), 40000));
  ASSERT_FALSE(uid.ok());
  EXPECT_EQ(uid.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Another user's connection is that user's, not ours: run where the test may change uid (root).
TEST(LoopbackPeerUidTest, AnotherUsersConnectionNamesThatUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  constexpr uid_t kNobody = 65534;
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const unsigned short port = acceptor.local_endpoint().port();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(2);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) ::_exit(3);
    // Stay connected until the parent has asked the kernel and closes its end.
    char byte;
    (void)::read(fd, &byte, 1);
    ::_exit(0);
  }
  tcp::socket server(io);
  acceptor.accept(server);
  auto uid = LoopbackPeerUid(server.local_endpoint(), server.remote_endpoint());
  server.close();
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_TRUE(uid.ok()) << uid.status();
  EXPECT_EQ(*uid, kNobody);
  const Principal principal = PrincipalOfUid(*uid, nullptr);
  EXPECT_EQ(principal.name, "uid:65534");
  EXPECT_EQ(principal.role, Role::kUser);
}

TEST(UnixPeerUidTest, NamesTheConnectingProcesssUid) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  auto uid = UnixPeerUid(pair[0]);
  ::close(pair[0]);
  ::close(pair[1]);
  ASSERT_TRUE(uid.ok()) << uid.status();
  EXPECT_EQ(*uid, ::geteuid());
  EXPECT_FALSE(UnixPeerUid(-1).ok());
}

TEST(PrincipalOfUidTest, OurOwnUidIsAdminOthersAreUsersUnlessTheTokenFileMapsThem) {
  const uid_t self = ::geteuid();
  const uid_t other = self + 4242;
  Principal me = PrincipalOfUid(self, nullptr);
  EXPECT_EQ(me.name, absl::StrCat("uid:", self));
  EXPECT_EQ(me.role, Role::kAdmin);
  Principal them = PrincipalOfUid(other, nullptr);
  EXPECT_EQ(them.name, absl::StrCat("uid:", other));
  EXPECT_EQ(them.role, Role::kUser);

  TokenTable tokens = TokenTable::ForTestEntries(
      {TokenEntry{"aaaaaaaaaaaaaaaaaaaa", Principal{"alice", Role::kAdmin}, other},
       TokenEntry{"bbbbbbbbbbbbbbbbbbbb", Principal{"bob", Role::kUser}, std::nullopt}});
  Principal mapped = PrincipalOfUid(other, &tokens);
  EXPECT_EQ(mapped.name, "alice");
  EXPECT_EQ(mapped.role, Role::kAdmin);
  // A table that does not name our uid leaves it the default.
  EXPECT_EQ(PrincipalOfUid(self, &tokens).role, Role::kAdmin);
  EXPECT_EQ(PrincipalOfUid(other + 1, &tokens).role, Role::kUser);
}

// A connection's uid is asked of the kernel once; its later requests get the same answer
// without a lookup. A failed lookup is not kept: the next request asks again.
TEST(PeerUidMemoTest, LooksUpOnceAndKeepsOnlyAFoundUid) {
  PeerUidMemo memo;
  int lookups = 0;
  auto failing = [&]() -> absl::StatusOr<uid_t> {
    ++lookups;
    return absl::NotFoundError("no such socket");
  };
  EXPECT_EQ(memo.Get(failing).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(memo.Get(failing).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(lookups, 2);
  // A real loopback connection's owner, as the HTTP port finds it.
  LoopbackPair pair(asio::ip::make_address("127.0.0.1"));
  auto real = [&]() -> absl::StatusOr<uid_t> {
    ++lookups;
    return LoopbackPeerUid(pair.server.local_endpoint(), pair.server.remote_endpoint());
  };
  for (int request = 0; request < 3; ++request) {
    absl::StatusOr<uid_t> uid = memo.Get(real);
    ASSERT_TRUE(uid.ok()) << uid.status();
    EXPECT_EQ(*uid, ::geteuid());
  }
  EXPECT_EQ(lookups, 3) << "one lookup for three requests";
}

}  // namespace
}  // namespace pswitch::frontend
