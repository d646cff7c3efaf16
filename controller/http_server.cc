#include "controller/http_server.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <limits>
#include <type_traits>
#include <optional>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/json.h"
#include "base/clock.h"
#include "base/log.h"
#include "controller/openapi_doc.h"
#include "base/status.h"
#include "base/text.h"
#include "controller/listen_address.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "api/client_codec.h"
#include "controller/requests.h"
#include "fill/bubble_cycle.h"
#include "proto/client_generated.h"
#include "proto/host_tensor.h"

namespace pswitch::controller {
namespace {

using nlohmann::json;

// Our own values only; invalid UTF-8 (never expected) is replaced rather than thrown over.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void Reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void ReplyError(httplib::Response& res, const absl::Status& status) {
  Reply(res, HttpStatus(status.code()), json{{"error", std::string(status.message())}});
}

// KServe v2 datatype names.
std::optional<proto::DType> DTypeOf(absl::string_view name) {
  if (name == "FP32") return proto::DType::F32;
  if (name == "INT64") return proto::DType::I64;
  if (name == "INT32") return proto::DType::I32;
  if (name == "UINT8") return proto::DType::U8;
  return std::nullopt;
}

const char* DTypeName(proto::DType dtype) {
  switch (dtype) {
    case proto::DType::F32: return "FP32";
    case proto::DType::I64: return "INT64";
    case proto::DType::I32: return "INT32";
    case proto::DType::U8: return "UINT8";
    case proto::DType::F16: return "FP16";
    case proto::DType::BF16: return "BF16";
  }
  return "UNKNOWN";
}

json SpecJson(const TensorSpec& spec) {
  return json{{"name", spec.name}, {"datatype", DTypeName(spec.dtype)}, {"shape", spec.shape}};
}

// Appends `value`'s numbers (nested arrays flattened, row-major) as `dtype` elements.
absl::Status AppendData(const json& value, proto::DType dtype, std::vector<uint8_t>& out) {
  if (value.is_array()) {
    for (const json& v : value) PSWITCH_RETURN_IF_ERROR(AppendData(v, dtype, out));
    return absl::OkStatus();
  }
  auto put = [&out](const auto& element) {
    const auto* p = reinterpret_cast<const uint8_t*>(&element);
    out.insert(out.end(), p, p + sizeof(element));
  };
  if (dtype == proto::DType::F32) {
    if (!value.is_number()) return absl::InvalidArgumentError("FP32 data must be numbers");
    put(value.get<float>());
  } else {
    if (!value.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(DTypeName(dtype), " data must be integers"));
    }
    const int64_t v = value.get<int64_t>();
    if (dtype == proto::DType::I64) put(v);
    if (dtype == proto::DType::I32) put(static_cast<int32_t>(v));
    if (dtype == proto::DType::U8) put(static_cast<uint8_t>(v));
  }
  return absl::OkStatus();
}

// A tensor's "parameters"."binary_data_size" (the binary tensor data extension), if given.
absl::StatusOr<std::optional<uint64_t>> BinarySize(const json& tensor) {
  if (!tensor.contains("parameters") || !tensor["parameters"].is_object() ||
      !tensor["parameters"].contains("binary_data_size")) {
    return std::nullopt;
  }
  const json& size = tensor["parameters"]["binary_data_size"];
  if (!size.is_number_unsigned()) {
    return absl::InvalidArgumentError("binary_data_size must be a byte count");
  }
  return size.get<uint64_t>();
}

