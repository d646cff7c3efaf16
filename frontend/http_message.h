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
#include "frontend/byte_budget.h"
#include "frontend/peer_uid_memo.h"

namespace pswitch::frontend {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // the target without its query
  std::map<std::string, std::string> query;    // decoded parameters
  std::map<std::string, std::string> headers;  // names in lower case; a repeated one: the last
  std::string body;
  std::vector<std::string> params;  // the route's {param} segments, in order
  std::string peer;                 // the client's address
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
