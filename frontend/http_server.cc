#include "frontend/http_server.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "api/client_codec.h"
#include "base/clock.h"
#include "base/json.h"
#include "base/log.h"
#include "base/status.h"
#include "base/text.h"
#include "fill/bubble_cycle.h"
#include "frontend/http_staging.h"
#include "frontend/kserve_codec.h"
#include "frontend/listen_address.h"
#include "frontend/memory_return.h"
#include "frontend/openapi_doc.h"
#include "frontend/peer_identity.h"
#include "frontend/requests.h"
#include "frontend/staging_mapping.h"
#include "nlohmann/json.hpp"
#include "proto/client_generated.h"
#include "proto/host_tensor.h"

namespace pswitch::frontend {

using controller::FillJobStatus;
using controller::FillRequest;
using controller::FillStats;
using controller::GpuGauges;
using controller::GpuScheduler;
using controller::GpuSnapshot;
using controller::kFillModelPrefix;
using controller::NodeGauges;
using controller::TaskKind;
using controller::TaskOutcome;
using controller::TaskSpec;
using controller::TaskStatus;
using registry::CatalogEntry;
using registry::EntryRef;
using registry::TensorSpec;

namespace {

using nlohmann::json;

// Our own values only; invalid UTF-8 (never expected) is replaced rather than thrown over.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A request body this large, once freed, makes the server give memory back to the system.
constexpr size_t kTrimAfterBytes = size_t{16} << 20;

// An infer request's body up to this size (a JSON document whose tensors are in shared memory,
// or a few values) is decoded on the transport's loop; larger ones on the handler pool.
constexpr size_t kInferOnLoopBodyBytes = 4 << 10;
// An infer answer whose outputs hold at most this many bytes, wherever they lie, is encoded
// where the outcome arrives: a few values or descriptors take less than a hand-over.
constexpr uint64_t kEncodeOnLoopBytes = 1 << 10;

uint64_t OutputBytes(const std::vector<proto::HostTensor>& outputs) {
  uint64_t bytes = 0;
  for (const proto::HostTensor& t : outputs) bytes += proto::ByteLength(t);
  return bytes;
}

void Reply(HttpResponse& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void ReplyError(HttpResponse& res, const absl::Status& status) {
  SetJsonError(res, HttpStatus(status.code()), status.message());
}

// ReplyError, for checks that answer whether the request may go on.
bool Refuse(HttpResponse& res, const absl::Status& status) {
  ReplyError(res, status);
  return false;
}

json SpecJson(const TensorSpec& spec) {
  return json{
      {"name", spec.name}, {"datatype", KserveDTypeName(spec.dtype)}, {"shape", spec.shape}};
}

json TaskJson(const TaskStatus& t) {
  json j{{"task_id", t.task_id},
         {"model", t.model},
         {"state", std::string(api::TaskStateName(t.state))},
         {"iterations_done", t.iterations_done},
         {"preemptions", t.preemptions},
         {"worker_pid", t.worker_pid}};
  if (!t.error.ok()) j["error"] = std::string(t.error.message());
  return j;
}

// The principal a request's bearer token names, or nullopt with the 401 written to `res`.
std::optional<Principal> Authorize(const TokenTable* tokens, const HttpRequest& req,
                                   HttpResponse& res) {
  const std::string header = req.header("Authorization");
  constexpr absl::string_view kBearer = "Bearer ";
  std::optional<Principal> found;
  if (absl::StartsWith(header, kBearer)) {
    found = tokens->Find(absl::string_view(header).substr(kBearer.size()));
  }
  if (!found) {
    res.set_header("WWW-Authenticate", "Bearer");
    ReplyError(res, absl::UnauthenticatedError(
                        "this pswitchd needs a token: Authorization: Bearer TOKEN"));
  }
  return found;
}

// A request body that is optional but, when sent, a JSON object (the repository extension's
// requests): an empty body is an empty object.
absl::StatusOr<json> OptionalObjectBody(const HttpRequest& req, const char* what,
                                        uint64_t max_bytes) {
  if (req.body.empty()) return json::object();
  PSWITCH_ASSIGN_OR_RETURN(
      json body, base::ParseUntrustedJson(req.body, what, base::JsonLimits{max_bytes, 32}));
  if (!body.is_object()) return absl::InvalidArgumentError("expected an object");
  return body;
}

// A JSON member `key` of `body` as T, if present; InvalidArgument if it has another type.
template <typename T>
absl::Status Member(const json& body, const char* key, T& out) {
  if (!body.contains(key)) return absl::OkStatus();
  const json& v = body[key];
  bool fits;
  if constexpr (std::is_same_v<T, std::string>) {
    fits = v.is_string();
  } else if constexpr (std::is_same_v<T, bool>) {  // before the unsigned case: bool is one
    fits = v.is_boolean();
  } else if constexpr (std::is_floating_point_v<T>) {
    fits = v.is_number();
  } else if constexpr (std::is_unsigned_v<T>) {
    fits = v.is_number_unsigned() && v.get<uint64_t>() <= std::numeric_limits<T>::max();
  } else {
    fits = v.is_number_integer() && v.get<int64_t>() >= std::numeric_limits<T>::min() &&
           v.get<int64_t>() <= std::numeric_limits<T>::max();
  }
  if (!fits) return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" has the wrong type"));
  out = v.get<T>();
  return absl::OkStatus();
}

json FillJobJson(const FillJobStatus& s) {
  json j{{"job_id", s.job_id},
         {"state", std::string(api::FillStateName(s.state))},
         {"gpu", s.gpu},
         {"steps_done", s.steps_done},
         {"steps_total", s.steps_total},
         {"bubbles", s.bubbles},
         {"predicted_remaining_s", absl::ToDoubleSeconds(s.predicted_remaining)},
         {"meets_deadline", s.meets_deadline}};
  if (!s.error.ok()) j["error"] = std::string(s.error.message());
  return j;
}

// A GPU's weights cache: what it holds and how it has served (GET /v1/gpus).
json CacheJson(const GpuSnapshot& s) {
  json resident = json::array();
  json states = json::array();
  for (const controller::ResidentModel& r : s.resident) {
    if (r.state_of) {
      // A training run's optimizer state in the pool: its run's, or kept for a preempted task.
      json state = {{"bytes", r.bytes}};
      state[r.state_of->owner == controller::CheckpointKey::Owner::kTask ? "task" : "fill_job"] =
          r.state_of->id;
      if (r.unsaved_task != 0) state["kept_for_preempted_task"] = r.unsaved_task;
      states.push_back(std::move(state));
      continue;
    }
    json model = {
        {"model", r.model}, {"bytes", r.bytes}, {"copying", r.copying}, {"pinned", r.pinned}};
    // A preempted training task's weights that only this GPU holds (written back when evicted).
    if (r.unsaved_task != 0) model["unsaved_training_task"] = r.unsaved_task;
    resident.push_back(std::move(model));
  }
  return {{"enabled", s.cache_enabled},
          {"capacity_bytes", s.cache_capacity_bytes},
          {"resident_bytes", s.cache.resident_bytes},
          {"resident", std::move(resident)},
          {"optimizer_state_bytes", s.cache.state_bytes},
          {"optimizer_states", std::move(states)},
          {"hits", s.cache.hits},
          {"misses", s.cache.misses},
          {"evictions", s.cache.evictions},
          {"moves", s.cache.moves}};
}

json CycleJson(const fill::BubbleCycle& cycle) {
  json bubbles = json::array();
  for (const fill::Bubble& b : cycle.bubbles) {
    bubbles.push_back({{"offset_ns", absl::ToInt64Nanoseconds(b.offset)},
                       {"duration_ns", absl::ToInt64Nanoseconds(b.duration)},
                       {"free_bytes", b.free_bytes}});
  }
  return json{{"period_ns", absl::ToInt64Nanoseconds(cycle.period)}, {"bubbles", bubbles}};
}

// A fill job request in JSON, checked exactly as the TCP port checks its FillSubmit: the JSON
// is turned into that message and parsed by the same ParseFill.
absl::StatusOr<FillRequest> FillRequestFromJson(const json& body) {
  if (!body.is_object()) return absl::InvalidArgumentError("a fill job is a JSON object");
  static const char* const kKnown[] = {"kind",
                                       "model",
                                       "dataset",
                                       "output",
                                       "batch",
                                       "steps",
                                       "seed",
                                       "step_us",
                                       "memory_bytes",
                                       "deadline_ms",
                                       "synthetic_step_us",
                                       "synthetic_alloc_bytes"};
  for (const auto& [key, value] : body.items()) {
    if (std::find_if(std::begin(kKnown), std::end(kKnown),
                     [&key](const char* k) { return key == k; }) == std::end(kKnown)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown fill job field \"", absl::CHexEscape(key.substr(0, 64)), "\""));
    }
  }
  std::string kind_name, model, dataset, output;
  uint32_t batch = 1, steps = 0;
  uint64_t seed = 0, step_us = 0, memory = 0, deadline_ms = 0, synthetic_us = 0, alloc = 0;
  PSWITCH_RETURN_IF_ERROR(Member(body, "kind", kind_name));
  PSWITCH_RETURN_IF_ERROR(Member(body, "model", model));
  PSWITCH_RETURN_IF_ERROR(Member(body, "dataset", dataset));
  PSWITCH_RETURN_IF_ERROR(Member(body, "output", output));
  PSWITCH_RETURN_IF_ERROR(Member(body, "batch", batch));
  PSWITCH_RETURN_IF_ERROR(Member(body, "steps", steps));
  PSWITCH_RETURN_IF_ERROR(Member(body, "seed", seed));
  PSWITCH_RETURN_IF_ERROR(Member(body, "step_us", step_us));
  PSWITCH_RETURN_IF_ERROR(Member(body, "memory_bytes", memory));
  PSWITCH_RETURN_IF_ERROR(Member(body, "deadline_ms", deadline_ms));
  PSWITCH_RETURN_IF_ERROR(Member(body, "synthetic_step_us", synthetic_us));
  PSWITCH_RETURN_IF_ERROR(Member(body, "synthetic_alloc_bytes", alloc));
  proto::FillKind kind;
  if (kind_name == "inference") {
    kind = proto::FillKind::Inference;
  } else if (kind_name == "training") {
    kind = proto::FillKind::Training;
  } else if (kind_name == "synthetic") {
    kind = proto::FillKind::Synthetic;
  } else {
    return absl::InvalidArgumentError("\"kind\" must be inference, training or synthetic");
  }
  flatbuffers::FlatBufferBuilder b;
  auto wire = proto::CreateFillSubmitDirect(b, kind, model.c_str(), dataset.c_str(), output.c_str(),
                                            batch, steps, seed, step_us, memory, deadline_ms,
                                            synthetic_us, alloc, /*test_only_ignore_pause=*/false);
  b.Finish(wire);
  return ParseFill(*flatbuffers::GetRoot<proto::FillSubmit>(b.GetBufferPointer()));
}

}  // namespace

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

