#include "frontend/http_transport.h"

// One event-loop thread owns every connection. A connection is a Session in one of four states:
// waiting for a request's headers (or idle between requests), reading a body, serving (the
// request is with the service, nothing is read), and writing the response. Its deadlines are
// the tcp_stream's: a whole-headers deadline when it starts waiting, the rest of the request's
// deadline for the body, a write deadline for the response; Beast cancels the operation and
// the session closes. Responders post back to the loop and hold only a weak reference, so a
// closed connection's late answer is dropped.
//
// A body the service places (HttpService::BodyPrefix/PlaceBody) leaves Beast's parser after the
// headers: its prefix is read into a string, then the rest straight into the service's spans
// with reads as large as the spans (Asio's default completion conditions stop each read at
// 64 KB). Only bytes that arrived with the headers, in the header buffer, are copied out of it.
// Responses go out as one gathered write: Beast's serialized header, the body string, and the
// service's tail spans where they lie.

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <list>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/clock.h"
#include "base/log.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "frontend/http_target.h"
#include "frontend/listen_address.h"

namespace pswitch::frontend {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(d));
}

// A completion condition for reading or writing buffers whole, in as few system calls as the
// kernel allows: Asio's transfer_all caps each read or write at 64 KB.
struct TransferWhole {
  size_t operator()(const beast::error_code& ec, size_t) const { return ec ? 0 : size_t{1} << 30; }
};

// A response on its way out: the buffers of one gathered write, kept alive until it completes.
struct Outgoing {
  std::string head;  // status line and fields
  std::string body;
  std::vector<absl::Span<const uint8_t>> tail;
  std::shared_ptr<const void> tail_owner;
  bool keep_alive = false;

  std::vector<net::const_buffer> Buffers() const {
    std::vector<net::const_buffer> out;
    out.reserve(2 + tail.size());
    out.emplace_back(head.data(), head.size());
    if (!body.empty()) out.emplace_back(body.data(), body.size());
    for (absl::Span<const uint8_t> t : tail) {
      if (!t.empty()) out.emplace_back(t.data(), t.size());
    }
    return out;
  }
};

}  // namespace

class HttpTransport::Impl {
 public:
  Impl(HttpLimits limits, HttpService* service) : limits_(std::move(limits)), service_(service) {}

  absl::Status Listen(const std::string& listen);
  void Run() {
    {
      absl::MutexLock lock(&loop_ref_->mu);
      loop_ref_->io = &io_;
    }
    thread_ = std::thread([this] {
      io_.run();
      io_done_.Notify();
    });
  }
  void Shutdown(absl::Duration grace);
  uint16_t port() const { return port_; }
  size_t connections() const { return open_.load(std::memory_order_relaxed); }

  class Session;

 private:
  friend class Session;
  void Accept();
  void Admit(tcp::socket socket);
  // Closes the session that has waited longest for its headers; false if none waits.
  bool EvictOldestWaiting();

  const HttpLimits limits_;
  HttpService* const service_;
  // Declared before io_: sessions that io_'s destructor destroys still count themselves out.
  std::atomic<size_t> open_{0};
  // Responders post through this; it forgets io_ once the loop has stopped, so an answer that
  // comes later (a task finishing after shutdown) is dropped instead of posted to a dead loop.
  struct LoopRef {
    absl::Mutex mu;
    net::io_context* io ABSL_GUARDED_BY(mu) = nullptr;
  };
  const std::shared_ptr<LoopRef> loop_ref_ = std::make_shared<LoopRef>();
  net::io_context io_{1};
  net::executor_work_guard<net::io_context::executor_type> keep_running_{io_.get_executor()};
  tcp::acceptor acceptor_{io_};
  uint16_t port_ = 0;
  // Event-loop thread only.
  std::list<std::weak_ptr<Session>> sessions_;
  // Sessions whose request is with the service: kept alive here, not by their responders.
  std::set<std::shared_ptr<Session>> serving_;
  bool shut_down_ = false;
  absl::Notification io_done_;
  std::thread thread_;
};

