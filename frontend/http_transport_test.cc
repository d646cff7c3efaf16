// The HTTP port's connection limits against real sockets: slow senders, floods of connections,
// oversized headers and bodies, the byte budget.
#include "frontend/http_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/raw_socket.h"

namespace pswitch::frontend {
namespace {

using testing::ConnectLoopback;
using testing::ReadUntilClose;
using testing::SendAll;

class EchoService : public HttpService {
 public:
  std::variant<std::string, HttpResponse> Admit(const HttpRequest& head) override {
    if (head.path == "/deny") {
      HttpResponse r;
      r.status = 401;
      r.body = "{\"error\":\"no\"}";
      return r;
    }
    if (head.path == "/open") return std::string(kUnauthenticatedClient);
    return std::string("client");
  }
  void Serve(HttpRequest request, HttpRespond respond) override {
    peer_port_.store(request.peer_port);
    local_port_.store(request.local_port);
    local_is_loopback_.store(request.local_address == "127.0.0.1" && request.peer == "127.0.0.1");
    {
      absl::MutexLock lock(&mu_);
      memos_.push_back(request.peer_uid);
    }
    served_.fetch_add(1);
    HttpResponse r;
    r.body = absl::StrCat("{\"bytes\":", request.body.size(), "}");
    respond(std::move(r));
  }
  int served() const { return served_.load(); }
  // The last request's connection ends, as the transport reported them.
  uint16_t peer_port() const { return peer_port_.load(); }
  uint16_t local_port() const { return local_port_.load(); }
  bool local_is_loopback() const { return local_is_loopback_.load(); }
  // Each served request's connection memo of its peer's uid, in order.
  std::vector<std::shared_ptr<PeerUidMemo>> memos() const {
    absl::MutexLock lock(&mu_);
    return memos_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<PeerUidMemo>> memos_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> served_{0};
  std::atomic<uint16_t> peer_port_{0};
  std::atomic<uint16_t> local_port_{0};
  std::atomic<bool> local_is_loopback_{false};
};

// One response's status line and body, read from a keep-alive connection.
std::string ReadOneResponse(int fd, absl::Duration timeout) {
  std::string out;
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    const size_t header_end = out.find("\r\n\r\n");
    if (header_end != std::string::npos) {
      size_t length = 0;
      const size_t at = out.find("Content-Length: ");
      if (at != std::string::npos) {
        (void)absl::SimpleAtoi(out.substr(at + 16, out.find("\r\n", at) - at - 16), &length);
      }
      if (out.size() >= header_end + 4 + length) return out;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string Status(const std::string& response) { return response.substr(0, 12); }

class HttpTransportTest : public ::testing::Test {
 protected:
  void Start(HttpLimits limits) {
    auto t = HttpTransport::Start("127.0.0.1:0", std::move(limits), &service_);
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = *std::move(t);
  }
  // A GET on a new connection; its status line, or "" if not answered within `timeout`.
  std::string Probe(absl::Duration timeout = absl::Seconds(2)) {
    const int fd = ConnectLoopback(transport_->port());
    if (fd < 0) return "";
    SendAll(fd, "GET /live HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string r = ReadOneResponse(fd, timeout);
    ::close(fd);
    return Status(r);
  }
  EchoService service_;
  std::unique_ptr<HttpTransport> transport_;
};

// A request names both ends of its connection, so a route can ask the kernel who owns the peer's
// socket (frontend/peer_identity.h).
TEST_F(HttpTransportTest, RequestsNameBothEndsOfTheirConnection) {
  Start(HttpLimits{});
  const int fd = ConnectLoopback(transport_->port());
  ASSERT_GE(fd, 0);
  sockaddr_in mine{};
  socklen_t length = sizeof(mine);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &length), 0);
  SendAll(fd, "GET /live HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(Status(ReadOneResponse(fd, absl::Seconds(2))), "HTTP/1.1 200");
  ::close(fd);
  EXPECT_EQ(service_.peer_port(), ntohs(mine.sin_port));
  EXPECT_EQ(service_.local_port(), transport_->port());
  EXPECT_TRUE(service_.local_is_loopback());
}

// A connection's requests share one memo of its peer's uid (so the kernel is asked once per
// connection, not per request); another connection has its own.
TEST_F(HttpTransportTest, AConnectionsRequestsShareOneMemoOfItsPeersUid) {
  Start(HttpLimits{});
  const int first = ConnectLoopback(transport_->port());
  const int second = ConnectLoopback(transport_->port());
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  for (int fd : {first, first, second}) {
    SendAll(fd, "GET /live HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(Status(ReadOneResponse(fd, absl::Seconds(2))), "HTTP/1.1 200");
  }
  ::close(first);
  ::close(second);
  const std::vector<std::shared_ptr<PeerUidMemo>> memos = service_.memos();
  ASSERT_EQ(memos.size(), 3u);
  ASSERT_NE(memos[0], nullptr);
  EXPECT_EQ(memos[0], memos[1]);
  EXPECT_NE(memos[0], memos[2]);
}

// Before: eight connections sending a header byte every 10 s stopped the port for good.
TEST_F(HttpTransportTest, SlowHeadersAreCutAtTheirDeadlineWhileProbesAreAnswered) {
  HttpLimits limits;
  limits.header_timeout = absl::Milliseconds(1500);
  limits.max_connections = 8;
  Start(limits);
  std::vector<int> slow;
  for (int i = 0; i < 16; ++i) {
    const int fd = ConnectLoopback(transport_->port());
    ASSERT_GE(fd, 0);
    SendAll(fd, "GET /live HTTP/1.1\r\n");
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop.load()) {
      for (int fd : slow) SendAll(fd, "X");
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
  int answered = 0;
  const absl::Time begin = absl::Now();
  for (int i = 0; i < 10; ++i) {
    const absl::Time t0 = absl::Now();
    EXPECT_EQ(Probe(), "HTTP/1.1 200");
    EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
    ++answered;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(answered, 10);
  // Every trickler is closed by its whole-headers deadline, however steadily it sends.
  for (int fd : slow) {
    bool closed = false;
    ReadUntilClose(fd, begin + absl::Seconds(4) - absl::Now(), &closed);
    EXPECT_TRUE(closed);
  }
  stop = true;
  trickle.join();
  for (int fd : slow) ::close(fd);
}

// Before: connections were accepted without limit until pswitchd ran out of descriptors.
TEST_F(HttpTransportTest, AtTheCapTheConnectionWaitingLongestMakesRoom) {
  HttpLimits limits;
  limits.max_connections = 4;
  Start(limits);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(ConnectLoopback(transport_->port()));
    // A first byte: a connection that never sends waits in the kernel (TCP_DEFER_ACCEPT).
    SendAll(idle.back(), "G");
    absl::SleepFor(absl::Milliseconds(20));  // a defined order of arrival
  }
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(transport_->connections(), 4u);
  EXPECT_EQ(Probe(), "HTTP/1.1 200");
  bool closed = false;
  ReadUntilClose(idle[0], absl::Seconds(2), &closed);
  EXPECT_TRUE(closed) << "the oldest idle connection makes room";
  ReadUntilClose(idle[3], absl::Milliseconds(100), &closed);
  EXPECT_FALSE(closed);
  EXPECT_LE(transport_->connections(), 4u);
  for (int fd : idle) ::close(fd);
}

// Before: 39,287 header lines of 8 KB were buffered (467 MB) and answered 200.
TEST_F(HttpTransportTest, HeadersOverTheCapAre431AndNeverBuffered) {
  HttpLimits limits;
  limits.max_header_bytes = 8 << 10;
  Start(limits);
  const int fd = ConnectLoopback(transport_->port());
  SendAll(fd, "GET /live HTTP/1.1\r\n");
  const std::string line = "X-Filler: " + std::string(8 << 10, 'a') + "\r\n";
  size_t sent = 0;
  while (sent < (size_t{64} << 20) && SendAll(fd, line)) sent += line.size();
  bool closed = false;
  const std::string r = ReadUntilClose(fd, absl::Seconds(5), &closed);
  EXPECT_EQ(Status(r), "HTTP/1.1 431");
  EXPECT_TRUE(closed);
  EXPECT_LT(sent, size_t{64} << 20) << "the server stopped reading at its cap";
  ::close(fd);
  EXPECT_EQ(service_.served(), 0);
  limits = HttpLimits{};
  limits.max_header_fields = 3;
  transport_.reset();
  Start(limits);
  const int many = ConnectLoopback(transport_->port());
  SendAll(many, "GET /live HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n");
  EXPECT_EQ(Status(ReadUntilClose(many, absl::Seconds(2))), "HTTP/1.1 431");
  ::close(many);
}

TEST_F(HttpTransportTest, BodiesAreRefusedBeforeTheyAreRead) {
  HttpLimits limits;
  limits.max_body_bytes = 1000;
  limits.budget = std::make_shared<ByteBudget>(ByteBudgetLimits{100000, 500, 100});
  Start(limits);
  auto ask = [this](const std::string& head) {
    const int fd = ConnectLoopback(transport_->port());
    SendAll(fd, head);  // the body is never sent: the answer must not wait for it
    const std::string r = ReadUntilClose(fd, absl::Seconds(2));
    ::close(fd);
    return Status(r);
  };
  EXPECT_EQ(ask("POST /x HTTP/1.1\r\nContent-Length: 5000\r\n\r\n"), "HTTP/1.1 413");
  EXPECT_EQ(ask("POST /x HTTP/1.1\r\nContent-Length: 800\r\n\r\n"), "HTTP/1.1 503");  // budget
  EXPECT_EQ(ask("POST /deny HTTP/1.1\r\nContent-Length: 800\r\n\r\n"), "HTTP/1.1 401");
  EXPECT_EQ(ask("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), "HTTP/1.1 411");
  EXPECT_EQ(service_.served(), 0);
  EXPECT_EQ(limits.budget->used(), 0u);
  // Within the budget it is read and served, then released.
  const int fd = ConnectLoopback(transport_->port());
  SendAll(fd, "POST /x HTTP/1.1\r\nContent-Length: 400\r\n\r\n" + std::string(400, 'b'));
  const std::string r = ReadOneResponse(fd, absl::Seconds(2));
  EXPECT_EQ(Status(r), "HTTP/1.1 200");
  EXPECT_NE(r.find("{\"bytes\":400}"), std::string::npos);
  ::close(fd);
  for (int i = 0; i < 100 && limits.budget->used() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(limits.budget->used(), 0u);
}

// Before: replies to requests admitted for nobody (health probes, errors) were charged to the
// unauthenticated pool, so connections that never read theirs turned every probe into a 503.
TEST_F(HttpTransportTest, RepliesToOpenRoutesAreNotChargedToTheUnauthenticatedPool) {
  HttpLimits limits;
  limits.budget = std::make_shared<ByteBudget>(ByteBudgetLimits{100000, 5000, 4});
  Start(limits);
  const int fd = ConnectLoopback(transport_->port());
  SendAll(fd, "GET /open HTTP/1.1\r\n\r\n");
  EXPECT_EQ(Status(ReadOneResponse(fd, absl::Seconds(2))), "HTTP/1.1 200");
  ::close(fd);
}

// Before: a POST without a body (the README's own curl) hung 30 s, then got 400.
TEST_F(HttpTransportTest, ABodilessPostIsServedAtOnce) {
  Start(HttpLimits{});
  const int fd = ConnectLoopback(transport_->port());
  const absl::Time t0 = absl::Now();
  SendAll(fd, "POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(Status(ReadOneResponse(fd, absl::Seconds(5))), "HTTP/1.1 200");
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  // And the connection carries the next request.
  SendAll(fd, "GET /live HTTP/1.1\r\n\r\n");
  EXPECT_EQ(Status(ReadOneResponse(fd, absl::Seconds(5))), "HTTP/1.1 200");
  ::close(fd);
}

TEST_F(HttpTransportTest, ABodyTrickledPastTheRequestDeadlineIsCut) {
  HttpLimits limits;
  limits.request_timeout = absl::Seconds(1);
  Start(limits);
  const int fd = ConnectLoopback(transport_->port());
  SendAll(fd, "POST /x HTTP/1.1\r\nContent-Length: 100\r\n\r\n");
  const absl::Time t0 = absl::Now();
  bool closed = false;
  std::string answer;
  for (int i = 0; i < 40 && !closed; ++i) {
    if (!SendAll(fd, "b")) break;
    answer += ReadUntilClose(fd, absl::Milliseconds(100), &closed);
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  EXPECT_EQ(service_.served(), 0);
  ::close(fd);
}

// A service that has bodies on "/placed" received in place: their first `prefix` bytes into the
// request's body, the rest into two buffers of its own (the first `split` bytes, then the rest),
// and answers with the prefix and the placed bytes as a tail sent from those buffers.
class PlacingService : public EchoService {
 public:
  struct Placed : PlacedBody {
    std::vector<uint8_t> first, second;
  };
  uint64_t prefix = 4;
  uint64_t split = 1000;
  bool refuse = false;  // PlaceBody answers 400 instead

  std::optional<uint64_t> BodyPrefix(const HttpRequest& head, uint64_t body_bytes) override {
    if (head.path != "/placed") return std::nullopt;
    return std::min(prefix, body_bytes);
  }
  std::variant<std::shared_ptr<PlacedBody>, HttpResponse> PlaceBody(
      HttpRequest& request, uint64_t rest_bytes, std::shared_ptr<void>& connection) override {
    placements_.fetch_add(1);
    if (connection == nullptr) connection = std::make_shared<int>(0);
    if (refuse) return JsonError(400, "refused after its header");
    auto placed = std::make_shared<Placed>();
    placed->first.resize(std::min(split, rest_bytes));
    placed->second.resize(rest_bytes - placed->first.size());
    placed->spans = {absl::MakeSpan(placed->first), absl::MakeSpan(placed->second)};
    seen_prefix_ = request.body;
    absl::MutexLock lock(&mu_);
    last_ = placed;
    return placed;
  }
  void Serve(HttpRequest request, HttpRespond respond) override {
    if (request.placed == nullptr) return EchoService::Serve(std::move(request), respond);
    auto placed = std::static_pointer_cast<Placed>(request.placed);
    HttpResponse r;
    r.content_type = "application/octet-stream";
    r.body = request.body;  // the prefix
    r.tail = {absl::MakeConstSpan(placed->first), absl::MakeConstSpan(placed->second)};
    r.tail_owner = placed;
    respond(std::move(r));
  }
  int placements() const { return placements_.load(); }
  // Whether the last placement is still held by anyone but this service's record of it.
  bool last_released() const {
    absl::MutexLock lock(&mu_);
    return last_.expired();
  }
  std::string seen_prefix_;

 private:
  std::atomic<int> placements_{0};
  mutable absl::Mutex mu_;
  std::weak_ptr<Placed> last_ ABSL_GUARDED_BY(mu_);
};

class HttpPlacedBodyTest : public ::testing::Test {
 protected:
  void Start(HttpLimits limits) {
    auto t = HttpTransport::Start("127.0.0.1:0", std::move(limits), &service_);
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = *std::move(t);
  }
  static std::string Request(const std::string& body) {
    return absl::StrCat("POST /placed HTTP/1.1\r\nHost: x\r\nContent-Length: ", body.size(),
                        "\r\n\r\n", body);
  }
  static std::string Body(size_t bytes) {
    std::string b(bytes, '\0');
    for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<char>(i * 131 + 7);
    return b;
  }
  PlacingService service_;
  std::unique_ptr<HttpTransport> transport_;
};

// A placed body sent in many small writes (never more than 97 bytes, the headers cut too) lands
// whole in the service's buffers, and the answer's tail comes back from them byte for byte; a
// second request on the connection is read in step.
TEST_F(HttpPlacedBodyTest, ABodySplitAcrossManySmallWritesLandsWhole) {
  HttpLimits limits;
  limits.budget = std::make_shared<ByteBudget>(ByteBudgetLimits{});
  Start(limits);
  const int fd = ConnectLoopback(transport_->port());
  ASSERT_GE(fd, 0);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const std::string body = Body(200000);
  const std::string request = Request(body);
  for (size_t at = 0, step = 1; at < request.size(); at += step, step = step % 97 + 1) {
    ASSERT_TRUE(SendAll(fd, absl::string_view(request).substr(at, step)));
    if (at % 20000 < step) absl::SleepFor(absl::Milliseconds(1));  // let reads see the pieces
  }
  std::string r = ReadOneResponse(fd, absl::Seconds(5));
  ASSERT_EQ(Status(r), "HTTP/1.1 200") << r.substr(0, 200);
  EXPECT_NE(r.find(absl::StrCat("Content-Length: ", body.size())), std::string::npos);
  EXPECT_TRUE(r.substr(r.find("\r\n\r\n") + 4) == body);  // not printed: 200 KB
  EXPECT_EQ(service_.seen_prefix_, body.substr(0, 4));
  EXPECT_EQ(service_.placements(), 1);
  // Pipelined: two requests in one write, the second's bytes never taken for the first's body.
  ASSERT_TRUE(
      SendAll(fd, Request(Body(3000)) + "POST /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"));
  r.clear();
  for (int i = 0; i < 100 && !absl::EndsWith(r, "{\"bytes\":3}"); ++i) {
    r += ReadOneResponse(fd, absl::Milliseconds(50));
  }
  ASSERT_EQ(Status(r), "HTTP/1.1 200");
  const size_t first_body = r.find("\r\n\r\n") + 4;
  EXPECT_TRUE(r.compare(first_body, 3000, Body(3000)) == 0);
  const std::string second = r.substr(std::min(r.size(), first_body + 3000));
  EXPECT_EQ(Status(second), "HTTP/1.1 200");
  EXPECT_TRUE(absl::EndsWith(second, "{\"bytes\":3}"));
  ::close(fd);
  for (int i = 0; i < 200 && (limits.budget->used() > 0 || !service_.last_released()); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(limits.budget->used(), 0u);
  EXPECT_TRUE(service_.last_released());
}

// A body shorter than declared (the client closes midway): what it was being received into is
// let go at once and nothing stays charged; one that stalls is cut at the request's deadline.
TEST_F(HttpPlacedBodyTest, ABodyCutShortReleasesItsPlacement) {
  HttpLimits limits;
  limits.budget = std::make_shared<ByteBudget>(ByteBudgetLimits{});
  limits.request_timeout = absl::Milliseconds(500);
  Start(limits);
  auto wait_released = [&] {
    for (int i = 0; i < 300 && (limits.budget->used() > 0 || !service_.last_released()); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  };
  const std::string request = Request(Body(100000));
  int fd = ConnectLoopback(transport_->port());
  ASSERT_TRUE(SendAll(fd, request.substr(0, request.size() / 2)));
  for (int i = 0; i < 200 && service_.placements() < 1; ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(service_.placements(), 1);
  EXPECT_FALSE(service_.last_released());
  ::close(fd);
  wait_released();
  EXPECT_TRUE(service_.last_released());
  EXPECT_EQ(limits.budget->used(), 0u);
  // Stalled with the connection open: cut at the deadline, released the same way.
  fd = ConnectLoopback(transport_->port());
  ASSERT_TRUE(SendAll(fd, request.substr(0, request.size() - 10)));
  for (int i = 0; i < 200 && service_.placements() < 2; ++i) absl::SleepFor(absl::Milliseconds(5));
  bool closed = false;
  ReadUntilClose(fd, absl::Seconds(3), &closed);
  EXPECT_TRUE(closed);
  ::close(fd);
  wait_released();
  EXPECT_TRUE(service_.last_released());
  EXPECT_EQ(limits.budget->used(), 0u);
}

// A declared body larger than the client's budget is refused on its headers: nothing is placed
// and no body byte is waited for.
TEST_F(HttpPlacedBodyTest, ADeclaredBodyOverTheBudgetIsRefusedBeforeItIsRead) {
  HttpLimits limits;
  limits.budget = std::make_shared<ByteBudget>(ByteBudgetLimits{1 << 20, 64 << 10, 1 << 10});
  Start(limits);
  const int fd = ConnectLoopback(transport_->port());
  SendAll(fd, "POST /placed HTTP/1.1\r\nContent-Length: 100000\r\n\r\n");  // no body follows
  const std::string r = ReadUntilClose(fd, absl::Seconds(2));
  ::close(fd);
  EXPECT_EQ(Status(r), "HTTP/1.1 503");
  EXPECT_EQ(service_.placements(), 0);
  EXPECT_EQ(limits.budget->used(), 0u);
}

// A body the service refuses after its prefix is read to its end and dropped, the refusal sent,
// and the connection goes on.
TEST_F(HttpPlacedBodyTest, ARefusedPlacementKeepsTheConnectionInStep) {
  HttpLimits limits;
  limits.budget = std::make_shared<ByteBudget>(ByteBudgetLimits{});
  service_.refuse = true;
  Start(limits);
  const int fd = ConnectLoopback(transport_->port());
  ASSERT_TRUE(SendAll(fd, Request(Body(50000))));
  std::string r = ReadOneResponse(fd, absl::Seconds(5));
  EXPECT_EQ(Status(r), "HTTP/1.1 400");
  ASSERT_TRUE(SendAll(fd, "POST /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"));
  r = ReadOneResponse(fd, absl::Seconds(5));
  EXPECT_EQ(Status(r), "HTTP/1.1 200");
  EXPECT_NE(r.find("{\"bytes\":3}"), std::string::npos);
  ::close(fd);
  for (int i = 0; i < 100 && limits.budget->used() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(limits.budget->used(), 0u);
}

}  // namespace
}  // namespace pswitch::frontend