HttpServer::HttpServer(Controller* controller, HttpServerOptions options)
    : controller_(controller),
      options_(std::move(options)),
      pool_(std::max<size_t>(options_.handler_threads, 1), options_.max_queued_requests),
      own_regions_(options_.regions == nullptr ? std::make_unique<dataplane::RegionTable>()
                                               : nullptr),
      regions_(options_.regions != nullptr ? options_.regions : own_regions_.get()),
      triton_regions_(regions_, options_.shm_dir),
      waiting_(std::make_shared<WaitingRequests>(&pool_, options_.infer_timeout)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen,
                                                              Controller* controller,
                                                              HttpServerOptions options) {
  std::unique_ptr<HttpServer> s(new HttpServer(controller, std::move(options)));
  s->AddRoutes();
  PSWITCH_ASSIGN_OR_RETURN(s->transport_,
                           HttpTransport::Start(listen, s->options_.limits, s.get()));
  s->sweeper_ = std::thread([waiting = s->waiting_] {
    while (waiting->SweepAndWait(absl::Seconds(1))) {
    }
  });
  base::Log(base::LogLevel::kInfo, "http_routes").Field("routes", absl::StrJoin(s->routes(), ","));
  return s;
}

HttpServer::~HttpServer() {
  // Waiting requests are answered 503 and the pool forgotten: a controller callback that fires
  // later finds nothing to answer and nowhere to run.
  waiting_->Stop();
  if (sweeper_.joinable()) sweeper_.join();
  // Handlers in flight finish (their answers are written within the grace), then connections
  // close; the pool is stopped after the transport, so no request reaches a stopped pool.
  if (transport_ != nullptr) transport_->Shutdown(absl::Seconds(2));
  pool_.Stop();
}

std::vector<std::string> HttpServer::routes() const {
  std::vector<std::string> out;
  for (const Route& r : routes_) out.push_back(absl::StrCat(r.method, " ", r.path));
  return out;
}

HttpServer::Route& HttpServer::Handle(const char* method, const std::string& path,
                                      SyncHandler handler) {
  Route r;
  r.method = method;
  r.path = path;
  r.segments = absl::StrSplit(path, '/');
  // A GET or DELETE has no body: one announced is refused before it is read.
  if (r.method == "GET" || r.method == "DELETE") r.max_body_bytes = 0;
  r.handler = std::move(handler);
  routes_.push_back(std::move(r));
  return routes_.back();
}

HttpServer::Route& HttpServer::HandleAsync(const char* method, const std::string& path,
                                           AsyncHandler handler) {
  Route& r = Handle(method, path, nullptr);
  r.handler = std::move(handler);
  return r;
}

const HttpServer::Route* HttpServer::Find(const std::string& method, const std::string& path,
                                          std::vector<std::string>* params) const {
  const std::vector<absl::string_view> segments = absl::StrSplit(path, '/');
  for (const Route& r : routes_) {
    if (r.method != method || r.segments.size() != segments.size()) continue;
    params->clear();
    bool match = true;
    for (size_t i = 0; i < segments.size() && match; ++i) {
      if (absl::StartsWith(r.segments[i], "{")) {
        match = !segments[i].empty();
        params->emplace_back(segments[i]);
      } else {
        match = r.segments[i] == segments[i];
      }
    }
    if (match) return &r;
  }
  params->clear();
  return nullptr;
}