class HttpTransport::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  enum class State { kWaiting, kBody, kServing, kWriting, kLingering, kClosed };
  static constexpr size_t kMaxLingerBytes = 1 << 20;

  Session(Impl* owner, tcp::socket socket) : owner_(owner), stream_(std::move(socket)) {
    owner_->open_.fetch_add(1, std::memory_order_relaxed);
    beast::error_code ec;
    const tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
    if (!ec) {
      peer_ = peer.address().to_string();
      peer_port_ = peer.port();
    }
    // Both ends, so a route can ask the kernel who owns a loopback peer's socket.
    const tcp::endpoint local = stream_.socket().local_endpoint(ec);
    if (!ec) {
      local_address_ = local.address().to_string();
      local_port_ = local.port();
    }
    // Headers and body go out as separate segments: no Nagle delay on the second.
    stream_.socket().set_option(tcp::no_delay(true), ec);
  }
  ~Session() { owner_->open_.fetch_sub(1, std::memory_order_relaxed); }

  State state() const { return state_; }
  // Whether the current request was admitted for no client (an open route, or not yet admitted).
  bool admitted_nobody() const { return client_ == kUnauthenticatedClient; }
  Clock::time_point waiting_since() const { return waiting_since_; }

  void Start() {
    state_ = State::kWaiting;
    waiting_since_ = Clock::now();
    request_deadline_ = waiting_since_ + ToChrono(owner_->limits_.request_timeout);
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(owner_->limits_.max_header_bytes));
    parser_->body_limit(owner_->limits_.max_body_bytes);
    stream_.expires_after(ToChrono(owner_->limits_.header_timeout));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  // After a last response: stops sending and reads (and drops) what the peer still sends, for a
  // short while, before closing. Closing with unread bytes would send a reset, which can destroy
  // the response before the peer reads it (nginx's lingering_close).
  void Linger() {
    if (state_ == State::kClosed) return;
    state_ = State::kLingering;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    linger_left_ = kMaxLingerBytes;
    stream_.expires_after(std::chrono::seconds(1));
    DrainSome();
  }

  void Close() {
    if (state_ == State::kClosed) return;
    state_ = State::kClosed;
    owner_->serving_.erase(shared_from_this());
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    // A body cut short gives back what it was received into (a staging lease) and its charge
    // now, not when the last pending handler lets the session go.
    request_ = HttpRequest{};
    service_state_.reset();
  }

 private:
  void OnHeader(beast::error_code ec) {
    if (state_ == State::kClosed) return;
    // Until the service admits this request, what it costs is nobody's (not the last request's).
    client_ = std::string(kUnauthenticatedClient);
    if (ec == http::error::header_limit) {
      return Fail(431, "request headers too large");
    }
    if (ec == http::error::body_limit) {  // a Content-Length over the cap, seen with the headers
      return Fail(413,
                  absl::StrCat("request body over ", owner_->limits_.max_body_bytes, " bytes"));
    }
    if (ec) {
      // Timeouts and peers that hang up are cut silently; garbage gets a 400.
      if (ec == beast::error::timeout || ec == http::error::end_of_stream ||
          ec == net::error::eof || ec == net::error::operation_aborted ||
          ec == net::error::connection_reset) {
        return Close();
      }
      return Fail(400, "malformed request");
    }
    const auto& head = parser_->get();
    size_t fields = 0;
    for (auto it = head.begin(); it != head.end(); ++it) ++fields;
    if (fields > owner_->limits_.max_header_fields) {
      return Fail(431,
                  absl::StrCat("more than ", owner_->limits_.max_header_fields, " header fields"));
    }
    if (parser_->chunked()) {
      return Fail(411, "send the body with a Content-Length (chunked bodies are not taken)");
    }
    keep_alive_ = head.keep_alive();
    request_ = HttpRequest{};
    request_.method = std::string(head.method_string());
    SplitTarget(absl::string_view(head.target().data(), head.target().size()), &request_.path,
                &request_.query);
    for (const auto& field : head) {
      request_.headers[absl::AsciiStrToLower(absl::string_view(
          field.name_string().data(), field.name_string().size()))] = std::string(field.value());
    }
    request_.arrival_ns = base::MonotonicNowNs();
    request_.peer = peer_;
    request_.peer_port = peer_port_;
    request_.local_address = local_address_;
    request_.local_port = local_port_;
    request_.peer_uid = peer_uid_;
    const uint64_t body_bytes = parser_->content_length().value_or(0);
    if (body_bytes > owner_->limits_.max_body_bytes) {
      return Fail(413,
                  absl::StrCat("request body over ", owner_->limits_.max_body_bytes, " bytes"));
    }
    std::variant<std::string, HttpResponse> admitted = owner_->service_->Admit(request_);
    if (auto* answer = std::get_if<HttpResponse>(&admitted)) {
      // The body, if any, is not read: the connection cannot carry another request.
      if (body_bytes > 0) keep_alive_ = false;
      return Write(std::move(*answer));
    }
    client_ = std::get<std::string>(admitted);
    request_.charge = BudgetCharge(owner_->limits_.budget, client_);
    if (absl::Status s = request_.charge.Resize(body_bytes); !s.ok()) {
      HttpResponse busy = JsonError(503, std::string(s.message()));
      busy.set_header("Retry-After", "1");
      keep_alive_ = false;
      return Write(std::move(busy));
    }
    if (parser_->is_done()) return Serve();
    state_ = State::kBody;
    stream_.expires_at(request_deadline_);
    if (std::optional<uint64_t> prefix = owner_->service_->BodyPrefix(request_, body_bytes);
        prefix.has_value() && *prefix <= body_bytes) {
      return ReadPrefix(*prefix, body_bytes - *prefix);
    }
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void DrainSome() {
    stream_.async_read_some(net::buffer(drain_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec || n >= self->linger_left_) return self->Close();
                              self->linger_left_ -= n;
                              self->DrainSome();
                            });
  }

  // Copies up to `bytes` of what arrived with the headers (the header buffer) to `to`.
  size_t TakeBuffered(uint8_t* to, size_t bytes) {
    const size_t n = std::min(bytes, buffer_.size());
    if (n == 0) return 0;
    std::memcpy(to, buffer_.data().data(), n);
    buffer_.consume(n);
    return n;
  }

  // A placed body: its first `prefix` bytes into the request's body, then OnPrefix.
  void ReadPrefix(uint64_t prefix, uint64_t rest) {
    parser_.reset();  // the body is read here, not by Beast
    placed_rest_ = rest;
    request_.body.resize(prefix);  // within the body's charge
    uint8_t* to = reinterpret_cast<uint8_t*>(request_.body.data());
    const size_t have = TakeBuffered(to, prefix);
    if (have == prefix) return OnPrefix({});
    net::async_read(
        stream_, net::buffer(to + have, prefix - have), TransferWhole{},
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnPrefix(ec); });
  }

  void OnPrefix(beast::error_code ec) {
    if (state_ == State::kClosed) return;
    if (ec) return Close();  // a timeout or a peer gone: nothing can be answered
    if (placed_rest_ == 0) return Serve();
    auto placed = owner_->service_->PlaceBody(request_, placed_rest_, service_state_);
    if (auto* answer = std::get_if<HttpResponse>(&placed)) {
      request_.charge.Reset();  // dropped bytes are held nowhere
      return Discard(placed_rest_, std::move(*answer));
    }
    std::shared_ptr<PlacedBody> body = std::move(std::get<std::shared_ptr<PlacedBody>>(placed));
    uint64_t spanned = 0;
    if (body != nullptr) {
      for (absl::Span<uint8_t> span : body->spans) spanned += span.size();
    }
    if (body == nullptr || spanned != placed_rest_) {
      request_.charge.Reset();
      return Discard(placed_rest_, JsonError(500, "the body's placement does not match its size"));
    }
    request_.placed = body;
    // What arrived with the headers first, then the rest straight from the socket.
    std::vector<net::mutable_buffer> unread;
    for (absl::Span<uint8_t> span : body->spans) {
      const size_t have = TakeBuffered(span.data(), span.size());
      if (have < span.size()) unread.emplace_back(span.data() + have, span.size() - have);
    }
    if (unread.empty()) return Serve();
    net::async_read(stream_, unread, TransferWhole{},
                    [self = shared_from_this(), body](beast::error_code ec, size_t) {
                      if (self->state_ == State::kClosed) return;
                      if (ec) return self->Close();
                      self->Serve();
                    });
  }

  // Reads and drops the body's last `rest` bytes, then sends `answer`: a request refused after
  // its headers were read keeps the connection in step (within the request's deadline).
  void Discard(uint64_t rest, HttpResponse answer) {
    const size_t buffered = std::min<uint64_t>(rest, buffer_.size());
    buffer_.consume(buffered);
    discard_left_ = rest - buffered;
    pending_answer_ = std::move(answer);
    DiscardSome();
  }

  void DiscardSome() {
    if (discard_left_ == 0) return Write(std::move(pending_answer_));
    const size_t n = std::min<uint64_t>(discard_left_, drain_.size());
    stream_.async_read_some(net::buffer(drain_.data(), n),
                            [self = shared_from_this()](beast::error_code ec, size_t got) {
                              if (self->state_ == State::kClosed) return;
                              if (ec) return self->Close();
                              self->discard_left_ -= got;
                              self->DiscardSome();
                            });
  }

  void OnBody(beast::error_code ec) {
    if (state_ == State::kClosed) return;
    if (ec == http::error::body_limit) return Fail(413, "request body too large");
    // A timeout has already closed the socket (Beast's tcp_stream): nothing can be answered.
    if (ec) return Close();
    Serve();
  }

  void Serve() {
    state_ = State::kServing;
    stream_.expires_never();
    if (parser_.has_value()) {  // a placed body's prefix is in request_.body already
      request_.body = std::move(parser_->get().body());
      parser_.reset();
    }
    // The body's bytes are the request's now; the charge follows it. The loop keeps the session
    // alive while it is served (Impl::serving_); the responder holds it weakly, so an answer that
    // comes after the connection or the transport is gone is dropped.
    owner_->serving_.insert(shared_from_this());
    auto answered = std::make_shared<std::atomic<bool>>(false);
    HttpRespond respond = [weak = weak_from_this(), loop = owner_->loop_ref_,
                           answered](HttpResponse response) {
      if (answered->exchange(true)) return;
      absl::MutexLock lock(&loop->mu);
      if (loop->io == nullptr) return;
      net::post(*loop->io, [weak, response = std::move(response)]() mutable {
        if (std::shared_ptr<Session> self = weak.lock()) self->Write(std::move(response));
      });
    };
    owner_->service_->Serve(std::move(request_), std::move(respond));
  }

  void Fail(int status, std::string message) {
    keep_alive_ = false;
    Write(JsonError(status, std::move(message)));
  }

  void Write(HttpResponse response) {
    if (state_ == State::kClosed) return;
    state_ = State::kWriting;
    request_.charge.Reset();
    owner_->serving_.erase(shared_from_this());
    // Replies to requests no client was admitted for (errors, health probes, the API document)
    // are small and bounded by the connection cap; charging them to the unauthenticated pool
    // would let a flood of unread ones turn every probe's answer into a 503.
    reply_charge_ =
        BudgetCharge(client_ == kUnauthenticatedClient ? nullptr : owner_->limits_.budget, client_);
    if (absl::Status s = reply_charge_.Resize(response.body.size()); !s.ok()) {
      response = JsonError(503, absl::StrCat("the reply of ", response.body.size(),
                                             " bytes does not fit: ", s.message()));
      keep_alive_ = false;
    }
    auto out = std::make_shared<Outgoing>();
    uint64_t length = response.body.size();
    for (absl::Span<const uint8_t> t : response.tail) length += t.size();
    http::response<http::empty_body> head;
    head.version(11);
    head.result(static_cast<unsigned>(response.status));
    head.set(http::field::server, "pswitchd");
    head.set(http::field::content_type, response.content_type);
    for (auto& [name, value] : response.headers) head.set(name, value);
    out->keep_alive = keep_alive_ && !owner_->shut_down_;
    head.keep_alive(out->keep_alive);
    head.content_length(length);
    std::ostringstream serialized;
    serialized << head;
    out->head = std::move(serialized).str();
    out->body = std::move(response.body);
    out->tail = std::move(response.tail);
    out->tail_owner = std::move(response.tail_owner);
    stream_.expires_after(ToChrono(owner_->limits_.write_timeout));
    net::async_write(stream_, out->Buffers(), TransferWhole{},
                     [self = shared_from_this(), out](beast::error_code ec, size_t) {
                       self->reply_charge_.Reset();
                       if (ec) return self->Close();
                       if (!out->keep_alive) return self->Linger();
                       self->Start();
                     });
  }

  Impl* const owner_;
  beast::tcp_stream stream_;
  // Bounded: the header limit plus one read's worth of body.
  beast::flat_buffer buffer_{(size_t{64} << 10) + owner_->limits_.max_header_bytes};
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string peer_;
  uint16_t peer_port_ = 0;
  std::string local_address_;
  uint16_t local_port_ = 0;
  // Who the peer is never changes on a connection: looked up once, by its first request.
  const std::shared_ptr<PeerUidMemo> peer_uid_ = std::make_shared<PeerUidMemo>();
  std::string client_;  // the current request's, as the service admitted it
  HttpRequest request_;
  BudgetCharge reply_charge_;
  size_t linger_left_ = 0;
  std::array<char, 16 << 10> drain_;
  uint64_t placed_rest_ = 0;             // a placed body's bytes after its prefix
  uint64_t discard_left_ = 0;            // a refused body's bytes still to drop
  HttpResponse pending_answer_;          // sent once they are dropped
  std::shared_ptr<void> service_state_;  // HttpService::PlaceBody's, for this connection
  State state_ = State::kWaiting;
  bool keep_alive_ = false;
  Clock::time_point waiting_since_;
  Clock::time_point request_deadline_;
};

