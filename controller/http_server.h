// pswitchd's HTTP/JSON port for cluster schedulers, operators and standard inference clients:
// the Open Inference Protocol (KServe v2, as Triton serves it) over the same controller, tokens
// and roles as the TCP port. Served by cpp-httplib's own thread pool: a handler may wait for its
// task's answer (bounded), never on the scheduler's or the TCP port's event loop.
//
// Every error is {"error": "..."} with the status code the code maps to (400 bad input,
// 401/403, 404 unknown model, 409 conflict, 413 too large, 429 queue full, 503 not ready).
#ifndef PSWITCH_CONTROLLER_HTTP_SERVER_H_
#define PSWITCH_CONTROLLER_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "controller/auth.h"
#include "controller/client_quota.h"
#include "controller/controller.h"
#include "controller/fill_manager.h"
#include "controller/model_repository.h"
#include "controller/telemetry.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace pswitch::controller {

struct HttpServerOptions {
  // Bearer tokens (Authorization: Bearer ...) every request but the health checks presents
  // (null: none needed).
  const TokenTable* tokens = nullptr;
  // Who owns each task and each client's cap of unfinished tasks: the TCP port's, shared.
  TaskOwners* owners = nullptr;
  ClientQuota* quota = nullptr;
  size_t max_body_bytes = 64 << 20;
  // GET /metrics counts from here (null: 503); fill jobs and bubble cycles go there (null: 503).
  Telemetry* telemetry = nullptr;
  FillManager* fill = nullptr;
  // --model-repository: what POST /v2/repository/... lists and loads (null: none).
  const ModelRepository* repository = nullptr;
  // How long an infer request waits for its answer.
  absl::Duration infer_timeout = absl::Minutes(10);
  absl::Duration read_timeout = absl::Seconds(30);
};

// HTTP status for an absl status code.
int HttpStatus(absl::StatusCode code);

class HttpServer {
 public:
  // `listen` is "HOST:PORT" (port 0: any free one). `*controller` must outlive the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& listen,
                                                           Controller* controller,
                                                           HttpServerOptions options);
  // Stops accepting, answers requests in flight (those waiting on a task: 503) and joins the
  // server's threads. Call before the controller goes.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const { return port_; }
  // Every route served, as "METHOD /path/{param}" (OpenAPI's path templates), in order.
  const std::vector<std::string>& routes() const { return routes_; }

 private:
  HttpServer(Controller* controller, HttpServerOptions options);
  void Route();
  // Serves METHOD `path` (an OpenAPI path template) and lists it in routes().
  void Handle(const char* method, const std::string& path,
              std::function<void(const httplib::Request&, httplib::Response&)> handler);
  using Authorizer =
      std::function<std::optional<Principal>(const httplib::Request&, httplib::Response&)>;
  // GET /metrics, /v1/gpus, bubble cycles and fill jobs: the operator's side.
  void RouteOperations(const Authorizer& authorize);
  // Triton's model repository extension: index and load.
  void RouteRepository(const Authorizer& authorize);
  // /v1/tasks: training tasks, answered at once (their state is polled).
  void SubmitTraining(const Principal& who, const httplib::Request& req, httplib::Response& res);
  // POST /v2/models/{model}/infer: JSON tensors, or the binary tensor data extension.
  void Infer(const Principal& who, const std::string& model, const httplib::Request& req,
             httplib::Response& res);

  Controller* const controller_;
  const HttpServerOptions options_;
  absl::Notification stopping_;
  std::unique_ptr<httplib::Server> server_;
  uint16_t port_ = 0;
  std::vector<std::string> routes_;
  std::thread thread_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_HTTP_SERVER_H_