std::variant<std::string, HttpResponse> HttpServer::Admit(const HttpRequest& head) {
  HttpResponse res;
  std::vector<std::string> params;
  const Route* route = Find(head.method, head.path, &params);
  if (route == nullptr) {
    ReplyError(res, absl::NotFoundError("no such route"));
    return res;
  }
  uint64_t body_bytes = 0;
  if (head.has_header("content-length") &&
      !absl::SimpleAtoi(head.header("content-length"), &body_bytes)) {
    ReplyError(res, absl::InvalidArgumentError("bad Content-Length"));
    return res;
  }
  if (body_bytes > route->max_body_bytes) {
    SetJsonError(
        res, 413,
        absl::StrCat("this request's body may have at most ", route->max_body_bytes, " bytes"));
    return res;
  }
  if (route->open) return std::string(kUnauthenticatedClient);
  if (options_.tokens == nullptr) {
    // Without tokens, a client is an address (the TCP port: a connection).
    return absl::StrCat("http:", head.peer);
  }
  // A bad token is refused before its body is read: nothing is charged for it.
  std::optional<Principal> who = Authorize(options_.tokens, head, res);
  if (!who) return res;
  return who->name;
}

void HttpServer::Serve(HttpRequest request, HttpRespond respond) {
  std::vector<std::string> params;
  const Route* route = Find(request.method, request.path, &params);
  if (route == nullptr) {  // Admit checked it; routes never change
    HttpResponse res;
    ReplyError(res, absl::NotFoundError("no such route"));
    return respond(std::move(res));
  }
  request.params = std::move(params);
  if (const auto* sync = std::get_if<SyncHandler>(&route->handler)) {
    if (route->where == Where::kEventLoop) {
      HttpResponse res;
      (*sync)(request, res);
      return respond(std::move(res));
    }
    auto work = [sync, request = std::make_shared<HttpRequest>(std::move(request)), respond]() {
      HttpResponse res;
      (*sync)(*request, res);
      respond(std::move(res));
    };
    if (pool_.TrySubmit(std::move(work))) return;
  } else {
    const AsyncHandler* async = &std::get<AsyncHandler>(route->handler);
    if (request.body.size() <= route->loop_body_bytes) {
      return (*async)(std::move(request), std::move(respond));
    }
    auto work = [async, request = std::make_shared<HttpRequest>(std::move(request)),
                 respond]() mutable { (*async)(std::move(*request), respond); };
    if (pool_.TrySubmit(std::move(work))) return;
  }
  HttpResponse busy;
  ReplyError(busy, absl::UnavailableError("pswitchd's HTTP handlers are all busy; try again"));
  busy.set_header("Retry-After", "1");
  respond(std::move(busy));
}

std::optional<uint64_t> HttpServer::BodyPrefix(const HttpRequest& head, uint64_t body_bytes) {
  std::vector<std::string> params;
  const Route* route = Find(head.method, head.path, &params);
  if (route == nullptr || route->path != "/v2/models/{model}/infer") return std::nullopt;
  return PlacedHeaderBytes(head, body_bytes);
}

std::variant<std::shared_ptr<PlacedBody>, HttpResponse> HttpServer::PlaceBody(
    HttpRequest& request, uint64_t rest_bytes, std::shared_ptr<void>& connection) {
  HttpResponse res;
  std::vector<std::string> params;
  if (Find(request.method, request.path, &params) == nullptr || params.size() != 1) {
    ReplyError(res, absl::NotFoundError("no such route"));
    return res;
  }
  // Who, as the route's handler will ask again: the staging is theirs.
  std::optional<Caller> caller = Identify(request, res);
  if (!caller) return res;
  const Principal& who = caller->principal;
  // The header is read and the binary data will be charged as the staging it lands in: only the
  // header stays charged to the request.
  (void)request.charge.Resize(request.body.size());
  // A model the caller may not see is admission's to refuse; then no room is made for the
  // output, and inputs admission will refuse get none either (their refusal is theirs).
  const absl::StatusOr<EntryRef> entry = options_.admission->FindModel(who, params[0]);
  OutputBytesFor output_bytes =
      [&entry](const std::vector<proto::HostTensor>& heads) -> std::optional<uint64_t> {
    if (!entry.ok() || !CheckInputs(**entry, heads).ok()) return std::nullopt;
    absl::StatusOr<uint64_t> out = OutputBytesNeeded(**entry, heads);
    if (!out.ok()) return std::nullopt;
    return *out;
  };
  if (connection == nullptr) connection = std::make_shared<ConnectionStaging>();
  StagingPool& pool = static_cast<ConnectionStaging*>(connection.get())
                          ->PoolFor(who.name, options_.limits.budget, request.charge.client());
  absl::StatusOr<std::shared_ptr<StagedInfer>> staged =
      StageInfer(request.body, rest_bytes,
                 InferRequestLimits{options_.limits.max_body_bytes, 32, kMaxInputTensors}, who.name,
                 pool, output_bytes);
  if (!staged.ok()) {
    ReplyError(res, staged.status());
    return res;
  }
  return std::shared_ptr<PlacedBody>(*std::move(staged));
}

std::optional<HttpServer::Caller> HttpServer::Identify(const HttpRequest& req,
                                                       HttpResponse& res) const {
  if (options_.tokens != nullptr) {
    std::optional<Principal> who = Authorize(options_.tokens, req, res);
    if (!who) return std::nullopt;
    // The uid the token's line names (the token file's UID column), if any.
    const std::string header = req.header("Authorization");
    std::optional<uid_t> uid =
        options_.tokens->FindTokenUid(absl::string_view(header).substr(strlen("Bearer ")));
    return Caller{*std::move(who), uid};
  }
  // Without tokens only loopback is served (pswitchd refuses otherwise unless --insecure): the
  // kernel says which uid owns the peer's socket, and that uid is the principal.
  asio::error_code local_ec, remote_ec;
  const asio::ip::address local = asio::ip::make_address(req.local_address, local_ec);
  const asio::ip::address remote = asio::ip::make_address(req.peer, remote_ec);
  if (!local_ec && !remote_ec && !IsLoopbackAddress(remote)) {
    // Beyond loopback without tokens: only with --insecure, the operator's choice.
    return Caller{Principal{"anonymous", Role::kAdmin}, std::nullopt};
  }
  // Ends the transport could not tell are no one's: refused below, never an admin. The kernel
  // is asked once per connection (its peer's socket, and so its uid, never changes).
  auto lookup = [&]() -> absl::StatusOr<uid_t> {
    return LoopbackPeerUid(asio::ip::tcp::endpoint(local, req.local_port),
                           asio::ip::tcp::endpoint(remote, req.peer_port));
  };
  absl::StatusOr<uid_t> uid =
      local_ec || remote_ec
          ? absl::StatusOr<uid_t>(absl::UnavailableError("the connection's ends are unknown"))
          : (req.peer_uid != nullptr ? req.peer_uid->Get(lookup) : lookup());
  if (!uid.ok()) {
    ReplyError(
        res, absl::UnavailableError(absl::StrCat(
                 "could not tell which local user this connection is: ", uid.status().message())));
    return std::nullopt;
  }
  return Caller{PrincipalOfUid(*uid, nullptr), *uid};
}