absl::Status HttpTransport::Impl::Listen(const std::string& listen) {
  absl::StatusOr<ListenAddress> split = SplitListen(listen);
  if (!split.ok()) return split.status();
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(split->host, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("bad HTTP listen host '", split->host, "'"));
  const tcp::endpoint endpoint(address, split->port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  // A connection that never sends waits in the kernel, not in one of our slots.
  if (!ec) {
    DeferAcceptUntilData(acceptor_.native_handle(),
                         static_cast<int>(absl::ToInt64Seconds(limits_.header_timeout)));
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("HTTP listen on ", listen, " failed: ", ec.message()));
  }
  port_ = acceptor_.local_endpoint().port();
  Accept();
  return absl::OkStatus();
}

void HttpTransport::Impl::Accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (!acceptor_.is_open() || ec == net::error::operation_aborted) return;
      // Out of fds and the like: try again shortly rather than spin or stop for good.
      base::Log(base::LogLevel::kError, "accept_failed")
          .Field("server", "http")
          .Field("error", ec.message());
      auto timer = std::make_shared<net::steady_timer>(io_, std::chrono::milliseconds(100));
      timer->async_wait([this, timer](beast::error_code) {
        if (acceptor_.is_open()) Accept();
      });
      return;
    }
    Admit(std::move(socket));
    Accept();
  });
}

