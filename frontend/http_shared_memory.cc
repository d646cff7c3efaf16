// Triton's shared-memory extensions on the HTTP port, with Triton's paths and bodies, so that
// tritonclient's register_system_shared_memory, get_system_shared_memory_status and
// unregister_system_shared_memory (and their CUDA counterparts) work unchanged:
//   POST /v2/systemsharedmemory/region/{name}/register  {"key", "offset", "byte_size"}
//   POST /v2/systemsharedmemory/region/{name}/unregister, POST /v2/systemsharedmemory/unregister
//   GET  /v2/systemsharedmemory/status, GET /v2/systemsharedmemory/region/{name}/status
//   and /v2/cudasharedmemory/... with {"raw_handle": {"b64"}, "device_id", "byte_size"}.
// Who may map which segment is frontend/triton_shm.h's; a principal sees only its own regions.
#include <optional>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "frontend/http_server.h"
#include "nlohmann/json.hpp"

namespace pswitch::frontend {
namespace {

using dataplane::RegionKind;
using nlohmann::json;

void Reply(HttpResponse& res, const json& body) {
  res.status = 200;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}
void ReplyError(HttpResponse& res, const absl::Status& status) {
  SetJsonError(res, HttpStatus(status.code()), status.message());
}

// A register request's body: a JSON object of at most 4 KiB.
absl::StatusOr<json> RegisterBody(const HttpRequest& req) {
  constexpr uint64_t kMaxRegisterBodyBytes = 4096;
  absl::StatusOr<json> body = base::ParseUntrustedJson(req.body, "shared-memory registration",
                                                       base::JsonLimits{kMaxRegisterBodyBytes, 8});
  if (!body.ok()) return body.status();
  if (!body->is_object()) return absl::InvalidArgumentError("expected an object");
  return body;
}

absl::StatusOr<uint64_t> Count(const json& body, const char* key, bool required) {
  auto it = body.find(key);
  if (it == body.end()) {
    if (!required) return 0;
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is required"));
  }
  if (!it->is_number_unsigned()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be a byte count"));
  }
  return it->get<uint64_t>();
}

}  // namespace

void HttpServer::RouteSharedMemory() {
  auto caller = [this](const HttpRequest& req, HttpResponse& res) { return Identify(req, res); };

  // System shared memory: a segment under /dev/shm the caller owns.
  // Status of all the caller's regions (`name` empty) or of one.
  auto system_status = [this, caller](const HttpRequest& req, HttpResponse& res,
                                      const std::string& name) {
    std::optional<Caller> who = caller(req, res);
    if (!who) return;
    absl::StatusOr<std::vector<SystemRegionStatus>> regions =
        triton_regions_.SystemStatus(who->principal.name, name);
    if (!regions.ok()) return ReplyError(res, regions.status());
    json list = json::array();
    for (const SystemRegionStatus& r : *regions) {
      list.push_back(
          {{"name", r.name}, {"key", r.key}, {"offset", r.offset}, {"byte_size", r.bytes}});
    }
    Reply(res, list);
  };
  Handle("GET", "/v2/systemsharedmemory/status",
         [system_status](const HttpRequest& req, HttpResponse& res) {
           system_status(req, res, "");
         });
  Handle("GET", "/v2/systemsharedmemory/region/{name}/status",
         [system_status](const HttpRequest& req, HttpResponse& res) {
           system_status(req, res, req.params[0]);
         });
  Handle(
      "POST", "/v2/systemsharedmemory/region/{name}/register",
      [this, caller](const HttpRequest& req, HttpResponse& res) {
        std::optional<Caller> who = caller(req, res);
        if (!who) return;
        absl::StatusOr<json> body = RegisterBody(req);
        if (!body.ok()) return ReplyError(res, body.status());
        auto key = body->find("key");
        if (key == body->end() || !key->is_string()) {
          return ReplyError(
              res, absl::InvalidArgumentError("\"key\" (the segment's shm_open name, \"/name\") is "
                                              "required"));
        }
        absl::StatusOr<uint64_t> offset = Count(*body, "offset", false);
        if (!offset.ok()) return ReplyError(res, offset.status());
        absl::StatusOr<uint64_t> bytes = Count(*body, "byte_size", true);
        if (!bytes.ok()) return ReplyError(res, bytes.status());
        absl::Status registered = triton_regions_.RegisterSystem(
            who->principal.name, who->uid, req.params[0], key->get<std::string>(), *offset, *bytes);
        if (!registered.ok()) return ReplyError(res, registered);
        Reply(res, json::object());
      });
  Handle("POST", "/v2/systemsharedmemory/region/{name}/unregister",
         [this, caller](const HttpRequest& req, HttpResponse& res) {
           std::optional<Caller> who = caller(req, res);
           if (!who) return;
           if (absl::Status s = CheckRegionName(req.params[0]); !s.ok()) return ReplyError(res, s);
           absl::Status removed =
               triton_regions_.Unregister(who->principal.name, RegionKind::kShmFile, req.params[0]);
           if (!removed.ok()) return ReplyError(res, removed);
           Reply(res, json::object());
         });
  Handle("POST", "/v2/systemsharedmemory/unregister",
         [this, caller](const HttpRequest& req, HttpResponse& res) {
           std::optional<Caller> who = caller(req, res);
           if (!who) return;
           absl::Status removed =
               triton_regions_.Unregister(who->principal.name, RegionKind::kShmFile, "");
           if (!removed.ok()) return ReplyError(res, removed);
           Reply(res, json::object());
         });

  // CUDA shared memory: a client's device allocation named by its IPC handle. The host backend
  // has no device to map it on.
  auto cuda_served = [this](HttpResponse& res) {
    if (options_.cuda_shared_memory) return true;
    ReplyError(res, absl::UnimplementedError(
                        "CUDA shared memory is served only on the CUDA backend; this pswitchd "
                        "runs the host backend (use system shared memory)"));
    return false;
  };
  auto cuda_status = [this, caller, cuda_served](const HttpRequest& req, HttpResponse& res,
                                                 const std::string& name) {
    std::optional<Caller> who = caller(req, res);
    if (!who || !cuda_served(res)) return;
    absl::StatusOr<std::vector<CudaRegionStatus>> regions =
        triton_regions_.CudaStatus(who->principal.name, name);
    if (!regions.ok()) return ReplyError(res, regions.status());
    json list = json::array();
    for (const CudaRegionStatus& r : *regions) {
      list.push_back({{"name", r.name}, {"device_id", r.device}, {"byte_size", r.bytes}});
    }
    Reply(res, list);
  };
  Handle("GET", "/v2/cudasharedmemory/status",
         [cuda_status](const HttpRequest& req, HttpResponse& res) { cuda_status(req, res, ""); });
  Handle("GET", "/v2/cudasharedmemory/region/{name}/status",
         [cuda_status](const HttpRequest& req, HttpResponse& res) {
           cuda_status(req, res, req.params[0]);
         });
  Handle("POST", "/v2/cudasharedmemory/region/{name}/register",
         [this, caller, cuda_served](const HttpRequest& req, HttpResponse& res) {
           std::optional<Caller> who = caller(req, res);
           if (!who || !cuda_served(res)) return;
           // A CUDA IPC handle names some process's device memory, and nothing tells pswitchd
           // whose: mapping one for a user could hand it another tenant's tensors. Admins only.
           if (who->principal.role != Role::kAdmin) {
             return ReplyError(res, absl::PermissionDeniedError(
                                        "CUDA shared memory is registered by admins only: "
                                        "pswitchd cannot tell whose device memory an IPC handle "
                                        "names; use system shared memory"));
           }
           absl::StatusOr<json> body = RegisterBody(req);
           if (!body.ok()) return ReplyError(res, body.status());
           std::string handle;
           auto raw = body->find("raw_handle");
           if (raw == body->end() || !raw->is_object() || !raw->contains("b64") ||
               !(*raw)["b64"].is_string() ||
               !absl::Base64Unescape((*raw)["b64"].get<std::string>(), &handle)) {
             return ReplyError(res, absl::InvalidArgumentError(
                                        "\"raw_handle\": {\"b64\": ...} (the base64 of a CUDA IPC "
                                        "memory handle) is required"));
           }
           absl::StatusOr<uint64_t> device = Count(*body, "device_id", false);
           if (!device.ok()) return ReplyError(res, device.status());
           if (*device > 1024) {
             return ReplyError(res, absl::InvalidArgumentError("bad \"device_id\""));
           }
           absl::StatusOr<uint64_t> bytes = Count(*body, "byte_size", true);
           if (!bytes.ok()) return ReplyError(res, bytes.status());
           absl::Status registered =
               triton_regions_.RegisterCuda(who->principal.name, req.params[0], std::move(handle),
                                            static_cast<int>(*device), *bytes);
           if (!registered.ok()) return ReplyError(res, registered);
           Reply(res, json::object());
         });
  Handle("POST", "/v2/cudasharedmemory/region/{name}/unregister",
         [this, caller, cuda_served](const HttpRequest& req, HttpResponse& res) {
           std::optional<Caller> who = caller(req, res);
           if (!who || !cuda_served(res)) return;
           if (absl::Status s = CheckRegionName(req.params[0]); !s.ok()) return ReplyError(res, s);
           absl::Status removed =
               triton_regions_.Unregister(who->principal.name, RegionKind::kCudaIpc, req.params[0]);
           if (!removed.ok()) return ReplyError(res, removed);
           Reply(res, json::object());
         });
  Handle("POST", "/v2/cudasharedmemory/unregister",
         [this, caller, cuda_served](const HttpRequest& req, HttpResponse& res) {
           std::optional<Caller> who = caller(req, res);
           if (!who || !cuda_served(res)) return;
           absl::Status removed =
               triton_regions_.Unregister(who->principal.name, RegionKind::kCudaIpc, "");
           if (!removed.ok()) return ReplyError(res, removed);
           Reply(res, json::object());
         });
}

}  // namespace pswitch::frontend