void HttpServer::AddRoutes() {
  auto authorize = [this](const HttpRequest& req, HttpResponse& res) -> std::optional<Principal> {
    std::optional<Caller> caller = Identify(req, res);
    if (!caller) return std::nullopt;
    return std::move(caller->principal);
  };

  // This API's OpenAPI document (docs/openapi.json, built in): open, like the health checks.
  Handle("GET", "/openapi.json", [](const HttpRequest&, HttpResponse& res) {
    res.status = 200;
    res.set_content(std::string(OpenApiDocument()), "application/json");
  }).open = true;
  // Health: open, as probes have no token.
  // On the event loop: a probe is answered however busy the handler threads are.
  Route& live = Handle("GET", "/v2/health/live", [](const HttpRequest&, HttpResponse& res) {
    Reply(res, 200, json{{"live", true}});
  });
  live.open = true;
  live.where = Where::kEventLoop;
  Route& ready = Handle("GET", "/v2/health/ready", [this](const HttpRequest&, HttpResponse& res) {
    // A zero wait: reads a flag under the pool's mutex.
    const bool ready = controller_->scheduler().AwaitWorkersReady(absl::ZeroDuration());
    Reply(res, ready ? 200 : 503, json{{"ready", ready}});
  });
  ready.open = true;
  ready.where = Where::kEventLoop;
  Handle("GET", "/v2",
         [authorize, cuda_shm = options_.cuda_shared_memory](const HttpRequest& req,
                                                             HttpResponse& res) {
           if (!authorize(req, res)) return;
           Reply(res, 200,
                 json{{"name", "pswitch"},
                      {"version", "1"},
                      {"extensions",
                       cuda_shm ? json::array({"binary_tensor_data", "model_repository",
                                               "system_shared_memory", "cuda_shared_memory"})
                                : json::array({"binary_tensor_data", "model_repository",
                                               "system_shared_memory"})}});
         });
  Handle("GET", "/v2/models/{model}", [this, authorize](const HttpRequest& req, HttpResponse& res) {
    std::optional<Principal> who = authorize(req, res);
    if (!who) return;
    // Another user's copy is answered as absent.
    absl::StatusOr<EntryRef> entry = options_.admission->FindModel(*who, req.params[0]);
    if (!entry.ok()) return ReplyError(res, entry.status());
    const CatalogEntry& e = **entry;
    Reply(res, 200,
          json{{"name", e.request.name},
               {"versions", json::array({"1"})},
               {"platform", absl::StrCat("pswitch_", e.request.zoo_model)},
               {"inputs", json::array({SpecJson(e.input)})},
               {"outputs", json::array({SpecJson(e.output)})}});
  });
  Handle("GET", "/v2/models/{model}/ready",
         [this, authorize](const HttpRequest& req, HttpResponse& res) {
           std::optional<Principal> who = authorize(req, res);
           if (!who) return;
           const bool ready = options_.admission->FindModel(*who, req.params[0]).ok();
           Reply(res, ready ? 200 : 404, json{{"name", req.params[0]}, {"ready", ready}});
         });
  // pswitch's own resources (v1): training tasks, with the TCP port's owners and caps.
  HandleAsync("POST", "/v1/tasks", [this, authorize](HttpRequest req, HttpRespond respond) {
    HttpResponse res;
    std::optional<Principal> who = authorize(req, res);
    if (!who) return respond(std::move(res));
    SubmitTraining(*who, req, std::move(respond));
  });
  Handle("GET", "/v1/tasks", [this, authorize](const HttpRequest& req, HttpResponse& res) {
    std::optional<Principal> who = authorize(req, res);
    if (!who) return;
    size_t limit = 100;
    if (req.has_param("limit") &&
        (!absl::SimpleAtoi(req.param_value("limit"), &limit) || limit == 0 || limit > 1000)) {
      return ReplyError(res, absl::InvalidArgumentError("limit must be in [1, 1000]"));
    }
    json tasks = json::array();
    for (const TaskStatus& t : controller_->RecentTasks(limit)) {
      if (options_.owners == nullptr || options_.owners->MayAccess(*who, t.task_id)) {
        tasks.push_back(TaskJson(t));
      }
    }
    Reply(res, 200, json{{"tasks", std::move(tasks)}});
  });
  // The task a /v1/tasks/{id} request names, once authorized; a task of another user is
  // answered as absent, as on the TCP port. nullopt: the error is already in `res`.
  auto task_of = [this, authorize](const HttpRequest& req,
                                   HttpResponse& res) -> std::optional<uint64_t> {
    std::optional<Principal> who = authorize(req, res);
    if (!who) return std::nullopt;
    const std::string text = req.params[0];
    uint64_t id = 0;
    if (!absl::SimpleAtoi(text, &id) ||
        (options_.owners != nullptr && !options_.owners->MayAccess(*who, id))) {
      ReplyError(
          res, absl::NotFoundError(absl::StrCat("no task ", absl::CHexEscape(text.substr(0, 32)))));
      return std::nullopt;
    }
    return id;
  };
  Handle("GET", "/v1/tasks/{task}", [this, task_of](const HttpRequest& req, HttpResponse& res) {
    std::optional<uint64_t> id = task_of(req, res);
    if (!id) return;
    absl::StatusOr<TaskStatus> status = controller_->Query(*id);
    if (!status.ok()) return ReplyError(res, status.status());
    Reply(res, 200, TaskJson(*status));
  });
  Handle("DELETE", "/v1/tasks/{task}", [this, task_of](const HttpRequest& req, HttpResponse& res) {
    std::optional<uint64_t> found = task_of(req, res);
    if (!found) return;
    const uint64_t id = *found;
    if (absl::Status cancelled = controller_->Cancel(id); !cancelled.ok()) {
      return ReplyError(res, cancelled);
    }
    // A training task stops at its next iteration; its state says when it has.
    Reply(res, 202, json{{"task_id", id}, {"cancel", "requested"}});
  });
  Route& infer = HandleAsync("POST", "/v2/models/{model}/infer",
              [this, authorize](HttpRequest req, HttpRespond respond) {
                HttpResponse res;
                std::optional<Principal> who = authorize(req, res);
                if (!who) return respond(std::move(res));
                Infer(*who, std::move(req), std::move(respond));
              });
  infer.max_body_bytes = options_.limits.max_body_bytes;
  // A request whose tensors are in shared memory or staging is a small JSON document: it is
  // decoded and queued where it arrived (the placed-body path decodes headers there too).
  infer.loop_body_bytes = kInferOnLoopBodyBytes;
  RouteOperations(authorize);
  RouteRepository(authorize);
  RouteSharedMemory();
}