bool HttpTransport::Impl::EvictOldestWaiting() {
  // Cheapest to lose first: a connection already closing (lingering after its last answer),
  // then one waiting for its headers (idle or slow), then one whose request no client was
  // admitted for (an open route's body or reply, unauthenticated). Oldest first within each.
  auto rank = [](const Session& s) {
    switch (s.state()) {
      case Session::State::kLingering:
        return 0;
      case Session::State::kWaiting:
        return 1;
      case Session::State::kBody:
      case Session::State::kWriting:
        return s.admitted_nobody() ? 2 : 3;
      default:
        return 3;
    }
  };
  std::shared_ptr<Session> victim;
  int victim_rank = 3;
  for (const std::weak_ptr<Session>& weak : sessions_) {
    std::shared_ptr<Session> s = weak.lock();
    if (s == nullptr) continue;
    const int r = rank(*s);
    if (r < victim_rank ||
        (r == victim_rank && victim != nullptr && s->waiting_since() < victim->waiting_since())) {
      victim = std::move(s);
      victim_rank = r;
    }
  }
  if (victim == nullptr) return false;
  victim->Close();
  return true;
}

void HttpTransport::Impl::Admit(tcp::socket socket) {
  if (shut_down_) return;
  sessions_.remove_if([](const std::weak_ptr<Session>& s) {
    std::shared_ptr<Session> live = s.lock();
    return live == nullptr || live->state() == Session::State::kClosed;
  });
  if (sessions_.size() >= limits_.max_connections && !EvictOldestWaiting()) {
    base::Log(base::LogLevel::kWarn, "http_connection_refused")
        .Field("connections", sessions_.size())
        .Field("reason", "every connection is busy with a request");
    beast::error_code ec;
    socket.close(ec);
    return;
  }
  auto session = std::make_shared<Session>(this, std::move(socket));
  sessions_.push_back(session);
  session->Start();
}

