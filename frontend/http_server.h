// pswitchd's HTTP/JSON port for cluster schedulers, operators and standard inference clients:
// the Open Inference Protocol (KServe v2, as Triton serves it) over the same controller, tokens
// and roles as the TCP port. Connections and their limits are HttpTransport's (one event loop);
// the routes here run on a small pool of handler threads, except the health checks, which are
// answered on the event loop itself so a probe is answered however busy the pool is. Nothing
// waits for a task or a registration on a thread: those answer when the controller calls back.
//
// Every error is {"error": "..."} with the status code the code maps to (400 bad input,
// 401/403, 404 unknown model, 409 conflict, 413 too large, 429 queue full, 501 not served by
// this backend, 503 not ready).
#ifndef PSWITCH_FRONTEND_HTTP_SERVER_H_
#define PSWITCH_FRONTEND_HTTP_SERVER_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/controller.h"
#include "controller/fill_manager.h"
#include "controller/telemetry.h"
#include "dataplane/region_table.h"
#include "frontend/admission.h"
#include "frontend/auth.h"
#include "frontend/client_quota.h"
#include "frontend/handler_pool.h"
#include "frontend/http_message.h"
#include "frontend/http_transport.h"
#include "frontend/triton_shm.h"
#include "frontend/waiting_requests.h"
#include "registry/model_repository.h"

namespace pswitch::frontend {

using controller::Controller;
using controller::FillManager;
using controller::Telemetry;
using registry::ModelRepository;

// Bodies of requests other than infer (tasks, fill jobs, cycles, repository requests) are small
// JSON documents, parsed whole.
inline constexpr size_t kMaxControlBodyBytes = 1 << 20;

struct HttpServerOptions {
  // Bearer tokens (Authorization: Bearer ...) every request but the health checks presents
  // (null: none needed).
  const TokenTable* tokens = nullptr;
  // Who owns each task and each client's cap of unfinished tasks: the TCP port's, shared.
  TaskOwners* owners = nullptr;
  ClientQuota* quota = nullptr;
  // The one admission path (quota, owners, who may see and change a model, input checks): the
  // TCP port's, shared. Required.
  TaskAdmission* admission = nullptr;
  // Connections, deadlines, header and body caps, and the byte budget shared with the TCP port.
  HttpLimits limits;
  // Handler threads, and requests that may wait for one (beyond: 503).
  size_t handler_threads = 4;
  size_t max_queued_requests = 256;
  // GET /metrics counts from here (null: 503); fill jobs and bubble cycles go there (null: 503).
  Telemetry* telemetry = nullptr;
  FillManager* fill = nullptr;
  // --model-repository: what POST /v2/repository/... lists and loads (null: none).
  const ModelRepository* repository = nullptr;
  // The longest an infer request, a load or an unload waits for its answer.
  absl::Duration infer_timeout = absl::Minutes(10);
  // Where Triton's shared-memory regions are registered: the transfer regions every port shares
  // (docs/dataplane.md), so admission finds them whichever port a task comes from. Null: the
  // server keeps a table of its own (tests).
  dataplane::RegionTable* regions = nullptr;
  // /v2/cudasharedmemory is served on the CUDA backend only (the host backend answers 501).
  bool cuda_shared_memory = false;
  // Where system shared-memory keys are looked up; a test's own directory in tests.
  std::string shm_dir = "/dev/shm";
};

// HTTP status for an absl status code.
int HttpStatus(absl::StatusCode code);

class HttpServer : private HttpService {
 public:
  // `listen` is "HOST:PORT" (port 0: any free one). `*controller` must outlive the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& listen,
                                                           Controller* controller,
                                                           HttpServerOptions options);
  // Stops accepting, answers requests still waiting on a task, a load or an unload with 503,
  // and joins the server's threads. Call before the controller goes.
  ~HttpServer() override;
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const { return transport_->port(); }
  size_t connections() const { return transport_->connections(); }
  // Every route served, as "METHOD /path/{param}" (OpenAPI's path templates), in order.
  std::vector<std::string> routes() const;