void HttpServer::RouteRepository(const Authorizer& authorize) {
  Handle("POST", "/v2/repository/index",
         [this, authorize](const HttpRequest& req, HttpResponse& res) {
           std::optional<Principal> who = authorize(req, res);
           if (!who) return;
           bool ready_only = false;
           absl::StatusOr<json> body =
               OptionalObjectBody(req, "repository index request", kMaxControlBodyBytes);
           if (!body.ok()) return ReplyError(res, body.status());
           if (absl::Status s = Member(*body, "ready", ready_only); !s.ok())
             return ReplyError(res, s);
           // Registered models (whichever way) and the repository's, each once, by name.
           std::map<std::string, json> models;
           for (const EntryRef& e : options_.admission->ListModels(*who)) {
             models[e->request.name] = {
                 {"name", e->request.name}, {"version", "1"}, {"state", "READY"}, {"reason", ""}};
           }
           // Being registered: LOADING, with what it has done so far (it may be READY in the
           // catalog already while the workers load it).
           for (const controller::Controller::InProgress& r :
                controller_->RegistrationsInProgress()) {
             if (!MaySeeOwnedBy(*who, r.owner)) continue;
             if (ready_only) {
               models.erase(r.name);  // not ready until its workers have it
             } else {
               models[r.name] = {
                   {"name", r.name}, {"version", "1"}, {"state", "LOADING"}, {"reason", r.reason}};
             }
           }
           if (options_.repository != nullptr && !ready_only) {
             absl::StatusOr<std::vector<std::string>> index = options_.repository->Index();
             if (!index.ok()) return ReplyError(res, index.status());
             for (const std::string& name : *index) {
               models.try_emplace(name, json{{"name", name},
                                             {"version", "1"},
                                             {"state", "UNAVAILABLE"},
                                             {"reason", "not loaded"}});
             }
           }
           json list = json::array();
           for (auto& [name, entry] : models) list.push_back(std::move(entry));
           Reply(res, 200, list);
         });

  HandleAsync("POST", "/v2/repository/models/{model}/load",
              [this, authorize](HttpRequest req, HttpRespond respond) {
                HttpResponse res;
                std::optional<std::string> config;
                if (!CheckLoad(authorize, req, res, &config)) return respond(std::move(res));
                const std::string name = req.params[0];
                // Registration runs on the controller's registration thread; the answer comes from
                // there.
                const uint64_t waiting =
                    waiting_->Add(std::move(respond), absl::StrCat("loading '", name, "'"));
                if (waiting == 0) return;
                controller_->Register(
                    [repository = options_.repository, name, config]() {
                      return repository->Request(name, config ? &*config : nullptr);
                    },
                    [table = waiting_, waiting](
                        const absl::StatusOr<controller::Controller::Registered>& registered) {
                      HttpRespond respond = table->Take(waiting);
                      if (respond == nullptr) return;
                      HttpResponse res;
                      if (!registered.ok()) {
                        ReplyError(res, registered.status());
                      } else {
                        Reply(res, 200, json::object());
                      }
                      respond(std::move(res));
                    });
              });
  // Any registered model, wherever it came from. Queued tasks on it fail, a running inference
  // batch finishes, a running training task is cancelled; the answer comes once it is freed.
  HandleAsync("POST", "/v2/repository/models/{model}/unload",
              [this, authorize](HttpRequest req, HttpRespond respond) {
                HttpResponse res;
                if (!CheckUnload(authorize, req, res)) return respond(std::move(res));
                const std::string name = req.params[0];
                const uint64_t waiting = waiting_->Add(
                    std::move(respond),
                    absl::StrCat("unloading '", name, "' (it waits for the model's running task)"));
                if (waiting == 0) return;
                controller_->Unload(name, [table = waiting_, waiting, name](absl::Status status) {
                  HttpRespond respond = table->Take(waiting);
                  if (respond == nullptr) return;
                  HttpResponse res;
                  if (!status.ok()) {
                    ReplyError(res, status);
                  } else {
                    base::Log(base::LogLevel::kInfo, "model_unloaded")
                        .Field("model", name)
                        .Field("source", "http");
                    Reply(res, 200, json::object());
                  }
                  respond(std::move(res));
                });
              });
}

bool HttpServer::CheckUnload(const Authorizer& authorize, const HttpRequest& req,
                             HttpResponse& res) {
  std::optional<Principal> who = authorize(req, res);
  if (!who) return false;
  const std::string name = req.params[0];
  if (absl::Status valid = CheckUnloadName(name); !valid.ok()) return Refuse(res, valid);
  // A fill job's own model is the job's, whoever asks (its name says no more than that).
  if (options_.fill != nullptr) {
    if (absl::Status owned = options_.fill->CheckUnload(name); !owned.ok()) {
      return Refuse(res, owned);
    }
  }
  // Admins, the model's trainers, and a copy's owner (another user's copy: NotFound).
  if (absl::Status may = options_.admission->CheckUnload(*who, name); !may.ok()) {
    return Refuse(res, may);
  }
  // Triton's {"parameters": {"unload_dependents": ...}}: pswitch models have no dependents.
  absl::StatusOr<json> body = OptionalObjectBody(req, "unload request", kMaxControlBodyBytes);
  if (!body.ok()) return Refuse(res, body.status());
  return true;
}

bool HttpServer::CheckLoad(const Authorizer& authorize, const HttpRequest& req, HttpResponse& res,
                           std::optional<std::string>* config) {
  {
    std::optional<Principal> who = authorize(req, res);
    if (!who) return false;
    if (who->role != Role::kAdmin) {
      return Refuse(res, absl::PermissionDeniedError("loading a model needs an admin token"));
    }
    if (options_.repository == nullptr) {
      return Refuse(res, absl::NotFoundError("this pswitchd has no --model-repository"));
    }
    const std::string name = req.params[0];
    if (absl::Status text = base::CheckText(name, "model name", 128); !text.ok()) {
      return Refuse(res, text);
    }
    if (absl::StartsWith(name, kFillModelPrefix)) {
      return Refuse(res, absl::InvalidArgumentError(
                             absl::StrCat("model names starting with '", kFillModelPrefix,
                                          "' are reserved for fill jobs' own models")));
    }
    absl::StatusOr<json> body = OptionalObjectBody(req, "load request", kMaxControlBodyBytes);
    if (!body.ok()) return Refuse(res, body.status());
    if (body->contains("parameters")) {
      const json& parameters = (*body)["parameters"];
      if (!parameters.is_object()) {
        return Refuse(res, absl::InvalidArgumentError("\"parameters\" must be an object"));
      }
      std::string text;
      if (absl::Status s = Member(parameters, "config", text); !s.ok()) return Refuse(res, s);
      if (parameters.contains("config")) *config = std::move(text);
    }
    if (controller_->catalog().Find(name).ok()) {
      return Refuse(res,
                    absl::AlreadyExistsError(absl::StrCat("model '", name, "' is already loaded")));
    }
    return true;
  }
}