void HttpTransport::Impl::Shutdown(absl::Duration grace) {
  if (!thread_.joinable()) return;
  net::post(io_, [this] {
    shut_down_ = true;
    beast::error_code ec;
    acceptor_.close(ec);
    // Connections not writing a response are closed now; those writing get `grace`.
    for (const std::weak_ptr<Session>& weak : sessions_) {
      if (std::shared_ptr<Session> s = weak.lock(); s && s->state() != Session::State::kWriting) {
        s->Close();
      }
    }
  });
  keep_running_.reset();
  if (!io_done_.WaitForNotificationWithTimeout(grace)) {
    net::post(io_, [this] {
      for (const std::weak_ptr<Session>& weak : sessions_) {
        if (std::shared_ptr<Session> s = weak.lock()) s->Close();
      }
    });
    if (!io_done_.WaitForNotificationWithTimeout(absl::Seconds(5))) io_.stop();
  }
  thread_.join();
  absl::MutexLock lock(&loop_ref_->mu);
  loop_ref_->io = nullptr;
}

HttpTransport::HttpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<HttpTransport>> HttpTransport::Start(const std::string& listen,
                                                                    HttpLimits limits,
                                                                    HttpService* service) {
  auto impl = std::make_unique<Impl>(std::move(limits), service);
  if (absl::Status s = impl->Listen(listen); !s.ok()) return s;
  impl->Run();
  return std::unique_ptr<HttpTransport>(new HttpTransport(std::move(impl)));
}

HttpTransport::~HttpTransport() { impl_->Shutdown(absl::Seconds(2)); }

uint16_t HttpTransport::port() const { return impl_->port(); }
size_t HttpTransport::connections() const { return impl_->connections(); }
void HttpTransport::Shutdown(absl::Duration grace) { impl_->Shutdown(grace); }

}  // namespace pswitch::frontend
