// The HTTP port's connections, on Boost.Beast over one Asio event loop, with the limits a hostile
// network needs: a cap on connections (at the cap, the connection that has waited longest for
// a request's headers is closed to admit the new one, so probes always get in), a deadline on a
// request's headers and one on the whole request, caps on header bytes and fields, a body read
// only once its declared size is charged to the shared byte budget, and a deadline on writing
// each response. A service may have a body's bulk received straight into memory of its own
// (HttpService::BodyPrefix, PlaceBody), and a response's bulk sent from memory of its own
// (HttpResponse::tail), so large tensors are never copied through a string. A slow client costs a
// socket and a few KB, never a thread.
//
// Why Beast: it parses incrementally into buffers we bound, and leaves the connection's life to
// us on an Asio loop like the TCP port's; cpp-httplib 0.11 gives a thread per connection and
// per-read timeouts only, libevent 2.1's evhttp has no connection cap, and libmicrohttpd's
// timeouts are per read (docs/architecture.md).
#ifndef PSWITCH_FRONTEND_HTTP_TRANSPORT_H_
#define PSWITCH_FRONTEND_HTTP_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "frontend/byte_budget.h"
#include "frontend/http_message.h"

namespace pswitch::frontend {

struct HttpLimits {
  size_t max_connections = 256;
  // A request's request line and headers must arrive whole within this of the connection being
  // ready for it (so an idle keep-alive connection is also closed after it).
  absl::Duration header_timeout = absl::Seconds(10);
  // Headers and body together (64 MiB in 60 s needs about 1.1 MB/s).
  absl::Duration request_timeout = absl::Seconds(60);
  // A response must be taken by the client within this.
  absl::Duration write_timeout = absl::Seconds(30);
  size_t max_header_bytes = 16 << 10;
  size_t max_header_fields = 100;
  size_t max_body_bytes = 64 << 20;
  // Request bodies and responses are charged here (null: no shared bound).
  std::shared_ptr<ByteBudget> budget;
};

// What the transport hands requests to. Both calls run on the transport's event loop and must
// not block: work that may wait goes to another thread, which answers through the responder.
class HttpService {
 public:
  virtual ~HttpService() = default;
  // After the headers, before any body byte is read: the client the request is charged to, or
  // an answer that makes reading the body pointless (unknown route, bad token).
  virtual std::variant<std::string, HttpResponse> Admit(const HttpRequest& head) = 0;
  // The whole request, its body charged to `request.charge`.
  virtual void Serve(HttpRequest request, HttpRespond respond) = 0;

  // Bodies received in place (Triton's binary tensor data): after Admit and the body's charge,
  // the number of the body's first bytes (at most `body_bytes`) to read into `request.body`
  // before PlaceBody says where the rest goes; nullopt (the default): the whole body is read
  // into `request.body`.
  virtual std::optional<uint64_t> BodyPrefix(const HttpRequest& head, uint64_t body_bytes) {
    (void)head;
    (void)body_bytes;
    return std::nullopt;
  }
  // With the prefix in `request.body` (the whole body still charged to `request.charge`, which
  // the service may shrink): where the remaining `rest_bytes` (> 0) go, spans adding up to
  // exactly that, received there by the kernel and handed to Serve in `request.placed`; or an
  // answer, sent once the rest has been read and dropped (the connection stays in step).
  // `connection` is the service's own state for this connection: null at first, dropped when
  // the connection closes. On the event loop, like Admit.
  virtual std::variant<std::shared_ptr<PlacedBody>, HttpResponse> PlaceBody(
      HttpRequest& request, uint64_t rest_bytes, std::shared_ptr<void>& connection) {
    (void)request;
    (void)rest_bytes;
    (void)connection;
    return HttpResponse{};
  }
};

class HttpTransport {
 public:
  // Listens on `listen` ("HOST:PORT", port 0: any free one) and serves on its own thread.
  // `*service` must outlive the transport.
  static absl::StatusOr<std::unique_ptr<HttpTransport>> Start(const std::string& listen,
                                                              HttpLimits limits,
                                                              HttpService* service);
  // Shutdown(absl::Seconds(2)) if not done.
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  uint16_t port() const;
  // Open connections (read on the event loop; a snapshot).
  size_t connections() const;
  // Stops accepting, lets responses being written finish for up to `grace`, closes every
  // connection and joins the event loop's thread. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  class Impl;
  explicit HttpTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_HTTP_TRANSPORT_H_