void HttpServer::RouteOperations(const Authorizer& authorize) {
  // Bubble cycles and fill jobs are the operator's (admin), as on the TCP port.
  auto admin = [authorize](const HttpRequest& req, HttpResponse& res) {
    std::optional<Principal> who = authorize(req, res);
    if (who && who->role != Role::kAdmin) {
      ReplyError(res, absl::PermissionDeniedError(
                          absl::StrCat("'", who->name,
                                       "' (role user) may infer, train and see and cancel its "
                                       "own tasks; this request needs an admin token")));
      return false;
    }
    return who.has_value();
  };
  auto fill_ready = [this](HttpResponse& res) {
    if (options_.fill == nullptr) {
      ReplyError(res, absl::UnavailableError("fill jobs are not served here"));
      return false;
    }
    return true;
  };
  auto body_json = [this](const HttpRequest& req, const char* what) {
    return base::ParseUntrustedJson(req.body, what, base::JsonLimits{kMaxControlBodyBytes, 32});
  };

  Handle("GET", "/metrics", [this, authorize](const HttpRequest& req, HttpResponse& res) {
    if (!authorize(req, res)) return;
    if (options_.telemetry == nullptr) {
      return ReplyError(res, absl::UnavailableError("metrics are not kept here"));
    }
    std::vector<GpuGauges> gpus;
    for (size_t g = 0; g < controller_->gpus(); ++g) {
      GpuScheduler& s = controller_->gpu(g);
      // Read without the GPU's loop: a scrape never waits on a busy scheduler.
      const auto [size, used] = s.ArenaUse();
      gpus.push_back({static_cast<int>(g), s.queue_depth(), used, size - used});
    }
    std::map<std::string, int> fill_jobs;
    if (options_.fill != nullptr) fill_jobs = options_.fill->JobsByState();
    res.status = 200;
    const NodeGauges node{controller_->catalog().pinned_bytes(), controller_->List().size()};
    res.set_content(options_.telemetry->Scrape(gpus, fill_jobs, node),
                    "text/plain; version=0.0.4; charset=utf-8");
  });

  // The timeline of the last N seconds: every GPU's tasks, copies, bubbles (admin: it shows
  // every user's tasks).
  Handle("GET", "/v1/trace", [this, admin](const HttpRequest& req, HttpResponse& res) {
    if (!admin(req, res)) return;
    if (options_.telemetry == nullptr) {
      return ReplyError(res, absl::UnavailableError("no trace is kept here"));
    }
    int seconds = 10;
    if (req.has_param("seconds") &&
        (!absl::SimpleAtoi(req.param_value("seconds"), &seconds) || seconds < 1 || seconds > 600)) {
      return ReplyError(res, absl::InvalidArgumentError("seconds must be in [1, 600]"));
    }
    res.status = 200;
    res.set_content(
        options_.telemetry->trace().ChromeJson(absl::Seconds(seconds), base::MonotonicNowNs()),
        "application/json");
  });

  Handle("GET", "/v1/gpus", [this, authorize](const HttpRequest& req, HttpResponse& res) {
    if (!authorize(req, res)) return;
    json gpus = json::array();
    for (size_t g = 0; g < controller_->gpus(); ++g) {
      absl::StatusOr<GpuSnapshot> s = controller_->gpu(g).Snapshot(absl::Seconds(2));
      if (!s.ok()) return ReplyError(res, s.status());
      json workers = json::array();
      for (const GpuSnapshot::Worker& w : s->workers) {
        workers.push_back({{"slot", w.slot},
                           {"pid", w.pid},
                           {"state", w.state},
                           {"role", w.active ? "active" : "standby"}});
      }
      json gpu{
          {"gpu", s->gpu},
          {"resident_model", s->resident_model.empty() ? json(nullptr) : json(s->resident_model)},
          {"workers", std::move(workers)},
          {"weights_cache", CacheJson(*s)},
          {"queue_depth", s->queue_depth},
          {"arena_bytes", s->arena_bytes},
          {"arena_used_bytes", s->arena_used_bytes},
          {"arena_free_bytes", s->arena_bytes - s->arena_used_bytes},
          {"bubble_cycle", nullptr}};
      if (options_.fill != nullptr) {
        if (auto cycle = options_.fill->Cycle(static_cast<int>(g))) {
          gpu["bubble_cycle"] = CycleJson(*cycle);
        }
      }
      gpus.push_back(std::move(gpu));
    }
    Reply(res, 200, json{{"gpus", std::move(gpus)}});
  });

  Handle("PUT", "/v1/gpus/{gpu}/bubble-cycle",
         [this, admin, fill_ready, body_json](const HttpRequest& req, HttpResponse& res) {
           if (!admin(req, res) || !fill_ready(res)) return;
           int gpu = 0;
           if (!absl::SimpleAtoi(req.params[0], &gpu) || gpu < 0 ||
               static_cast<size_t>(gpu) >= controller_->gpus()) {
             return ReplyError(res, absl::NotFoundError(absl::StrCat("no GPU ", req.params[0],
                                                                     " (this pswitchd has ",
                                                                     controller_->gpus(), ")")));
           }
           absl::StatusOr<json> body = body_json(req, "bubble cycle");
           if (!body.ok()) return ReplyError(res, body.status());
           absl::StatusOr<fill::BubbleCycle> cycle = fill::BubbleCycleFromJson(*body);
           if (!cycle.ok()) return ReplyError(res, cycle.status());
           if (absl::Status s = options_.fill->RegisterCycle(gpu, *cycle); !s.ok()) {
             return ReplyError(res, s);
           }
           Reply(res, 200, json{{"gpu", gpu}, {"bubble_cycle", CycleJson(*cycle)}});
         });

  // Submitting and estimating may read the job's dataset: on this pool thread, never a loop.
  auto fill_request = [body_json](const HttpRequest& req) -> absl::StatusOr<FillRequest> {
    PSWITCH_ASSIGN_OR_RETURN(json body, body_json(req, "fill job"));
    return FillRequestFromJson(body);
  };
  Handle("POST", "/v1/fill/jobs",
         [this, admin, fill_ready, fill_request](const HttpRequest& req, HttpResponse& res) {
           if (!admin(req, res) || !fill_ready(res)) return;
           absl::StatusOr<FillRequest> request = fill_request(req);
           if (!request.ok()) return ReplyError(res, request.status());
           absl::StatusOr<uint64_t> job = options_.fill->Submit(*std::move(request));
           if (!job.ok()) return ReplyError(res, job.status());
           absl::StatusOr<FillJobStatus> s = options_.fill->Query(*job);
           if (!s.ok()) return ReplyError(res, s.status());
           res.set_header("Location", absl::StrCat("/v1/fill/jobs/", *job));
           Reply(res, 201, FillJobJson(*s));
         });
  Handle("POST", "/v1/fill/estimate",
         [this, admin, fill_ready, fill_request](const HttpRequest& req, HttpResponse& res) {
           if (!admin(req, res) || !fill_ready(res)) return;
           absl::StatusOr<FillRequest> request = fill_request(req);
           if (!request.ok()) return ReplyError(res, request.status());
           absl::StatusOr<FillJobStatus> s = options_.fill->Estimate(*std::move(request));
           if (!s.ok()) return ReplyError(res, s.status());
           Reply(res, 200, FillJobJson(*s));
         });
  auto job_of = [](const HttpRequest& req, HttpResponse& res) -> std::optional<uint64_t> {
    uint64_t id = 0;
    if (!absl::SimpleAtoi(req.params[0], &id)) {
      ReplyError(res, absl::NotFoundError(absl::StrCat(
                          "no fill job ", absl::CHexEscape(req.params[0].substr(0, 32)))));
      return std::nullopt;
    }
    return id;
  };
  Handle("GET", "/v1/fill/jobs/{job}",
         [this, admin, fill_ready, job_of](const HttpRequest& req, HttpResponse& res) {
           if (!admin(req, res) || !fill_ready(res)) return;
           std::optional<uint64_t> id = job_of(req, res);
           if (!id) return;
           absl::StatusOr<FillJobStatus> s = options_.fill->Query(*id);
           if (!s.ok()) return ReplyError(res, s.status());
           Reply(res, 200, FillJobJson(*s));
         });
  Handle("DELETE", "/v1/fill/jobs/{job}",
         [this, admin, fill_ready, job_of](const HttpRequest& req, HttpResponse& res) {
           if (!admin(req, res) || !fill_ready(res)) return;
           std::optional<uint64_t> id = job_of(req, res);
           if (!id) return;
           if (absl::Status s = options_.fill->Cancel(*id); !s.ok()) return ReplyError(res, s);
           absl::StatusOr<FillJobStatus> s = options_.fill->Query(*id);
           if (!s.ok()) return ReplyError(res, s.status());
           Reply(res, 200, FillJobJson(*s));
         });
  Handle("GET", "/v1/fill/stats",
         [this, admin, fill_ready](const HttpRequest& req, HttpResponse& res) {
           if (!admin(req, res) || !fill_ready(res)) return;
           const FillStats s = options_.fill->Stats();
           const double bubble_s = absl::ToDoubleSeconds(s.bubble_time);
           const double used_s = absl::ToDoubleSeconds(s.fill_step_time);
           Reply(res, 200,
                 json{{"bubbles", s.bubbles},
                      {"bubble_seconds", bubble_s},
                      {"fill_step_seconds", used_s},
                      {"bubble_time_used", bubble_s > 0 ? used_s / bubble_s : 0.0},
                      {"steps", s.steps},
                      {"pause_p50_seconds", absl::ToDoubleSeconds(s.pause_p50)},
                      {"pause_p99_seconds", absl::ToDoubleSeconds(s.pause_p99)},
                      {"killed", s.killed},
                      {"runs", s.runs},
                      {"bell_wakes", s.bell_wakes}});
         });
}