// One input tensor of a KServe v2 infer request: its data in JSON, or the next `binary_data_size`
// bytes of `binary` (advanced past them).
absl::StatusOr<proto::HostTensor> InputTensor(const json& in, absl::string_view& binary) {
  if (!in.is_object() || !in.contains("name") || !in["name"].is_string() ||
      !in.contains("shape") || !in["shape"].is_array() || !in.contains("datatype") ||
      !in["datatype"].is_string()) {
    return absl::InvalidArgumentError(
        "each input needs \"name\", \"shape\", \"datatype\" and its data");
  }
  PSWITCH_ASSIGN_OR_RETURN(std::optional<uint64_t> binary_size, BinarySize(in));
  if (!binary_size && !in.contains("data")) {
    return absl::InvalidArgumentError("an input needs \"data\" or a binary_data_size");
  }
  proto::HostTensor t;
  t.name = in["name"].get<std::string>();
  PSWITCH_RETURN_IF_ERROR(base::CheckText(t.name, "input name", 128));
  std::optional<proto::DType> dtype = DTypeOf(in["datatype"].get<std::string>());
  if (!dtype) {
    return absl::InvalidArgumentError(
        "datatype must be FP32, INT64, INT32 or UINT8 (as the model's metadata says)");
  }
  t.dtype = *dtype;
  for (const json& d : in["shape"]) {
    if (!d.is_number_integer()) return absl::InvalidArgumentError("shape must be integers");
    t.shape.push_back(d.get<int64_t>());
  }
  if (binary_size) {
    if (*binary_size > binary.size()) {
      return absl::InvalidArgumentError(
          "binary_data_size runs past the end of the request's binary data");
    }
    t.data.assign(binary.begin(), binary.begin() + static_cast<ptrdiff_t>(*binary_size));
    binary.remove_prefix(*binary_size);
  } else {
    PSWITCH_RETURN_IF_ERROR(AppendData(in["data"], t.dtype, t.data));
  }
  PSWITCH_RETURN_IF_ERROR(proto::ValidateHostTensor(t));
  return t;
}

// Whether the request asks for `name` as binary data (per output, or for all).
bool WantsBinary(const json& request, const std::string& name) {
  if (request.contains("parameters") && request["parameters"].is_object()) {
    const json& p = request["parameters"];
    if (p.contains("binary_data_output") && p["binary_data_output"] == true) return true;
  }
  if (!request.contains("outputs") || !request["outputs"].is_array()) return false;
  for (const json& out : request["outputs"]) {
    if (out.is_object() && out.contains("name") && out["name"] == name &&
        out.contains("parameters") && out["parameters"].is_object() &&
        out["parameters"].contains("binary_data") && out["parameters"]["binary_data"] == true) {
      return true;
    }
  }
  return false;
}

json OutputJson(const proto::HostTensor& t) {
  json data = json::array();
  const uint8_t* p = t.data.data();
  const size_t n = t.data.size() / std::max<size_t>(proto::DTypeBytes(t.dtype), 1);
  for (size_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case proto::DType::F32: {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        data.push_back(v);
        break;
      }
      case proto::DType::I64: {
        int64_t v;
        std::memcpy(&v, p + 8 * i, 8);
        data.push_back(v);
        break;
      }
      case proto::DType::I32: {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        data.push_back(v);
        break;
      }
      case proto::DType::U8:
        data.push_back(p[i]);
        break;
      default:
        break;
    }
  }
  return json{{"name", t.name}, {"datatype", DTypeName(t.dtype)}, {"shape", t.shape},
              {"data", std::move(data)}};
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