 private:
  // A handler that answers at once, and one that answers later through the responder.
  using SyncHandler = std::function<void(const HttpRequest&, HttpResponse&)>;
  using AsyncHandler = std::function<void(HttpRequest, HttpRespond)>;
  enum class Where { kEventLoop, kPool };
  struct Route {
    std::string method;
    std::vector<std::string> segments;  // "{x}" matches any one segment
    std::string path;                   // the template, for routes()
    Where where = Where::kPool;
    bool open = false;  // served without a token (health checks, the API document)
    size_t max_body_bytes = kMaxControlBodyBytes;
    // An async route's requests whose body has at most this many bytes run on the transport's
    // loop: decoding them costs less than the hand-over to the pool and back (0: never).
    size_t loop_body_bytes = 0;
    std::variant<SyncHandler, AsyncHandler> handler;
  };

  HttpServer(Controller* controller, HttpServerOptions options);
  void AddRoutes();
  Route& Handle(const char* method, const std::string& path, SyncHandler handler);
  Route& HandleAsync(const char* method, const std::string& path, AsyncHandler handler);
  // The route for a method and path, and its {param} values; null when none matches.
  const Route* Find(const std::string& method, const std::string& path,
                    std::vector<std::string>* params) const;

  // HttpService, on the transport's event loop.
  std::variant<std::string, HttpResponse> Admit(const HttpRequest& head) override;
  void Serve(HttpRequest request, HttpRespond respond) override;
  // An infer body with binary tensor data: its JSON header read first, decoded here, and its
  // binary data received straight into a staging region of the connection's (http_staging.h).
  std::optional<uint64_t> BodyPrefix(const HttpRequest& head, uint64_t body_bytes) override;
  std::variant<std::shared_ptr<PlacedBody>, HttpResponse> PlaceBody(
      HttpRequest& request, uint64_t rest_bytes, std::shared_ptr<void>& connection) override;

  // Who sent a request: its principal and, where the kernel or the token file says, its uid on
  // this machine (which shared-memory segments it may have mapped).
  struct Caller {
    Principal principal;
    std::optional<uid_t> uid;
  };
  // The caller, or nullopt with the refusal (401, 503) written to `res`. Without tokens, a
  // loopback peer is the uid that owns its socket (PrincipalOfUid); a peer beyond loopback
  // (only with --insecure) is an anonymous admin, as before.
  std::optional<Caller> Identify(const HttpRequest& req, HttpResponse& res) const;
  using Authorizer = std::function<std::optional<Principal>(const HttpRequest&, HttpResponse&)>;
  // GET /metrics, /v1/gpus, bubble cycles and fill jobs: the operator's side.
  void RouteOperations(const Authorizer& authorize);
  // Triton's model repository extension: index, load and unload.
  void RouteRepository(const Authorizer& authorize);
  // Triton's system and CUDA shared-memory extensions (frontend/http_shared_memory.cc).
  void RouteSharedMemory();
  // /v1/tasks: training tasks, answered at once (their state is polled).
  void SubmitTraining(const Principal& who, const HttpRequest& req, HttpRespond respond);
  // POST /v2/models/{model}/infer: JSON tensors, or the binary tensor data extension.
  void Infer(const Principal& who, HttpRequest req, HttpRespond respond);

  // Load and unload requests checked: false with the refusal in `res`.
  bool CheckLoad(const Authorizer& authorize, const HttpRequest& req, HttpResponse& res,
                 std::optional<std::string>* config);
  bool CheckUnload(const Authorizer& authorize, const HttpRequest& req, HttpResponse& res);

  Controller* const controller_;
  const HttpServerOptions options_;
  std::vector<Route> routes_;  // fixed after AddRoutes()
  HandlerPool pool_;
  std::unique_ptr<dataplane::RegionTable> own_regions_;  // when the options gave none
  dataplane::RegionTable* const regions_;
  TritonRegions triton_regions_;
  // Held by the controller's callbacks too, so one that fires after the server is gone is safe.
  const std::shared_ptr<WaitingRequests> waiting_;
  std::thread sweeper_;  // answers waiting requests past their deadline
  // Last: destroyed (and so stopped) first, while the members its calls use still exist.
  std::unique_ptr<HttpTransport> transport_;
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_HTTP_SERVER_H_