void HttpServer::SubmitTraining(const Principal& who, const HttpRequest& req, HttpRespond respond) {
  auto fail = [&respond](const absl::Status& status) {
    HttpResponse res;
    ReplyError(res, status);
    respond(std::move(res));
  };
  absl::StatusOr<json> body = base::ParseUntrustedJson(req.body, "task request",
                                                       base::JsonLimits{kMaxControlBodyBytes, 32});
  if (!body.ok()) return fail(body.status());
  if (!body->is_object()) return fail(absl::InvalidArgumentError("expected an object"));
  TaskSpec spec;
  spec.kind = TaskKind::kTraining;
  std::string optimizer = "sgd";
  uint64_t deadline_ms = 0;
  std::string copy_name;  // "as_model": train a copy of one's own under this name
  for (absl::Status s :
       {Member(*body, "model", spec.model), Member(*body, "iterations", spec.iterations),
        Member(*body, "batch", spec.batch), Member(*body, "seed", spec.seed),
        Member(*body, "priority", spec.priority), Member(*body, "optimizer", optimizer),
        Member(*body, "learning_rate", spec.trainer.learning_rate),
        Member(*body, "momentum", spec.trainer.momentum), Member(*body, "deadline_ms", deadline_ms),
        Member(*body, "as_model", copy_name)}) {
    if (!s.ok()) return fail(s);
  }
  if (absl::Status name = base::CheckText(spec.model, "model name", 128); !name.ok()) {
    return fail(name);
  }
  if (spec.model.empty()) {
    return fail(absl::InvalidArgumentError("a training task needs \"model\""));
  }
  if (optimizer != "sgd" && optimizer != "adam") {
    return fail(absl::InvalidArgumentError("optimizer must be \"sgd\" or \"adam\""));
  }
  spec.trainer.optimizer =
      optimizer == "adam" ? api::OptimizerKind::kAdam : api::OptimizerKind::kSgd;
  if (spec.trainer.optimizer == api::OptimizerKind::kAdam) spec.trainer.momentum = 0;
  if (deadline_ms > 0) {
    spec.deadline =
        absl::Now() +
        absl::Milliseconds(static_cast<int64_t>(std::min<uint64_t>(deadline_ms, 86400ull * 1000)));
  }
  const std::string client =
      options_.tokens != nullptr ? who.name : absl::StrCat("http:", req.peer);
  auto answer = [model = copy_name.empty() ? spec.model
                                           : copy_name](const absl::StatusOr<uint64_t>& task) {
    HttpResponse res;
    if (!task.ok()) {
      ReplyError(res, task.status());
    } else {
      res.set_header("Location", absl::StrCat("/v1/tasks/", *task));
      Reply(res, 202, json{{"task_id", *task}, {"model", model}});
    }
    return res;
  };
  // A training task is polled, not waited for: its answer is dropped.
  auto done = [](const absl::StatusOr<TaskOutcome>&) {};
  if (copy_name.empty()) {
    return respond(
        answer(options_.admission->Submit(who, client, std::move(spec), std::move(done))));
  }
  // The copy registers on the registration thread, which answers; until then the request
  // waits like an infer (504 past the timeout, 503 at shutdown).
  const uint64_t waiting =
      waiting_->Add(std::move(respond), absl::StrCat("registering the copy '", copy_name, "'"));
  if (waiting == 0) return;
  options_.admission->SubmitOnCopy(
      who, client, std::move(spec), std::move(copy_name),
      [table = waiting_, waiting, answer](const absl::StatusOr<uint64_t>& task) {
        if (HttpRespond respond = table->Take(waiting)) respond(answer(task));
      },
      std::move(done));
}