// A request body that is optional but, when sent, a JSON object (the repository extension's
// requests): an empty body is an empty object.
absl::StatusOr<json> OptionalObjectBody(const httplib::Request& req, const char* what,
                                        uint64_t max_bytes) {
  if (req.body.empty()) return json::object();
  PSWITCH_ASSIGN_OR_RETURN(json body,
                           base::ParseUntrustedJson(req.body, what, base::JsonLimits{max_bytes, 32}));
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
  static const char* const kKnown[] = {"kind",   "model",     "dataset",       "output",
                                       "batch",  "steps",     "seed",          "step_us",
                                       "memory_bytes", "deadline_ms", "synthetic_step_us",
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
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted: return 409;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

HttpServer::HttpServer(Controller* controller, HttpServerOptions options)
    : controller_(controller),
      options_(options),
      server_(std::make_unique<httplib::Server>()) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen,
                                                              Controller* controller,
                                                              HttpServerOptions options) {
  PSWITCH_ASSIGN_OR_RETURN(ListenAddress address, SplitListen(listen));
  std::unique_ptr<HttpServer> s(new HttpServer(controller, options));
  s->server_->set_payload_max_length(options.max_body_bytes);
  // Headers and body go out as separate writes: without this, Nagle and delayed ACKs add ~40 ms.
  s->server_->set_tcp_nodelay(true);
  s->server_->set_read_timeout(absl::ToChronoSeconds(options.read_timeout));
  s->Route();
  if (address.port == 0) {
    const int port = s->server_->bind_to_any_port(address.host);
    if (port < 0) return absl::UnavailableError(absl::StrCat("HTTP listen on ", listen, " failed"));
    s->port_ = static_cast<uint16_t>(port);
  } else {
    if (!s->server_->bind_to_port(address.host, address.port)) {
      return absl::UnavailableError(absl::StrCat("HTTP listen on ", listen, " failed"));
    }
    s->port_ = address.port;
  }
  base::Log(base::LogLevel::kInfo, "http_routes").Field("routes", absl::StrJoin(s->routes_, ","));
  s->thread_ = std::thread([server = s->server_.get()] { server->listen_after_bind(); });
  // stop() only stops a server already running: until then a destructor could not end it.
  for (int i = 0; i < 5000 && !s->server_->is_running(); ++i) absl::SleepFor(absl::Milliseconds(1));
  if (!s->server_->is_running()) return absl::InternalError("the HTTP server did not start");
  return s;
}

HttpServer::~HttpServer() {
  stopping_.Notify();
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::Handle(const char* method, const std::string& path,
                        httplib::Server::Handler handler) {
  // Each {param} matches one path segment; its value is req.matches[i], in order.
  static const std::regex kParam(R"(\{[a-z_]+\})");
  const std::string pattern = std::regex_replace(path, kParam, "([^/]+)");
  const std::string m(method);
  if (m == "GET") {
    server_->Get(pattern, std::move(handler));
  } else if (m == "POST") {
    server_->Post(pattern, std::move(handler));
  } else if (m == "PUT") {
    server_->Put(pattern, std::move(handler));
  } else {
    server_->Delete(pattern, std::move(handler));
  }
  routes_.push_back(absl::StrCat(m, " ", path));
}

void HttpServer::Route() {
  httplib::Server& http = *server_;
  // Every error the library itself answers (404 route, 413 body, 400 parse) gets our JSON body.
  http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const char* what = res.status == 413   ? "request body too large"
                       : res.status == 404 ? "no such route"
                                           : "bad request";
    res.set_content(Dump(json{{"error", what}}), "application/json");
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        Reply(res, 500, json{{"error", "internal error"}});
      });
  // The principal of a request, or an error already written to `res`.
  auto authorize = [this](const httplib::Request& req,
                          httplib::Response& res) -> std::optional<Principal> {
    if (options_.tokens == nullptr) return Principal{"anonymous", Role::kAdmin};
    const std::string header = req.get_header_value("Authorization");
    constexpr absl::string_view kBearer = "Bearer ";
    std::optional<Principal> found;
    if (absl::StartsWith(header, kBearer)) {
      found = options_.tokens->Find(absl::string_view(header).substr(kBearer.size()));
    }
    if (!found) {
      res.set_header("WWW-Authenticate", "Bearer");
      ReplyError(res, absl::UnauthenticatedError(
                          "this pswitchd needs a token: Authorization: Bearer TOKEN"));
    }
    return found;
  };

  // This API's OpenAPI document (docs/openapi.json, built in): open, like the health checks.
  Handle("GET", "/openapi.json", [](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(std::string(OpenApiDocument()), "application/json");
  });
  // Health: open, as probes have no token.
  Handle("GET", "/v2/health/live", [](const httplib::Request&, httplib::Response& res) {
    Reply(res, 200, json{{"live", true}});
  });
  Handle("GET", "/v2/health/ready", [this](const httplib::Request&, httplib::Response& res) {
    const bool ready = controller_->scheduler().AwaitWorkersReady(absl::ZeroDuration());
    Reply(res, ready ? 200 : 503, json{{"ready", ready}});
  });
  Handle("GET", "/v2", [authorize](const httplib::Request& req, httplib::Response& res) {
    if (!authorize(req, res)) return;
    Reply(res, 200, json{{"name", "pswitch"}, {"version", "1"}, {"extensions", json::array({"binary_tensor_data", "model_repository"})}});
  });
  Handle("GET", "/v2/models/{model}", [this, authorize](const httplib::Request& req, httplib::Response& res) {
    if (!authorize(req, res)) return;
    absl::StatusOr<EntryRef> entry = controller_->catalog().Find(req.matches[1].str());
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
           [this, authorize](const httplib::Request& req, httplib::Response& res) {
             if (!authorize(req, res)) return;
             const bool ready = controller_->catalog().Find(req.matches[1].str()).ok();
             Reply(res, ready ? 200 : 404, json{{"name", req.matches[1].str()}, {"ready", ready}});
           });
  // pswitch's own resources (v1): training tasks, with the TCP port's owners and caps.
  Handle("POST", "/v1/tasks", [this, authorize](const httplib::Request& req, httplib::Response& res) {
    if (std::optional<Principal> who = authorize(req, res)) SubmitTraining(*who, req, res);
  });
  Handle("GET", "/v1/tasks", [this, authorize](const httplib::Request& req, httplib::Response& res) {
    std::optional<Principal> who = authorize(req, res);
    if (!who) return;
    size_t limit = 100;
    if (req.has_param("limit") &&
        (!absl::SimpleAtoi(req.get_param_value("limit"), &limit) || limit == 0 || limit > 1000)) {
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
  auto task_of = [this, authorize](const httplib::Request& req,
                                   httplib::Response& res) -> std::optional<uint64_t> {
    std::optional<Principal> who = authorize(req, res);
    if (!who) return std::nullopt;
    const std::string text = req.matches[1].str();
    uint64_t id = 0;
    if (!absl::SimpleAtoi(text, &id) ||
        (options_.owners != nullptr && !options_.owners->MayAccess(*who, id))) {
      ReplyError(res,
                 absl::NotFoundError(absl::StrCat("no task ", absl::CHexEscape(text.substr(0, 32)))));
      return std::nullopt;
    }
    return id;
  };
  Handle("GET", "/v1/tasks/{task}",
           [this, task_of](const httplib::Request& req, httplib::Response& res) {
             std::optional<uint64_t> id = task_of(req, res);
             if (!id) return;
             absl::StatusOr<TaskStatus> status = controller_->Query(*id);
             if (!status.ok()) return ReplyError(res, status.status());
             Reply(res, 200, TaskJson(*status));
           });
  Handle("DELETE", "/v1/tasks/{task}", [this, task_of](const httplib::Request& req,
                                                       httplib::Response& res) {
    std::optional<uint64_t> found = task_of(req, res);
    if (!found) return;
    const uint64_t id = *found;
    if (absl::Status cancelled = controller_->Cancel(id); !cancelled.ok()) {
      return ReplyError(res, cancelled);
    }
    // A training task stops at its next iteration; its state says when it has.
    Reply(res, 202, json{{"task_id", id}, {"cancel", "requested"}});
  });
  Handle("POST", "/v2/models/{model}/infer",
            [this, authorize](const httplib::Request& req, httplib::Response& res) {
              if (std::optional<Principal> who = authorize(req, res)) {
                Infer(*who, req.matches[1].str(), req, res);
              }
            });
  RouteOperations(authorize);
  RouteRepository(authorize);
}

void HttpServer::RouteRepository(const Authorizer& authorize) {
  Handle("POST", "/v2/repository/index", [this, authorize](const httplib::Request& req,
                                                            httplib::Response& res) {
    if (!authorize(req, res)) return;
    bool ready_only = false;
    absl::StatusOr<json> body =
        OptionalObjectBody(req, "repository index request", options_.max_body_bytes);
    if (!body.ok()) return ReplyError(res, body.status());
    if (absl::Status s = Member(*body, "ready", ready_only); !s.ok()) return ReplyError(res, s);
    // Registered models (whichever way) and the repository's, each once, by name.
    std::map<std::string, json> models;
    for (const EntryRef& e : controller_->List()) {
      models[e->request.name] = {{"name", e->request.name}, {"version", "1"}, {"state", "READY"},
                                 {"reason", ""}};
    }
    if (options_.repository != nullptr && !ready_only) {
      absl::StatusOr<std::vector<std::string>> index = options_.repository->Index();
      if (!index.ok()) return ReplyError(res, index.status());
      for (const std::string& name : *index) {
        models.try_emplace(name, json{{"name", name}, {"version", "1"}, {"state", "UNAVAILABLE"},
                                      {"reason", "not loaded"}});
      }
    }
    json list = json::array();
    for (auto& [name, entry] : models) list.push_back(std::move(entry));
    Reply(res, 200, list);
  });

  Handle("POST", "/v2/repository/models/{model}/load", [this, authorize](
                                                           const httplib::Request& req,
                                                           httplib::Response& res) {
    std::optional<Principal> who = authorize(req, res);
    if (!who) return;
    if (who->role != Role::kAdmin) {
      return ReplyError(res, absl::PermissionDeniedError("loading a model needs an admin token"));
    }
    if (options_.repository == nullptr) {
      return ReplyError(res, absl::NotFoundError("this pswitchd has no --model-repository"));
    }
    const std::string name = req.matches[1].str();
    if (absl::Status text = base::CheckText(name, "model name", 128); !text.ok()) {
      return ReplyError(res, text);
    }
    if (absl::StartsWith(name, kFillModelPrefix)) {
      return ReplyError(res, absl::InvalidArgumentError(absl::StrCat(
                                 "model names starting with '", kFillModelPrefix,
                                 "' are reserved for fill jobs' own models")));
    }
    std::optional<std::string> config;
    absl::StatusOr<json> body = OptionalObjectBody(req, "load request", options_.max_body_bytes);
    if (!body.ok()) return ReplyError(res, body.status());
    if (body->contains("parameters")) {
      const json& parameters = (*body)["parameters"];
      if (!parameters.is_object()) {
        return ReplyError(res, absl::InvalidArgumentError("\"parameters\" must be an object"));
      }
      std::string text;
      if (absl::Status s = Member(parameters, "config", text); !s.ok()) return ReplyError(res, s);
      if (parameters.contains("config")) config = std::move(text);
    }
    if (controller_->catalog().Find(name).ok()) {
      return ReplyError(res, absl::AlreadyExistsError(absl::StrCat(
                                 "model '", name, "' is already loaded")));
    }
    // Registration reads the repository on the controller's registration thread; this pool
    // thread waits for it, bounded.
    auto done = std::make_shared<std::promise<absl::Status>>();
    std::future<absl::Status> registered = done->get_future();
    controller_->Register(
        [repository = options_.repository, name, config]() {
          return repository->Request(name, config ? &*config : nullptr);
        },
        [done](const absl::StatusOr<EntryRef>& entry) { done->set_value(entry.status()); });
    if (registered.wait_for(absl::ToChronoSeconds(options_.infer_timeout)) !=
        std::future_status::ready) {
      return ReplyError(res, absl::DeadlineExceededError(absl::StrCat(
                                 "loading '", name, "' is still going on after ",
                                 absl::FormatDuration(options_.infer_timeout))));
    }
    if (absl::Status s = registered.get(); !s.ok()) return ReplyError(res, s);
    base::Log(base::LogLevel::kInfo, "model_registered").Field("model", name).Field("source", "http");
    Reply(res, 200, json::object());
  });
  // Any registered model, wherever it came from. Queued tasks on it fail, a running inference
  // batch finishes, a running training task is cancelled; the answer comes once it is freed.
  Handle("POST", "/v2/repository/models/{model}/unload",
         [this, authorize](const httplib::Request& req, httplib::Response& res) {
    std::optional<Principal> who = authorize(req, res);
    if (!who) return;
    if (who->role != Role::kAdmin) {
      return ReplyError(res, absl::PermissionDeniedError("unloading a model needs an admin token"));
    }
    const std::string name = req.matches[1].str();
    if (absl::Status valid = CheckUnloadName(name); !valid.ok()) return ReplyError(res, valid);
    if (options_.fill != nullptr) {
      if (absl::Status owned = options_.fill->CheckUnload(name); !owned.ok()) {
        return ReplyError(res, owned);
      }
    }
    // Triton's {"parameters": {"unload_dependents": ...}}: pswitch models have no dependents.
    absl::StatusOr<json> body = OptionalObjectBody(req, "unload request", options_.max_body_bytes);
    if (!body.ok()) return ReplyError(res, body.status());
    auto done = std::make_shared<std::promise<absl::Status>>();
    std::future<absl::Status> unloaded = done->get_future();
    controller_->Unload(name, [done](absl::Status status) { done->set_value(status); });
    if (unloaded.wait_for(absl::ToChronoSeconds(options_.infer_timeout)) !=
        std::future_status::ready) {
      return ReplyError(res, absl::DeadlineExceededError(absl::StrCat(
                                 "unloading '", name, "' is still going on after ",
                                 absl::FormatDuration(options_.infer_timeout),
                                 " (it waits for the model's running task)")));
    }
    if (absl::Status s = unloaded.get(); !s.ok()) return ReplyError(res, s);
    base::Log(base::LogLevel::kInfo, "model_unloaded").Field("model", name).Field("source", "http");
    Reply(res, 200, json::object());
  });
}

void HttpServer::RouteOperations(const Authorizer& authorize) {
  // Bubble cycles and fill jobs are the operator's (admin), as on the TCP port.
  auto admin = [authorize](const httplib::Request& req, httplib::Response& res) {
    std::optional<Principal> who = authorize(req, res);
    if (who && who->role != Role::kAdmin) {
      ReplyError(res, absl::PermissionDeniedError(absl::StrCat(
                          "'", who->name, "' (role user) may infer, train and see and cancel its "
                          "own tasks; this request needs an admin token")));
      return false;
    }
    return who.has_value();
  };
  auto fill_ready = [this](httplib::Response& res) {
    if (options_.fill == nullptr) {
      ReplyError(res, absl::UnavailableError("fill jobs are not served here"));
      return false;
    }
    return true;
  };
  auto body_json = [this](const httplib::Request& req, const char* what) {
    return base::ParseUntrustedJson(req.body, what, base::JsonLimits{options_.max_body_bytes, 32});
  };

  Handle("GET", "/metrics", [this, authorize](const httplib::Request& req, httplib::Response& res) {
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
  Handle("GET", "/v1/trace", [this, admin](const httplib::Request& req, httplib::Response& res) {
    if (!admin(req, res)) return;
    if (options_.telemetry == nullptr) {
      return ReplyError(res, absl::UnavailableError("no trace is kept here"));
    }
    int seconds = 10;
    if (req.has_param("seconds") &&
        (!absl::SimpleAtoi(req.get_param_value("seconds"), &seconds) || seconds < 1 ||
         seconds > 600)) {
      return ReplyError(res, absl::InvalidArgumentError("seconds must be in [1, 600]"));
    }
    res.status = 200;
    res.set_content(options_.telemetry->trace().ChromeJson(absl::Seconds(seconds),
                                                           base::MonotonicNowNs()),
                    "application/json");
  });

  Handle("GET", "/v1/gpus", [this, authorize](const httplib::Request& req, httplib::Response& res) {
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
      json gpu{{"gpu", s->gpu},
               {"resident_model", s->resident_model.empty() ? json(nullptr) : json(s->resident_model)},
               {"workers", std::move(workers)},
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
           [this, admin, fill_ready, body_json](const httplib::Request& req,
                                                httplib::Response& res) {
             if (!admin(req, res) || !fill_ready(res)) return;
             int gpu = 0;
             if (!absl::SimpleAtoi(req.matches[1].str(), &gpu) || gpu < 0 ||
                 static_cast<size_t>(gpu) >= controller_->gpus()) {
               return ReplyError(res, absl::NotFoundError(absl::StrCat(
                                          "no GPU ", req.matches[1].str(), " (this pswitchd has ",
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
  auto fill_request = [body_json](const httplib::Request& req) -> absl::StatusOr<FillRequest> {
    PSWITCH_ASSIGN_OR_RETURN(json body, body_json(req, "fill job"));
    return FillRequestFromJson(body);
  };
  Handle("POST", "/v1/fill/jobs", [this, admin, fill_ready, fill_request](
                                 const httplib::Request& req, httplib::Response& res) {
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
  Handle("POST", "/v1/fill/estimate", [this, admin, fill_ready, fill_request](
                                     const httplib::Request& req, httplib::Response& res) {
    if (!admin(req, res) || !fill_ready(res)) return;
    absl::StatusOr<FillRequest> request = fill_request(req);
    if (!request.ok()) return ReplyError(res, request.status());
    absl::StatusOr<FillJobStatus> s = options_.fill->Estimate(*std::move(request));
    if (!s.ok()) return ReplyError(res, s.status());
    Reply(res, 200, FillJobJson(*s));
  });
  auto job_of = [](const httplib::Request& req, httplib::Response& res) -> std::optional<uint64_t> {
    uint64_t id = 0;
    if (!absl::SimpleAtoi(req.matches[1].str(), &id)) {
      ReplyError(res, absl::NotFoundError(absl::StrCat(
                          "no fill job ", absl::CHexEscape(req.matches[1].str().substr(0, 32)))));
      return std::nullopt;
    }
    return id;
  };
  Handle("GET", "/v1/fill/jobs/{job}", [this, admin, fill_ready, job_of](
                                           const httplib::Request& req, httplib::Response& res) {
    if (!admin(req, res) || !fill_ready(res)) return;
    std::optional<uint64_t> id = job_of(req, res);
    if (!id) return;
    absl::StatusOr<FillJobStatus> s = options_.fill->Query(*id);
    if (!s.ok()) return ReplyError(res, s.status());
    Reply(res, 200, FillJobJson(*s));
  });
  Handle("DELETE", "/v1/fill/jobs/{job}", [this, admin, fill_ready, job_of](
                                              const httplib::Request& req, httplib::Response& res) {
    if (!admin(req, res) || !fill_ready(res)) return;
    std::optional<uint64_t> id = job_of(req, res);
    if (!id) return;
    if (absl::Status s = options_.fill->Cancel(*id); !s.ok()) return ReplyError(res, s);
    absl::StatusOr<FillJobStatus> s = options_.fill->Query(*id);
    if (!s.ok()) return ReplyError(res, s.status());
    Reply(res, 200, FillJobJson(*s));
  });
  Handle("GET", "/v1/fill/stats", [this, admin, fill_ready](const httplib::Request& req,
                                                       httplib::Response& res) {
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
               {"killed", s.killed}});
  });
}

void HttpServer::SubmitTraining(const Principal& who, const httplib::Request& req,
                                httplib::Response& res) {
  absl::StatusOr<json> body = base::ParseUntrustedJson(
      req.body, "task request", base::JsonLimits{options_.max_body_bytes, 32});
  if (!body.ok()) return ReplyError(res, body.status());
  if (!body->is_object()) return ReplyError(res, absl::InvalidArgumentError("expected an object"));
  TaskSpec spec;
  spec.kind = TaskKind::kTraining;
  std::string optimizer = "sgd";
  uint64_t deadline_ms = 0;
  for (absl::Status s :
       {Member(*body, "model", spec.model), Member(*body, "iterations", spec.iterations),
        Member(*body, "batch", spec.batch), Member(*body, "seed", spec.seed),
        Member(*body, "priority", spec.priority), Member(*body, "optimizer", optimizer),
        Member(*body, "learning_rate", spec.trainer.learning_rate),
        Member(*body, "momentum", spec.trainer.momentum),
        Member(*body, "deadline_ms", deadline_ms)}) {
    if (!s.ok()) return ReplyError(res, s);
  }
  if (absl::Status name = base::CheckText(spec.model, "model name", 128); !name.ok()) {
    return ReplyError(res, name);
  }
  if (spec.model.empty()) {
    return ReplyError(res, absl::InvalidArgumentError("a training task needs \"model\""));
  }
  if (optimizer != "sgd" && optimizer != "adam") {
    return ReplyError(res, absl::InvalidArgumentError("optimizer must be \"sgd\" or \"adam\""));
  }
  spec.trainer.optimizer =
      optimizer == "adam" ? models::OptimizerKind::kAdam : models::OptimizerKind::kSgd;
  if (spec.trainer.optimizer == models::OptimizerKind::kAdam) spec.trainer.momentum = 0;
  if (deadline_ms > 0) {
    spec.deadline = absl::Now() + absl::Milliseconds(static_cast<int64_t>(
                                      std::min<uint64_t>(deadline_ms, 86400ull * 1000)));
  }
  const std::string client = options_.tokens != nullptr ? who.name : "http";
  if (options_.quota != nullptr) {
    if (absl::Status admitted = options_.quota->Admit(client); !admitted.ok()) {
      return ReplyError(res, admitted);
    }
  }
  ClientQuota* quota = options_.quota;
  absl::StatusOr<uint64_t> task = controller_->Submit(
      std::move(spec), [quota, client](const absl::StatusOr<TaskOutcome>&) {
        if (quota != nullptr) quota->Done(client);
      });
  if (!task.ok()) {
    if (quota != nullptr) quota->Done(client);
    return ReplyError(res, task.status());
  }
  if (options_.owners != nullptr) options_.owners->Record(*task, who.name);
  res.set_header("Location", absl::StrCat("/v1/tasks/", *task));
  Reply(res, 202, json{{"task_id", *task}});
}

void HttpServer::Infer(const Principal& who, const std::string& model,
                       const httplib::Request& req, httplib::Response& res) {
  // The binary tensor data extension: a JSON header of this many bytes, then raw tensors.
  absl::string_view header = req.body;
  absl::string_view binary;
  if (req.has_header("Inference-Header-Content-Length")) {
    size_t json_bytes = 0;
    if (!absl::SimpleAtoi(req.get_header_value("Inference-Header-Content-Length"), &json_bytes) ||
        json_bytes > req.body.size()) {
      return ReplyError(res, absl::InvalidArgumentError(
                                 "Inference-Header-Content-Length must be within the body"));
    }
    header = header.substr(0, json_bytes);
    binary = absl::string_view(req.body).substr(json_bytes);
  }
  absl::StatusOr<json> request = base::ParseUntrustedJson(
      header, "infer request", base::JsonLimits{options_.max_body_bytes, 32});
  if (!request.ok()) return ReplyError(res, request.status());
  if (!request->is_object() || !request->contains("inputs") || !(*request)["inputs"].is_array()) {
    return ReplyError(res, absl::InvalidArgumentError("an infer request needs \"inputs\": [...]"));
  }
  if ((*request)["inputs"].size() > kMaxInputTensors) {
    return ReplyError(res, absl::InvalidArgumentError(absl::StrCat(
                               "a task takes at most ", kMaxInputTensors, " input tensors")));
  }
  TaskSpec spec;
  spec.model = model;
  for (const json& in : (*request)["inputs"]) {
    absl::StatusOr<proto::HostTensor> tensor = InputTensor(in, binary);
    if (!tensor.ok()) return ReplyError(res, tensor.status());
    spec.inputs.push_back(*std::move(tensor));
  }
  if (!binary.empty()) {
    return ReplyError(res, absl::InvalidArgumentError(absl::StrCat(
                               binary.size(), " bytes of binary data belong to no input")));
  }
  // Triton's request parameters: priority, and timeout in microseconds.
  if (request->contains("parameters") && (*request)["parameters"].is_object()) {
    const json& p = (*request)["parameters"];
    if (p.contains("priority")) {
      if (!p["priority"].is_number_integer()) {
        return ReplyError(res, absl::InvalidArgumentError("priority must be an integer"));
      }
      spec.priority = static_cast<int>(std::clamp<int64_t>(p["priority"].get<int64_t>(), -1000000, 1000000));
    }
    if (p.contains("timeout")) {
      if (!p["timeout"].is_number_unsigned()) {
        return ReplyError(res, absl::InvalidArgumentError("timeout must be microseconds"));
      }
      const uint64_t us = std::min<uint64_t>(p["timeout"].get<uint64_t>(), 86400ull * 1000000);
      if (us > 0) spec.deadline = absl::Now() + absl::Microseconds(static_cast<int64_t>(us));
    }
  }
  std::string id;
  if (request->contains("id") && (*request)["id"].is_string()) {
    id = (*request)["id"].get<std::string>();
    if (!base::CheckText(id, "request id", 256).ok()) id.clear();
  }
  const std::string client = options_.tokens != nullptr ? who.name : "http";
  ClientQuota* quota = options_.quota;
  if (quota != nullptr) {
    if (absl::Status admitted = quota->Admit(client); !admitted.ok()) {
      return ReplyError(res, admitted);
    }
  }
  auto answer = std::make_shared<std::promise<absl::StatusOr<TaskOutcome>>>();
  std::future<absl::StatusOr<TaskOutcome>> done = answer->get_future();
  absl::StatusOr<uint64_t> task = controller_->Submit(
      std::move(spec), [answer, quota, client](const absl::StatusOr<TaskOutcome>& out) {
        if (quota != nullptr) quota->Done(client);
        answer->set_value(out);
      });
  if (!task.ok()) {
    if (quota != nullptr) quota->Done(client);
    return ReplyError(res, task.status());
  }
  if (options_.owners != nullptr) options_.owners->Record(*task, who.name);
  // Waited in slices, so shutdown never waits on a task (its answer, if any, is dropped).
  const absl::Time give_up = absl::Now() + options_.infer_timeout;
  while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (stopping_.HasBeenNotified()) {
      return ReplyError(res, absl::UnavailableError("pswitchd is shutting down"));
    }
    if (absl::Now() >= give_up) {
      (void)controller_->Cancel(*task);
      return ReplyError(res, absl::DeadlineExceededError(absl::StrCat(
                                 "no answer within ", absl::FormatDuration(options_.infer_timeout))));
    }
  }
  absl::StatusOr<TaskOutcome> outcome = done.get();
  if (!outcome.ok()) return ReplyError(res, outcome.status());
  json outputs = json::array();
  std::string binary_out;
  bool any_binary = false;
  for (const proto::HostTensor& t : outcome->outputs) {
    if (!WantsBinary(*request, t.name)) {
      outputs.push_back(OutputJson(t));
      continue;
    }
    json out = json{{"name", t.name}, {"datatype", DTypeName(t.dtype)}, {"shape", t.shape},
                    {"parameters", {{"binary_data_size", t.data.size()}}}};
    outputs.push_back(std::move(out));
    any_binary = true;
    binary_out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  json reply{{"model_name", model}, {"model_version", "1"}, {"outputs", std::move(outputs)}};
  if (!id.empty()) reply["id"] = id;
  if (!any_binary) return Reply(res, 200, reply);
  std::string body = Dump(reply);
  res.status = 200;
  res.set_header("Inference-Header-Content-Length", std::to_string(body.size()));
  body += binary_out;
  res.set_content(std::move(body), "application/octet-stream");
}

}  // namespace pswitch::controller
