// One HTTP request and its response as the HTTP port's routes see them, apart from the library
// that parses them (frontend/http_transport.cc): the routes can be read and tested without it.
#ifndef PSWITCH_FRONTEND_HTTP_MESSAGE_H_
#define PSWITCH_FRONTEND_HTTP_MESSAGE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "frontend/byte_budget.h"
#include "frontend/peer_uid_memo.h"

namespace pswitch::frontend {

// Where the rest of a request's body was received (HttpService::PlaceBody): memory the service
// gave, written by the kernel's recv alone. The service subclasses it to keep what the memory
// belongs to (a staging lease, the decoded header); the transport only fills `spans`.
class PlacedBody {
 public:
  virtual ~PlacedBody() = default;
  // The body after its prefix, in the order it arrives: each span filled whole before the next.
  // Their sizes add up to the bytes PlaceBody was asked to place. Must stay valid while the
  // PlacedBody lives.
  std::vector<absl::Span<uint8_t>> spans;
};

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // the target without its query
  std::map<std::string, std::string> query;    // decoded parameters
  std::map<std::string, std::string> headers;  // names in lower case; a repeated one: the last
  // The whole body, or (a body placed by the service, `placed` set) only its prefix.
  std::string body;
  std::shared_ptr<PlacedBody> placed;
  std::vector<std::string> params;  // the route's {param} segments, in order
  std::string peer;                 // the client's address
  int64_t arrival_ns = 0;           // its head was read (CLOCK_MONOTONIC): the breakdown's zero
  uint16_t peer_port = 0;
  std::string local_address;  // the server's end of the connection
  uint16_t local_port = 0;
  // The connection's, shared by its requests: its peer's uid, asked of the kernel once.
  std::shared_ptr<PeerUidMemo> peer_uid;
  // The bytes this request holds (its body, and what is decoded from it) on the shared budget;
  // released when the request (or whoever the charge is moved to) goes.
  BudgetCharge charge;

  bool has_header(absl::string_view name) const {
    return headers.count(absl::AsciiStrToLower(name)) > 0;
  }
  std::string header(absl::string_view name) const {
    auto it = headers.find(absl::AsciiStrToLower(name));
    return it == headers.end() ? std::string() : it->second;
  }
  bool has_param(const std::string& name) const { return query.count(name) > 0; }
  std::string param_value(const std::string& name) const {
    auto it = query.find(name);
    return it == query.end() ? std::string() : it->second;
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Bytes sent after `body` as they lie (one gathered write, never copied into a string), e.g.
  // binary outputs in a staging region; `tail_owner` keeps them valid until they are written.
  // Content-Length counts them. Bytes the owner holds are charged where the owner says, not as
  // the reply's.
  std::vector<absl::Span<const uint8_t>> tail;
  std::shared_ptr<const void> tail_owner;

  void set_header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
  }
  void set_content(std::string text, std::string type) {
    body = std::move(text);
    content_type = std::move(type);
  }
};

// Makes `res` the port's error answer: `status` with {"error": message} (invalid UTF-8 in the
// message replaced, never thrown over). Headers already set stay.
void SetJsonError(HttpResponse& res, int status, absl::string_view message);
inline HttpResponse JsonError(int status, absl::string_view message) {
  HttpResponse res;
  SetJsonError(res, status, message);
  return res;
}

// Answers a request; callable from any thread. Only the first call of a request's responder
// counts (a timeout and a late answer may race).
using HttpRespond = std::function<void(HttpResponse)>;

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_HTTP_MESSAGE_H_