void HttpServer::Infer(const Principal& who, HttpRequest req, HttpRespond respond) {
  auto fail = [&respond](const absl::Status& status) {
    HttpResponse res;
    ReplyError(res, status);
    respond(std::move(res));
  };
  const std::string model = req.params[0];
  // The staging region the inputs lie in and the outputs go to, and what maps it for pswitchd:
  // the connection's lease (a binary body received in place), or a region of this request's
  // own, decoded into here and mapped again to answer.
  std::shared_ptr<const dataplane::TransferRegion> staged;
  std::shared_ptr<StagingPool::Lease> lease;
  std::optional<proto::ByteSlice> staged_output;  // its region is set once the region exists
  uint64_t output_only_bytes = 0;  // the output's room when no input is staged (made on need)
  absl::StatusOr<InferRequest> request = absl::InternalError("not decoded");
  if (req.placed != nullptr) {
    // PlaceBody decoded the header and the kernel wrote the binary data into the lease.
    auto placed = std::dynamic_pointer_cast<StagedInfer>(req.placed);
    if (placed == nullptr || placed->owner != who.name) {
      return fail(absl::InternalError("the request's body was placed for someone else"));
    }
    lease = std::move(placed->lease);
    staged = lease->region();
    staged_output = placed->output_room;
    request = std::move(placed->request);
    req.placed.reset();
    req.charge.Reset();  // the header's bytes; the staging is charged by its pool
  } else {
    // The binary tensor data extension: a JSON header of this many bytes, then raw tensors.
    absl::string_view header = req.body;
    absl::string_view binary;
    if (req.has_header("Inference-Header-Content-Length")) {
      size_t json_bytes = 0;
      if (!absl::SimpleAtoi(req.header("Inference-Header-Content-Length"), &json_bytes) ||
          json_bytes > req.body.size()) {
        return fail(
            absl::InvalidArgumentError("Inference-Header-Content-Length must be within the body"));
      }
      header = header.substr(0, json_bytes);
      binary = absl::string_view(req.body).substr(json_bytes);
    }
    // The decoded tensors are charged before they are built, beside the body they come from.
    BudgetCharge& charge = req.charge;
    // They are decoded into a staging region of pswitchd's own that the worker maps
    // (docs/dataplane.md), followed by room for the output when the model's recorded output
    // tells its size: the worker writes it there and the answer is encoded from it. A model the
    // caller may not see is admission's to refuse; then no room is made for the output.
    const absl::StatusOr<EntryRef> entry = options_.admission->FindModel(who, model);
    std::unique_ptr<StagingMapping> staging;
    auto place = [&](size_t bytes,
                     const std::vector<proto::HostTensor>& heads) -> absl::StatusOr<uint8_t*> {
      uint64_t total = bytes;
      // Inputs admission will refuse (names, dtypes, ranks) get no room: their refusal is
      // theirs, not the budget's for an output of a shape that cannot be.
      if (entry.ok() && CheckInputs(**entry, heads).ok()) {
        absl::StatusOr<uint64_t> out = OutputBytesNeeded(**entry, heads);
        if (out.ok() && *out > 0 && bytes == 0) {
          // No input needs staging (all in shared memory): room for the output is made below
          // only if the request does not name shared memory for it, so a request wholly in
          // shared memory creates no region of pswitchd's and sends the worker no mapping.
          output_only_bytes = *out;
        } else if (out.ok() && *out > 0) {
          const uint64_t at =
              (bytes + kPlacementAlignment - 1) / kPlacementAlignment * kPlacementAlignment;
          PSWITCH_RETURN_IF_ERROR(charge.Grow(at - bytes + *out));
          staged_output = proto::ByteSlice{0, at, *out};
          total = at + *out;
        }
      }
      if (total == 0) return nullptr;
      PSWITCH_ASSIGN_OR_RETURN(staging, StagingMapping::Create(total, who.name));
      return staging->data();
    };
    request = DecodeInferRequest(
        header, binary, InferRequestLimits{options_.limits.max_body_bytes, 32, kMaxInputTensors},
        [&charge](size_t bytes) { return charge.Grow(bytes); }, place);
    if (!request.ok()) return fail(request.status());
    // The body is decoded: only the tensors stay charged, until the task answers.
    const size_t body_bytes = req.body.size();
    std::string().swap(req.body);
    (void)charge.Resize(charge.bytes() > body_bytes ? charge.bytes() - body_bytes : 0);
    if (body_bytes >= kTrimAfterBytes) waiting_->Run([] { ReturnFreedMemory(); });
    if (staging != nullptr) {
      staged = staging->region();
      staging.reset();  // written: pswitchd's mapping goes, the worker maps the file itself
      for (size_t i = 0; i < request->inputs.size(); ++i) {
        proto::HostTensor& t = request->inputs[i];
        const bool in_shared_memory =
            i < request->input_regions.size() && request->input_regions[i];
        if (t.place == proto::Place::Region && !in_shared_memory) t.slice.region = staged->id();
      }
    }
  }

  TaskSpec spec;
  spec.model = model;
  spec.arrival_ns = req.arrival_ns;
  if (staged != nullptr) spec.regions.push_back(staged);
  // Triton's shared-memory parameters name the caller's regions: slices of them from here on
  // (admission checks them again, as for every port).
  if (absl::Status placed =
          PlaceInRegions(*regions_, who.name, *request, &spec.regions, &spec.outputs_to);
      !placed.ok()) {
    return fail(placed);
  }
  if (output_only_bytes > 0 && !spec.outputs_to) {
    // The output has no place of the caller's: a staging region of its own, charged as the
    // output room of any staged request is.
    if (absl::Status grown = req.charge.Grow(output_only_bytes); !grown.ok()) return fail(grown);
    absl::StatusOr<std::unique_ptr<StagingMapping>> room =
        StagingMapping::Create(output_only_bytes, who.name);
    if (!room.ok()) return fail(room.status());
    staged = (*room)->region();  // the mapping goes: the worker maps the file itself
    spec.regions.push_back(staged);
    spec.outputs_to = proto::ByteSlice{staged->id(), 0, output_only_bytes};
  }
  if (staged != nullptr && staged_output) {
    if (!spec.outputs_to) {
      staged_output->region = staged->id();
      spec.outputs_to = staged_output;
    } else if (lease == nullptr) {
      // The output goes to the caller's shared memory: the room made for it is never touched
      // (a memfd's pages exist once written), so it is not charged either.
      (void)req.charge.Resize(req.charge.bytes() > staged_output->length
                                  ? req.charge.bytes() - staged_output->length
                                  : 0);
    }
  }
  spec.inputs = std::move(request->inputs);
  if (request->priority) spec.priority = *request->priority;
  if (request->online_slo_us) {
    absl::StatusOr<absl::Duration> objective =
        ParseOnlineObjective(*request->online_slo_us, spec.kind);
    if (!objective.ok()) return fail(objective.status());
    spec.online_slo = *objective;
  }
  absl::Duration wait = options_.infer_timeout;
  if (request->timeout_us) {
    wait = std::min(wait, absl::Microseconds(static_cast<int64_t>(*request->timeout_us)));
  }
  // The scheduler fails a task past its deadline, so every infer is answered within it.
  spec.deadline = absl::Now() + wait;
  const std::string client =
      options_.tokens != nullptr ? who.name : absl::StrCat("http:", req.peer);
  const uint64_t waiting =
      waiting_->Add(std::move(respond), absl::StrCat("the infer request on '", model, "'"));
  if (waiting == 0) return;
  // What the answer needs, apart from the outputs: the request's id and binary wishes.
  auto shape = std::make_shared<InferRequest>(std::move(*request));
  shape->inputs.clear();
  auto held = std::make_shared<BudgetCharge>(std::move(req.charge));
  absl::StatusOr<uint64_t> task = options_.admission->Submit(
      who, client, std::move(spec),
      [table = waiting_, waiting, model, shape, held, staged,
       lease](const absl::StatusOr<TaskOutcome>& out) {
        HttpRespond respond = table->Take(waiting);
        if (respond == nullptr) {  // answered at shutdown
          held->Reset();
          return;
        }
        // Encoding is CPU work: on a handler thread, never the scheduler's loop, unless the
        // answer is only descriptors and a few values (outputs in shared memory or staging),
        // which costs less than the hand-over. The staging region stays charged (and leased)
        // until its outputs are written to the client.
        auto encode = [out = absl::StatusOr<TaskOutcome>(out), model, shape, respond, held, staged,
                       lease]() mutable {
          HttpResponse res;
          if (!out.ok()) {
            held->Reset();
            ReplyError(res, out.status());
            return respond(std::move(res));
          }
          absl::StatusOr<HttpResponse> answer = EncodeInferAnswer(
              model, *shape, out->outputs, staged, std::move(lease), std::move(*held));
          staged.reset();
          if (!answer.ok()) {
            held->Reset();
            ReplyError(res, answer.status());
            return respond(std::move(res));
          }
          const controller::SwitchTimeline& t = out->timeline;
          if (std::string timing =
                  ServerTiming(t.arrival_ns, t.first_layer_start_ns, base::MonotonicNowNs());
              !timing.empty()) {
            answer->set_header("Server-Timing", timing);
          }
          respond(*std::move(answer));
        };
        if (out.ok() && OutputBytes(out->outputs) <= kEncodeOnLoopBytes) return encode();
        if (!table->Run(encode)) {
          held->Reset();
          HttpResponse res;
          ReplyError(res, absl::UnavailableError("pswitchd is shutting down"));
          respond(std::move(res));
        }
      });
  if (!task.ok()) {
    held->Reset();
    if (HttpRespond r = waiting_->Take(waiting)) {
      HttpResponse res;
      ReplyError(res, task.status());
      r(std::move(res));
    }
    return;
  }
}

}  // namespace pswitch::frontend
