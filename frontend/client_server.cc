#include "frontend/client_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "api/client_codec.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/status.h"
#include "base/text.h"
#include "frontend/listen_address.h"
#include "frontend/memory_return.h"
#include "frontend/passed_files.h"
#include "frontend/peer_identity.h"
#include "frontend/requests.h"
#include "frontend/staging_pool.h"
#include "frontend/unix_socket_file.h"
#include "gpu/copy_engine.h"
#include "models/model_source.h"
#include "proto/accept_retry.h"
#include "proto/client_generated.h"
#include "proto/framed_connection.h"
#include "proto/framing.h"
#include "proto/host_tensor.h"
#include "proto/wire_status.h"

namespace pswitch::frontend {

using controller::FillJobStatus;
using controller::FillStats;
using controller::GpuScheduler;
using controller::SwitchTimeline;
using controller::TaskKind;
using controller::TaskOutcome;
using controller::TaskSpec;
using controller::TaskStatus;
using registry::EntryRef;
using registry::ModelRequest;
namespace {

// What a connection may hold before it authenticates (an Authenticate is far smaller), so the
// unauthenticated pool of the byte budget is never one connection's to fill.
constexpr size_t kMaxUnauthenticatedConnectionBytes = 64 << 10;
// A connection that held this much at some point leaves enough free memory to return.
constexpr size_t kReturnMemoryAfterBytes = 4 << 20;

using Builder = flatbuffers::FlatBufferBuilder;
using proto::ControllerReplyBody;

std::vector<uint8_t> Bytes(const Builder& b) {
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

std::vector<uint8_t> ErrorReply(uint64_t id, const absl::Status& status) {
  Builder b;
  auto error = proto::CreateWireError(b, status);
  proto::Finish(b, proto::CreateControllerReply(b, id, ControllerReplyBody::Error, error.Union()));
  return Bytes(b);
}

uint64_t MaxPayloadBytes(const ClientServerOptions& options) {
  return options.max_payload_bytes != 0 ? options.max_payload_bytes
                                        : uint64_t{4} * options.max_frame_bytes;
}

// Ends a raw payload task's InputsArrival once: with the read's outcome, or, should the
// connection drop the read's callback without running it, with an error when the last holder
// goes, so the task never waits for bytes no one reads.
class ArrivalEnder {
 public:
  ArrivalEnder(std::shared_ptr<controller::InputsArrival> arrival, uint64_t task)
      : arrival_(std::move(arrival)), task_(task) {}
  ~ArrivalEnder() {
    arrival_->End(absl::AbortedError(
        absl::StrCat("task ", task_, ": the connection dropped its raw payload unread")));
  }
  ArrivalEnder(const ArrivalEnder&) = delete;
  ArrivalEnder& operator=(const ArrivalEnder&) = delete;
  void End(absl::Status status) { arrival_->End(std::move(status)); }  // the first end counts

 private:
  const std::shared_ptr<controller::InputsArrival> arrival_;
  const uint64_t task_;
};

// A task list reply stays far below the frame limit (about 100 bytes a task).
constexpr uint32_t kMaxListedTasks = 1000;

}  // namespace

// Handles one client connection's requests; replies from other threads are posted back to the
// event loop and dropped if the connection is gone.
class ClientServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(asio::io_context* io, const bool* serving, Controller* controller, FillManager* fill,
          const ClientServerOptions* options, TaskOwners* owners, TaskAdmission* admission,
          dataplane::RegionTable* regions, Peer peer, uint64_t connection)
      : io_(io),
        serving_(serving),
        controller_(controller),
        fill_(fill),
        options_(options),
        owners_(owners),
        admission_(admission),
        regions_(regions),
        address_(std::move(peer.address)),
        unix_(peer.unix_socket),
        insecure_remote_(peer.insecure_remote),
        connection_(connection),
        principal_(std::move(peer.principal)) {}

  void Attach(std::weak_ptr<proto::FramedConnection> conn) { conn_ = std::move(conn); }
  // Where this connection's slot is counted and what it holds is charged, from now on. Without
  // tokens the connection takes one of --max-connections' slots at once.
  void Admit(ClientServer* server, BudgetCharge charge) {
    server_ = server;
    charge_ = std::move(charge);
    // The Unix socket's peers are known from the start: they need no token.
    if (options_->tokens == nullptr || unix_) {
      ++server_->admitted_;
      counted_ = true;
    }
  }

  // The connection's hook: what it holds now (incomplete frames, queued replies), charged to
  // its client. Before authenticating a connection holds little: an Authenticate is small.
  absl::Status Hold(size_t bytes) {
    if (!principal_ && options_->tokens != nullptr && bytes > kMaxUnauthenticatedConnectionBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a connection may hold ", kMaxUnauthenticatedConnectionBytes,
                       " bytes before it authenticates; authenticate first"));
    }
    PSWITCH_RETURN_IF_ERROR(charge_.Resize(bytes));
    peak_held_bytes_ = std::max(peak_held_bytes_, bytes);
    return absl::OkStatus();
  }

  // Its connection closed: its slot and its bytes go back.
  void Closed() {
    // Its areas end with it; tasks that hold one keep it until they end.
    for (const auto& [owner, ids] : areas_) regions_->RemoveIds(owner, ids);
    areas_.clear();
    // Its idle staging goes now; regions still in use return when their tasks end.
    if (pool_ != nullptr) pool_->DropIdle();
    pool_.reset();
    charge_.Reset();
    server_->unauthenticated_.erase(connection_);
    if (counted_) --server_->admitted_;
    counted_ = false;
    // Many freed bytes may sit in the allocator's free lists (replies are mostly small
    // allocations, below the mmap threshold): give them back rather than stay large.
    if (peak_held_bytes_ >= kReturnMemoryAfterBytes) server_->ReturnMemorySoon();
  }

  // How long the connection may sit idle now: for ever while it awaits an answer, briefly
  // before it authenticates.
  absl::Duration IdleAllowance() const {
    if (awaited_ > 0) return absl::InfiniteDuration();
    if (!principal_ && options_->tokens != nullptr) return options_->auth_timeout;
    return options_->idle_timeout;
  }

  void Handle(proto::FramedConnection& conn, std::vector<uint8_t> payload,
              std::vector<UniqueFd> fds) {
    auto request = proto::VerifyPayload<proto::ClientRequest>(payload, "client request");
    if (!request.ok()) {
      conn.Reject(ErrorReply(0, request.status()));
      return;
    }
    const uint64_t id = (*request)->request_id();
    const proto::ClientRequestBody type = (*request)->body_type();
    // Every refusal below that closes the connection is taken before the payload is read: its
    // raw bytes would otherwise be read as frames.
    const uint64_t payload_bytes = (*request)->payload_bytes();
    if (payload_bytes != 0 && type != proto::ClientRequestBody::SubmitTask) {
      return conn.Reject(ErrorReply(
          id, absl::InvalidArgumentError("only SubmitTask may be followed by a raw payload")));
    }
    if (payload_bytes > MaxPayloadBytes(*options_)) {
      // Skipping it would mean reading it all: refused before a byte of it is read.
      return conn.Reject(ErrorReply(
          id, absl::ResourceExhaustedError(absl::StrCat(
                  "a raw payload of ", payload_bytes, " bytes; this pswitchd takes at most ",
                  MaxPayloadBytes(*options_), " (4 x --max-frame-bytes)"))));
    }
    if (!*serving_) {
      absl::Status closing = absl::UnavailableError("pswitchd is shutting down");
      if (payload_bytes != 0) return conn.Reject(ErrorReply(id, closing));
      return conn.Send(ErrorReply(id, closing));
    }
    if (type == proto::ClientRequestBody::Authenticate) {
      if (!fds.empty()) return conn.Send(ErrorReply(id, UnexpectedFiles()));
      return Authenticate(conn, id, *(*request)->body_as_Authenticate());
    }
    if (!principal_) {
      if (options_->tokens != nullptr) {
        return conn.Reject(ErrorReply(
            id, absl::UnauthenticatedError("this pswitchd needs a token: authenticate first "
                                           "(pswitchctl --token or PSWITCH_TOKEN)")));
      }
      // Local peers are named by the kernel at accept; only a peer beyond loopback without
      // tokens (--insecure: the operator's choice) is an anonymous admin. Anyone else is no one.
      if (!insecure_remote_) {
        return conn.Reject(ErrorReply(
            id, absl::UnauthenticatedError("pswitchd could not tell who this connection is")));
      }
      principal_ = Principal{"anonymous", Role::kAdmin};
    }
    if (payload_bytes != 0) {
      return SubmitWithPayload(conn, id, **request, payload_bytes, std::move(fds));
    }
    // Files travel with the requests that name them, as many as they declare, and only there.
    const auto* roles = (*request)->passed_files();
    const size_t declared = roles != nullptr ? roles->size() : 0;
    const bool takes_files = type == proto::ClientRequestBody::RegisterModel ||
                             type == proto::ClientRequestBody::RegisterArea ||
                             type == proto::ClientRequestBody::FillSubmit ||
                             type == proto::ClientRequestBody::FillEstimateQuery;
    if (type == proto::ClientRequestBody::RegisterArea ? declared != 0 : declared != fds.size()) {
      return conn.Send(ErrorReply(
          id, absl::InvalidArgumentError(absl::StrCat("passed_files names ", declared, " files; ",
                                                      fds.size(), " came with the frame"))));
    }
    if (!takes_files && !fds.empty()) return conn.Send(ErrorReply(id, UnexpectedFiles()));
    if (!RoleAllows(principal_->role, type)) {
      return conn.Send(ErrorReply(
          id, absl::PermissionDeniedError(absl::StrCat(
                  "'", principal_->name,
                  "' (role user) may infer, train, register transfer areas, unload the models "
                  "it may change and see and cancel its own tasks; this request needs an admin "
                  "(an admin token, or pswitchd's own uid on the local path)"))));
    }
    switch (type) {
      case proto::ClientRequestBody::RegisterModel:
        return Register(id, *(*request)->body_as_RegisterModel(), roles, std::move(fds));
      case proto::ClientRequestBody::RegisterArea:
        return RegisterArea(conn, id, *(*request)->body_as_RegisterArea(), std::move(fds));
      case proto::ClientRequestBody::ReleaseArea:
        return ReleaseArea(conn, id, *(*request)->body_as_ReleaseArea());
      case proto::ClientRequestBody::UnloadModel:
        return Unload(conn, id, *(*request)->body_as_UnloadModel());
      case proto::ClientRequestBody::SubmitTask:
        return Submit(conn, id, *(*request)->body_as_SubmitTask());
      case proto::ClientRequestBody::QueryTask: {
        const uint64_t task = (*request)->body_as_QueryTask()->task_id();
        if (!owners_->MayAccess(*principal_, task)) return conn.Send(ErrorReply(id, NoTask(task)));
        return conn.Send(StatusReply(id, task));
      }
      case proto::ClientRequestBody::CancelTask: {
        const uint64_t task = (*request)->body_as_CancelTask()->task_id();
        if (!owners_->MayAccess(*principal_, task)) return conn.Send(ErrorReply(id, NoTask(task)));
        absl::Status cancelled = controller_->Cancel(task);
        if (!cancelled.ok()) return conn.Send(ErrorReply(id, cancelled));
        Builder b;
        auto ack = proto::CreateAck(b);
        proto::Finish(b,
                      proto::CreateControllerReply(b, id, ControllerReplyBody::Ack, ack.Union()));
        return conn.Send(Bytes(b));
      }
      case proto::ClientRequestBody::ListModels:
        return conn.Send(ModelListReply(id));
      case proto::ClientRequestBody::ListTasks:
        return conn.Send(TaskListReply(id, (*request)->body_as_ListTasks()->limit()));
      case proto::ClientRequestBody::BubbleBegin: {
        const BubbleBeginRequest begin = ParseBubbleBegin(*(*request)->body_as_BubbleBegin());
        return conn.Send(AckOrError(
            id, fill_->BubbleBegin(begin.gpu, begin.expected, begin.free_bytes, begin.began_ns)));
      }
      case proto::ClientRequestBody::BubbleEnd:
        return conn.Send(AckOrError(
            id, fill_->BubbleEnd(static_cast<int>((*request)->body_as_BubbleEnd()->gpu()))));
      case proto::ClientRequestBody::RegisterBubbleCycle:
        return conn.Send(AckOrError(id, RegisterCycle(*(*request)->body_as_RegisterBubbleCycle())));
      case proto::ClientRequestBody::FillSubmit:
        return FillSubmit(conn, id, *(*request)->body_as_FillSubmit(), roles, std::move(fds),
                          /*estimate=*/false);
      case proto::ClientRequestBody::FillEstimateQuery:
        return FillSubmit(conn, id, *(*request)->body_as_FillEstimateQuery()->job(), roles,
                          std::move(fds), /*estimate=*/true);
      case proto::ClientRequestBody::FillCancel:
        return conn.Send(AckOrError(id, fill_->Cancel((*request)->body_as_FillCancel()->job_id())));
      case proto::ClientRequestBody::FillQuery:
        return conn.Send(FillStatusReply(id, (*request)->body_as_FillQuery()->job_id()));
      case proto::ClientRequestBody::FillStatsQuery:
        return conn.Send(FillStatsReply(id));
      default:
        return conn.Reject(ErrorReply(id, absl::InvalidArgumentError("unknown request type")));
    }
  }

 private:
  // The same answer as for a task that does not exist: a user learns nothing of others' tasks.
  static absl::Status NoTask(uint64_t task) {
    return absl::NotFoundError(absl::StrCat("no task ", task));
  }

  void Authenticate(proto::FramedConnection& conn, uint64_t id, const proto::Authenticate& wire) {
    if (token_authenticated_) {
      return conn.Send(ErrorReply(id, absl::FailedPreconditionError("already authenticated")));
    }
    if (options_->tokens == nullptr) {
      // No tokens configured: any is fine, and who the kernel says the peer is stays.
      if (!principal_ && !insecure_remote_) {
        return conn.Reject(ErrorReply(
            id, absl::UnauthenticatedError("pswitchd could not tell who this connection is")));
      }
      if (!principal_) principal_ = Principal{"anonymous", Role::kAdmin};
      return conn.Send(AckReply(id));
    }
    std::optional<Principal> found =
        options_->tokens->Find(wire.token() != nullptr ? wire.token()->str() : std::string());
    if (!found) {
      base::Log(base::LogLevel::kWarn, "auth_failed").Field("request", id);
      return conn.Reject(ErrorReply(id, absl::UnauthenticatedError("invalid token")));
    }
    // A token presented on the Unix socket wins over the peer's uid; the connection already
    // holds its slot there.
    if (unix_) {
      if (absl::Status moved = charge_.Rebind(found->name); !moved.ok()) {
        return conn.Reject(ErrorReply(id, moved));
      }
      token_authenticated_ = true;
      principal_ = std::move(*found);
      return conn.Send(AckReply(id));
    }
    // Its slot and its bytes move from the unauthenticated pool to the principal's.
    if (server_->admitted_ >= options_->max_connections) {
      base::Log(base::LogLevel::kWarn, "connection_refused")
          .Field("reason", "max_connections")
          .Field("limit", options_->max_connections);
      return conn.Reject(
          ErrorReply(id, absl::ResourceExhaustedError(absl::StrCat(
                             "pswitchd serves at most ", options_->max_connections,
                             " authenticated connections (--max-connections); try again later"))));
    }
    if (absl::Status moved = charge_.Rebind(found->name); !moved.ok()) {
      return conn.Reject(ErrorReply(id, moved));
    }
    server_->unauthenticated_.erase(connection_);
    ++server_->admitted_;
    counted_ = true;
    token_authenticated_ = true;
    principal_ = std::move(*found);
    conn.Send(AckReply(id));
  }

  static absl::Status UnexpectedFiles() {
    return absl::InvalidArgumentError(
        "files may be passed only with RegisterArea (one memfd) and RegisterModel (as its "
        "passed_files say); they were closed");
  }

  // A transfer area: the memfd passed with the frame, sealed against shrinking, becomes one of
  // the principal's regions until ReleaseArea or this connection closes.
  void RegisterArea(proto::FramedConnection& conn, uint64_t id, const proto::RegisterArea& wire,
                    std::vector<UniqueFd> fds) {
    if (!unix_) {
      return conn.Send(ErrorReply(
          id, absl::InvalidArgumentError("transfer areas are registered over pswitchd's Unix "
                                         "socket only (the memfd travels as an fd)")));
    }
    if (fds.size() != 1) {
      return conn.Send(ErrorReply(
          id, absl::InvalidArgumentError(absl::StrCat(
                  "RegisterArea takes exactly one memfd with its frame; got ", fds.size()))));
    }
    absl::StatusOr<std::shared_ptr<const dataplane::TransferRegion>> area =
        dataplane::TransferRegion::FromSealedMemfd(std::move(fds.front()), wire.bytes(),
                                                   principal_->name);
    if (!area.ok()) return conn.Send(ErrorReply(id, area.status()));
    const uint64_t area_id = (*area)->id();
    const uint64_t bytes = (*area)->bytes();
    if (absl::Status added = regions_->Add("", *std::move(area)); !added.ok()) {
      return conn.Send(ErrorReply(id, added));
    }
    areas_[principal_->name].push_back(area_id);
    Builder b;
    auto registered = proto::CreateAreaRegistered(b, area_id, bytes);
    proto::Finish(b, proto::CreateControllerReply(b, id, ControllerReplyBody::AreaRegistered,
                                                  registered.Union()));
    conn.Send(Bytes(b));
  }

  void ReleaseArea(proto::FramedConnection& conn, uint64_t id, const proto::ReleaseArea& wire) {
    const uint64_t area = wire.area();
    // Only this connection's own areas: a region of the principal's from another port (a Triton
    // region) or connection is not this one's to release.
    auto owned = areas_.find(principal_->name);
    auto it = owned == areas_.end() ? std::vector<uint64_t>::iterator()
                                    : std::find(owned->second.begin(), owned->second.end(), area);
    if (owned == areas_.end() || it == owned->second.end()) {
      return conn.Send(ErrorReply(
          id, absl::NotFoundError(absl::StrCat("no transfer area ", area, " of this connection"))));
    }
    owned->second.erase(it);
    conn.Send(AckOrError(id, regions_->Remove(principal_->name, area)));
  }

  static std::vector<uint8_t> AckReply(uint64_t id) {
    Builder b;
    auto ack = proto::CreateAck(b);
    proto::Finish(b, proto::CreateControllerReply(b, id, ControllerReplyBody::Ack, ack.Union()));
    return Bytes(b);
  }

  static std::vector<uint8_t> AckOrError(uint64_t id, const absl::Status& status) {
    return status.ok() ? AckReply(id) : ErrorReply(id, status);
  }

  absl::Status RegisterCycle(const proto::RegisterBubbleCycle& wire) {
    PSWITCH_ASSIGN_OR_RETURN(
        CycleRequest cycle,
        ParseCycle(wire, static_cast<uint64_t>(base::MonotonicNowNs()), absl::Now()));
    return fill_->RegisterCycle(cycle.gpu, cycle.cycle, cycle.origin);
  }

  // Submitting or estimating reads the job's dataset: on the fill manager's I/O thread, so this
  // event loop (every client's) never waits on a disk; the reply follows from there. Files passed
  // with the frame (Unix socket: the dataset, the output) stand for the job's paths.
  void FillSubmit(proto::FramedConnection& conn, uint64_t id, const proto::FillSubmit& wire,
                  const flatbuffers::Vector<proto::FileRole>* roles, std::vector<UniqueFd> fds,
                  bool estimate) {
    absl::StatusOr<FillRequest> request = ParseFill(wire);
    if (!request.ok()) return conn.Send(ErrorReply(id, request.status()));
    if (!fds.empty()) {
      absl::StatusOr<FillFiles> files = SortFillFiles(roles, std::move(fds));
      if (!files.ok()) return conn.Send(ErrorReply(id, files.status()));
      if (estimate && files->output.valid()) {
        return conn.Send(ErrorReply(
            id, absl::InvalidArgumentError("an estimate writes nothing: pass no output file")));
      }
      if (absl::Status attached = AttachFillFiles(*std::move(files), &*request); !attached.ok()) {
        return conn.Send(ErrorReply(id, attached));
      }
    }
    // Admitted before it queues: the I/O thread's queue is bounded (FillManager::ReserveLoad).
    absl::StatusOr<FillManager::LoadSlot> slot = fill_->ReserveLoad();
    if (!slot.ok()) return conn.Send(ErrorReply(id, slot.status()));
    ++awaited_;
    fill_->Background(
        [self = shared_from_this(), id, estimate, request = *std::move(request),
         slot = *std::move(slot)]() mutable {
          if (estimate) {
            absl::StatusOr<FillJobStatus> predicted =
                self->fill_->Estimate(std::move(request), std::move(slot));
            self->PostAwaitedReply(predicted.ok() ? self->FillStatusReply(id, *predicted)
                                                  : ErrorReply(id, predicted.status()));
            return;
          }
          absl::StatusOr<uint64_t> job = self->fill_->Submit(std::move(request), std::move(slot));
          self->PostAwaitedReply(job.ok() ? self->FillStatusReply(id, *job)
                                          : ErrorReply(id, job.status()));
        });
  }

  std::vector<uint8_t> FillStatusReply(uint64_t id, uint64_t job_id) {
    absl::StatusOr<FillJobStatus> s = fill_->Query(job_id);
    if (!s.ok()) return ErrorReply(id, s.status());
    return FillStatusReply(id, *s);
  }

  static std::vector<uint8_t> FillStatusReply(uint64_t id, const FillJobStatus& s) {
    Builder b;
    auto status = api::Encode(b, s);
    proto::Finish(
        b, proto::CreateControllerReply(b, id, ControllerReplyBody::FillStatus, status.Union()));
    return Bytes(b);
  }

  std::vector<uint8_t> FillStatsReply(uint64_t id) {
    Builder b;
    auto stats = api::Encode(b, fill_->Stats());
    proto::Finish(
        b, proto::CreateControllerReply(b, id, ControllerReplyBody::FillStats, stats.Union()));
    return Bytes(b);
  }

  // Sends `bytes` on the event loop if the connection still exists.
  void PostReply(std::vector<uint8_t> bytes) {
    asio::post(*io_, [conn = conn_, bytes = std::move(bytes)]() mutable {
      if (auto c = conn.lock()) c->Send(std::move(bytes));
    });
  }
  // The same for the answer the client was owed (awaited_): once it is out, the connection may
  // idle again.
  void PostAwaitedReply(std::vector<uint8_t> bytes) {
    asio::post(*io_, [self = shared_from_this(), bytes = std::move(bytes)]() mutable {
      --self->awaited_;
      if (auto c = self->conn_.lock()) c->Send(std::move(bytes));
    });
  }

  void Register(uint64_t id, const proto::RegisterModel& wire,
                const flatbuffers::Vector<proto::FileRole>* roles, std::vector<UniqueFd> fds) {
    absl::StatusOr<ModelRequest> parsed = ParseRegistration(wire);
    if (!parsed.ok()) return PostReply(ErrorReply(id, parsed.status()));
    absl::StatusOr<RegistrationFiles> files = SortRegistrationFiles(roles, std::move(fds));
    if (!files.ok()) return PostReply(ErrorReply(id, files.status()));
    ModelRequest request = *std::move(parsed);
    // A passed file stands for its path: the path, if any, is not opened.
    if (files->weights.valid()) request.weights_path.clear();
    if (files->plan.valid()) request.plan = "auto";
    if (files->archive.valid()) {
      request.archive_path.clear();
      if (request.zoo_model.empty()) request.zoo_model = models::kScriptArchitecture;
    }
    auto passed = std::make_shared<RegistrationFiles>(*std::move(files));
    // Resolved on the registration thread: a repository lookup reads files.
    ++awaited_;
    controller_->Register(
        [request = std::move(request), repository = options_->repository,
         allow = options_->allow_client_paths, passed]() -> absl::StatusOr<ModelRequest> {
          PSWITCH_ASSIGN_OR_RETURN(ModelRequest resolved,
                                   ResolveModelRequest(request, repository, allow));
          // Read here, on the registration thread: a passed file may be large or slow.
          PSWITCH_RETURN_IF_ERROR(AttachRegistrationFiles(std::move(*passed), &resolved));
          return resolved;
        },
        [self = shared_from_this(),
         id](const absl::StatusOr<controller::Controller::Registered>& outcome) {
          if (!outcome.ok()) {
            self->PostAwaitedReply(ErrorReply(id, outcome.status()));
            return;
          }
          const EntryRef& entry = outcome->entry;
          Builder b;
          std::vector<flatbuffers::Offset<proto::RegistrationPhase>> phases;
          for (const registry::RegistrationPhase& p : outcome->phases) {
            phases.push_back(proto::CreateRegistrationPhase(
                b, b.CreateString(p.name),
                static_cast<uint64_t>(absl::ToInt64Microseconds(p.took))));
          }
          auto registered =
              proto::CreateRegistered(b, b.CreateString(entry->request.name), entry->layers,
                                      static_cast<uint32_t>(entry->plan.size()),
                                      entry->weight_bytes, b.CreateVector(phases));
          proto::Finish(b, proto::CreateControllerReply(b, id, ControllerReplyBody::Registered,
                                                        registered.Union()));
          self->PostAwaitedReply(Bytes(b));
        },
        wire.progress() ? ProgressReplies(id, wire.progress_detail()) : registry::PhaseObserver());
  }

  // Each phase of registration `id` as it ends, as a RegistrationProgress reply (posted in
  // order, before the final one).
  // With `detail`, also how far a running phase has come (a client that did not ask would take
  // it for the phase's end).
  registry::PhaseObserver ProgressReplies(uint64_t id, bool detail) {
    return [self = shared_from_this(), id, detail](const registry::RegistrationPhase& phase) {
      if (phase.running() && !detail) return;
      Builder b;
      auto wire = proto::CreateRegistrationPhase(
          b, b.CreateString(phase.name),
          static_cast<uint64_t>(absl::ToInt64Microseconds(phase.took)));
      auto body = proto::CreateRegistrationProgress(
          b, wire, phase.running() ? b.CreateString(phase.detail) : 0);
      proto::Finish(b, proto::CreateControllerReply(
                           b, id, ControllerReplyBody::RegistrationProgress, body.Union()));
      self->PostReply(Bytes(b));
    };
  }

  void Unload(proto::FramedConnection& conn, uint64_t id, const proto::UnloadModel& wire) {
    absl::StatusOr<std::string> name = ParseUnload(wire);
    if (!name.ok()) return PostReply(ErrorReply(id, name.status()));
    // A fill job's own model is the job's, whoever asks (its name says no more than that).
    if (fill_ != nullptr) {
      if (absl::Status owned = fill_->CheckUnload(*name); !owned.ok()) {
        return PostReply(ErrorReply(id, owned));
      }
    }
    if (absl::Status allowed = admission_->CheckUnload(*principal_, *name); !allowed.ok()) {
      return conn.Send(ErrorReply(id, allowed));
    }
    ++awaited_;
    controller_->Unload(std::move(*name), [self = shared_from_this(), id](absl::Status status) {
      if (!status.ok()) {
        self->PostAwaitedReply(ErrorReply(id, status));
        return;
      }
      Builder b;
      auto ack = proto::CreateAck(b);
      proto::Finish(b, proto::CreateControllerReply(b, id, ControllerReplyBody::Ack, ack.Union()));
      self->PostAwaitedReply(Bytes(b));
    });
  }

  // Without tokens, one connection is one client: local clients share an address.
  std::string QuotaClient() const {
    return options_->tokens != nullptr ? principal_->name
                                       : absl::StrCat(address_, "#", connection_);
  }

  // This connection's staging regions, for its principal and charged to its client.
  StagingPool& Pool() {
    if (pool_ == nullptr || pool_->owner() != principal_->name ||
        pool_client_ != charge_.client()) {
      if (pool_ != nullptr) pool_->DropIdle();
      pool_client_ = charge_.client();
      pool_ = StagingPool::Create(principal_->name, BudgetCharge(server_->budget_, pool_client_));
    }
    return *pool_;
  }

  // Reads and drops a refused request's payload, then sends the refusal: the stream stays in
  // step and the connection goes on.
  static void RefuseAfterPayload(proto::FramedConnection& conn, uint64_t id, uint64_t bytes,
                                 const absl::Status& why) {
    absl::Status reading = conn.ReceivePayload(
        bytes, nullptr, nullptr, [id, why](proto::FramedConnection& c, const absl::Status& got) {
          if (got.ok()) c.Send(ErrorReply(id, why));
        });
    if (!reading.ok()) conn.Reject(ErrorReply(id, why));
  }

  // A SubmitTask followed by `payload_bytes` raw bytes (its Place::Payload inputs): checked and
  // admitted from the header alone, queued with its inputs arriving, then received into a
  // staging region; TaskAccepted once they are in.
  void SubmitWithPayload(proto::FramedConnection& conn, uint64_t id,
                         const proto::ClientRequest& request, uint64_t payload_bytes,
                         std::vector<UniqueFd> fds) {
    auto refuse = [&](const absl::Status& why) {
      RefuseAfterPayload(conn, id, payload_bytes, why);
    };
    if (!fds.empty() || (request.passed_files() != nullptr && request.passed_files()->size() > 0)) {
      return refuse(UnexpectedFiles());
    }
    if (!RoleAllows(principal_->role, proto::ClientRequestBody::SubmitTask)) {
      return refuse(absl::PermissionDeniedError(
          absl::StrCat("'", principal_->name, "' may not submit tasks")));
    }
    absl::StatusOr<ParsedTask> parsed = ParseTask(*request.body_as_SubmitTask(), absl::Now());
    if (!parsed.ok()) return refuse(parsed.status());
    if (parsed->spec.kind != TaskKind::kInference || !parsed->as_model.empty()) {
      return refuse(absl::InvalidArgumentError(
          "a raw payload carries an inference's inputs only; a training task's are inline"));
    }
    auto spec = std::make_shared<TaskSpec>(std::move(parsed->spec));
    // The outputs' room sits after the inputs, 64-byte aligned, sized from the model's output.
    std::optional<proto::ByteSlice> payload_outputs;
    uint64_t staging_bytes = payload_bytes;
    if (parsed->outputs_in_payload) {
      absl::StatusOr<EntryRef> model = admission_->FindModel(*principal_, spec->model);
      if (!model.ok()) return refuse(model.status());
      // The inputs first (admission checks them again): a wrong name is named, not taken for
      // an output that cannot be sized.
      if (absl::Status inputs = CheckInputs(**model, spec->inputs); !inputs.ok()) {
        return refuse(inputs);
      }
      absl::StatusOr<uint64_t> out_bytes = OutputBytesNeeded(**model, spec->inputs);
      if (!out_bytes.ok()) return refuse(out_bytes.status());
      const uint64_t out_offset = (payload_bytes + 63) / 64 * 64;
      payload_outputs = proto::ByteSlice{0, out_offset, *out_bytes};
      staging_bytes = out_offset + *out_bytes;
    }
    // Charged (and mapped) before a byte of the payload is read; refused: closed, unread.
    absl::StatusOr<std::shared_ptr<StagingPool::Lease>> lease = Pool().Acquire(staging_bytes);
    if (!lease.ok()) return conn.Reject(ErrorReply(id, lease.status()));
    if (absl::Status placed = PlacePayload(spec->inputs, payload_bytes, *(*lease)->region());
        !placed.ok()) {
      return refuse(placed);
    }
    spec->regions.push_back((*lease)->region());
    if (payload_outputs) {
      payload_outputs->region = (*lease)->region()->id();
      spec->outputs_to = *payload_outputs;
    }
    // The request arrived with its first byte: the breakdown shows the payload's receipt too.
    spec->arrival_ns = conn.frame_arrival_ns();
    // Admitted and queued from the header alone, so the switch starts while the payload arrives
    // (docs/dataplane.md); its Run waits for the arrival's end.
    auto arrival = std::make_shared<controller::InputsArrival>();
    spec->inputs_arrival = arrival;
    std::shared_ptr<StagingPool::Lease> held = *std::move(lease);
    auto exchange = std::make_shared<PayloadExchange>();
    ++awaited_;  // no idle limit while its payload arrives and its answer is owed
    absl::StatusOr<uint64_t> task_id =
        admission_->Submit(*principal_, QuotaClient(), std::move(*spec),
                           PayloadAnswer(id, held, payload_outputs, exchange));
    if (!task_id.ok()) {
      --awaited_;
      return refuse(task_id.status());
    }
    // Ends the arrival whatever becomes of the read: a callback dropped unrun fails it too.
    auto ender = std::make_shared<ArrivalEnder>(arrival, *task_id);
    auto received = [self = shared_from_this(), id, task = *task_id, ender, exchange](
                        proto::FramedConnection& c, const absl::Status& got) {
      std::function<void()> held_answer = std::move(exchange->held_answer);
      exchange->held_answer = nullptr;
      if (!got.ok()) {
        // The connection is closing with the reason: the task fails, no answer is owed.
        exchange->payload = PayloadExchange::kFailed;
        if (held_answer) --self->awaited_;
        ender->End(got);
        return;
      }
      // Accepted once the request is all in, as before, and always ahead of its answer.
      exchange->payload = PayloadExchange::kIn;
      c.Send(AcceptedReply(id, task));
      if (held_answer) held_answer();
      ender->End(absl::OkStatus());
    };
    absl::Status reading =
        conn.ReceivePayload(payload_bytes, held->data(), held, std::move(received));
    if (!reading.ok()) {
      exchange->payload = PayloadExchange::kFailed;
      ender->End(reading);
      conn.Reject(ErrorReply(id, reading));
    }
  }

  // A raw payload request's answer and its payload's receipt, on this connection's loop: the
  // answer goes out after the TaskAccepted that the payload's end sends.
  struct PayloadExchange {
    enum { kArriving, kIn, kFailed } payload = kArriving;
    // An answer that came while the payload arrived (the task failed first): sent once it is in.
    std::function<void()> held_answer;
  };

  // The answer to a raw payload request: its lease is held until then (and with payload
  // outputs, until the reply's bytes are written). None when its payload never arrived: its
  // connection closed with the reason.
  controller::TaskCallback PayloadAnswer(uint64_t id, std::shared_ptr<StagingPool::Lease> lease,
                                         std::optional<proto::ByteSlice> payload_outputs,
                                         std::shared_ptr<PayloadExchange> exchange) {
    return [self = shared_from_this(), id, lease, payload_outputs,
            exchange](const absl::StatusOr<TaskOutcome>& out) {
      // Built here, on the scheduler's thread; sent on the loop.
      std::vector<uint8_t> reply;
      std::span<const uint8_t> raw;
      if (!out.ok()) {
        reply = ErrorReply(id, out.status());
      } else if (!payload_outputs) {
        reply = ResultReply(id, *out);
      } else {
        TaskOutcome outcome = *out;  // descriptors only: the bytes stay in the staging region
        absl::StatusOr<uint64_t> raw_bytes = ToPayloadOutputs(*payload_outputs, outcome.outputs);
        if (raw_bytes.ok()) {
          reply = ResultReply(id, outcome, *raw_bytes);
          raw = std::span<const uint8_t>(lease->data() + payload_outputs->offset, *raw_bytes);
        } else {
          reply = ErrorReply(id, raw_bytes.status());
        }
      }
      std::function<void()> send = [self, reply = std::move(reply), raw, lease]() mutable {
        --self->awaited_;
        auto c = self->conn_.lock();
        if (c == nullptr) return;
        if (raw.empty()) {
          c->Send(std::move(reply));
        } else {
          c->SendWithPayload(std::move(reply), raw, lease);
        }
      };
      asio::post(*self->io_, [self, exchange, send = std::move(send)]() mutable {
        switch (exchange->payload) {
          case PayloadExchange::kIn:
            return send();
          case PayloadExchange::kFailed:
            --self->awaited_;
            return;
          case PayloadExchange::kArriving:
            exchange->held_answer = std::move(send);
            return;
        }
      });
    };
  }

  // Outputs the worker wrote into `room` (Place::Region slices of its staging region) as
  // Place::Payload slices of the reply's raw payload, which starts at room's offset. The raw
  // payload's length, or Internal for an output outside the room.
  static absl::StatusOr<uint64_t> ToPayloadOutputs(const proto::ByteSlice& room,
                                                   std::vector<proto::HostTensor>& outputs) {
    uint64_t end = 0;
    for (proto::HostTensor& t : outputs) {
      if (t.place == proto::Place::Inline) continue;
      const bool inside = t.place == proto::Place::Region && t.slice.region == room.region &&
                          t.slice.offset >= room.offset &&
                          t.slice.offset - room.offset <= room.length &&
                          t.slice.length <= room.length - (t.slice.offset - room.offset);
      if (!inside) {
        return absl::InternalError(
            absl::StrCat("output '", t.name, "' lies outside the room the task was given"));
      }
      t.place = proto::Place::Payload;
      t.slice.region = 0;
      t.slice.offset -= room.offset;
      end = std::max(end, t.slice.offset + t.slice.length);
    }
    return end;
  }

  void Submit(proto::FramedConnection& conn, uint64_t id, const proto::SubmitTask& wire) {
    absl::StatusOr<ParsedTask> parsed = ParseTask(wire, absl::Now());
    if (!parsed.ok()) return conn.Send(ErrorReply(id, parsed.status()));
    if (parsed->outputs_in_payload) {
      return conn.Send(ErrorReply(
          id, absl::InvalidArgumentError("outputs in a raw payload need a raw payload request "
                                         "(ClientRequest.payload_bytes > 0)")));
    }
    TaskSpec spec = std::move(parsed->spec);
    spec.arrival_ns = conn.frame_arrival_ns();  // its first byte
    const std::string client = QuotaClient();
    auto answer = [self = shared_from_this(), id](const absl::StatusOr<TaskOutcome>& out) {
      self->PostAwaitedReply(out.ok() ? ResultReply(id, *out) : ErrorReply(id, out.status()));
    };
    if (!parsed->as_model.empty()) {
      // The copy registers on the registration thread: its acceptance comes from there.
      ++awaited_;  // the acceptance
      ++awaited_;  // the result
      admission_->SubmitOnCopy(
          *principal_, client, std::move(spec), std::move(parsed->as_model),
          [self = shared_from_this(), id](const absl::StatusOr<uint64_t>& task) {
            if (!task.ok()) {
              // No result follows a refusal.
              asio::post(*self->io_, [self] { --self->awaited_; });
              self->PostAwaitedReply(ErrorReply(id, task.status()));
              return;
            }
            self->PostAwaitedReply(AcceptedReply(id, *task));
          },
          std::move(answer));
      return;
    }
    ++awaited_;
    absl::StatusOr<uint64_t> task_id =
        admission_->Submit(*principal_, client, std::move(spec), std::move(answer));
    if (!task_id.ok()) {
      --awaited_;
      return conn.Send(ErrorReply(id, task_id.status()));
    }
    conn.Send(AcceptedReply(id, *task_id));
  }

  static std::vector<uint8_t> AcceptedReply(uint64_t id, uint64_t task_id) {
    Builder b;
    auto accepted = proto::CreateTaskAccepted(b, task_id);
    proto::Finish(b, proto::CreateControllerReply(b, id, ControllerReplyBody::TaskAccepted,
                                                  accepted.Union()));
    return Bytes(b);
  }

  // `payload_bytes`: the raw bytes that follow the reply (Place::Payload outputs).
  static std::vector<uint8_t> ResultReply(uint64_t id, const TaskOutcome& out,
                                          uint64_t payload_bytes = 0) {
    Builder b;
    auto outputs = proto::CreateWireTensors(b, out.outputs);
    const SwitchTimeline& t = out.timeline;
    // Microseconds after arrival, rounded up so a step that happened never reads as 0.
    auto since_arrival = [&t](int64_t ns) -> uint64_t {
      if (ns == 0 || t.arrival_ns == 0 || ns < t.arrival_ns) return 0;
      return static_cast<uint64_t>((ns - t.arrival_ns + 999) / 1000);
    };
    // The whole server-side time, on the breakdown's clock: from the request's first byte
    // (arrival_ns, stamped by this port; the scheduler's own count starts when it was queued,
    // after a raw payload's receipt) to now.
    absl::Duration latency = out.latency;
    if (t.arrival_ns > 0) {
      latency = std::max(latency, absl::Nanoseconds(base::MonotonicNowNs() - t.arrival_ns));
    }
    auto result = proto::CreateTaskResult(
        b, out.task_id, outputs, static_cast<uint64_t>(absl::ToInt64Microseconds(latency)),
        // Rounded up: a sub-microsecond switch (a tiny model) still reads as one.
        static_cast<uint64_t>(
            absl::ToInt64Microseconds(absl::Ceil(out.switch_time, absl::Microseconds(1)))),
        since_arrival(t.stop_sent_ns), since_arrival(t.drained_ns),
        since_arrival(t.first_group_ready_ns), since_arrival(t.first_layer_start_ns),
        since_arrival(t.first_layer_done_ns), since_arrival(t.last_group_ready_ns),
        since_arrival(t.old_stopped_ns));
    proto::Finish(
        b, proto::CreateControllerReply(b, id, ControllerReplyBody::TaskResult, result.Union(),
                                        payload_bytes));
    return Bytes(b);
  }

  std::vector<uint8_t> StatusReply(uint64_t id, uint64_t task_id) {
    absl::StatusOr<TaskStatus> info = controller_->Query(task_id);
    if (!info.ok()) return ErrorReply(id, info.status());
    Builder b;
    auto status = api::Encode(b, *info);
    proto::Finish(
        b, proto::CreateControllerReply(b, id, ControllerReplyBody::TaskStatus, status.Union()));
    return Bytes(b);
  }

  std::vector<uint8_t> TaskListReply(uint64_t id, uint32_t limit) {
    if (limit == 0 || limit > kMaxListedTasks) limit = kMaxListedTasks;
    Builder b;
    std::vector<flatbuffers::Offset<proto::TaskStatus>> tasks;
    for (const TaskStatus& info : controller_->RecentTasks(limit)) {
      if (owners_->MayAccess(*principal_, info.task_id)) tasks.push_back(api::Encode(b, info));
    }
    auto list = proto::CreateTaskList(b, b.CreateVector(tasks));
    proto::Finish(b,
                  proto::CreateControllerReply(b, id, ControllerReplyBody::TaskList, list.Union()));
    return Bytes(b);
  }

  std::vector<uint8_t> ModelListReply(uint64_t id) {
    Builder b;
    std::vector<flatbuffers::Offset<proto::ModelInfo>> models;
    // Read without the GPUs' loops: a listing never waits on a busy scheduler.
    std::vector<std::set<std::string>> resident;
    for (size_t g = 0; g < controller_->gpus(); ++g) {
      resident.push_back(controller_->gpu(g).ResidentModels());
    }
    for (const EntryRef& entry : admission_->ListModels(*principal_)) {
      std::vector<uint32_t> gpus;
      for (size_t g = 0; g < resident.size(); ++g) {
        if (resident[g].contains(entry->request.name)) gpus.push_back(static_cast<uint32_t>(g));
      }
      models.push_back(proto::CreateModelInfo(
          b, b.CreateString(entry->request.name), b.CreateString(entry->request.zoo_model),
          entry->weight_bytes, entry->output.dtype, b.CreateVector(entry->output.shape),
          b.CreateVector(gpus)));
    }
    auto list = proto::CreateModelList(b, b.CreateVector(models));
    proto::Finish(
        b, proto::CreateControllerReply(b, id, ControllerReplyBody::ModelList, list.Union()));
    return Bytes(b);
  }

  asio::io_context* const io_;
  const bool* const serving_;  // the server's flag; read on the event loop only
  Controller* const controller_;
  FillManager* const fill_;
  const ClientServerOptions* const options_;  // the server's, which outlives its sessions
  TaskOwners* const owners_;                  // the server's
  TaskAdmission* const admission_;            // the server's
  dataplane::RegionTable* const regions_;     // every port's, which outlives the server
  const std::string address_;                 // the peer's
  const bool unix_;                           // on the Unix socket (else TCP)
  const bool insecure_remote_;                // Peer::insecure_remote
  const uint64_t connection_;                 // this connection's number, naming it without tokens
  std::optional<Principal> principal_;        // who this connection is, once known
  bool token_authenticated_ = false;          // principal_ is a token's
  // This connection's areas by the principal that registered them (event loop only).
  std::map<std::string, std::vector<uint64_t>> areas_;
  std::weak_ptr<proto::FramedConnection> conn_;
  int awaited_ = 0;  // answers this client waits for (event loop only)
  // Event loop only, as the server's members they update.
  ClientServer* server_ = nullptr;  // which outlives its sessions' close
  BudgetCharge charge_;             // what the connection holds, charged to its client
  std::shared_ptr<StagingPool> pool_;  // raw payloads' staging (Pool())
  std::string pool_client_;            // whom pool_ charges
  size_t peak_held_bytes_ = 0;
  bool counted_ = false;  // holds one of the server's max_connections slots
};

namespace {

// "HOST:PORT" (IPv6 hosts in brackets) as the endpoint to listen on.
absl::StatusOr<asio::ip::tcp::endpoint> ParseListen(const std::string& listen) {
  PSWITCH_ASSIGN_OR_RETURN(ListenAddress split, SplitListen(listen));
  asio::error_code ec;
  asio::ip::address address = asio::ip::make_address(split.host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad listen host '", split.host, "'"));
  return asio::ip::tcp::endpoint(address, split.port);
}

}  // namespace

bool IsLoopbackListen(const std::string& listen) {
  absl::StatusOr<asio::ip::tcp::endpoint> endpoint = ParseListen(listen);
  return endpoint.ok() && endpoint->address().is_loopback();
}

absl::StatusOr<std::unique_ptr<ClientServer>> ClientServer::Start(const std::string& listen,
                                                                  Controller* controller,
                                                                  FillManager* fill,
                                                                  ClientServerOptions options) {
  PSWITCH_ASSIGN_OR_RETURN(asio::ip::tcp::endpoint endpoint, ParseListen(listen));
  asio::error_code ec;
  std::unique_ptr<ClientServer> server(new ClientServer(controller, fill, options));
  server->acceptor_.open(endpoint.protocol(), ec);
  if (!ec) server->acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) server->acceptor_.bind(endpoint, ec);
  if (!ec) server->acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  // Connections that never send (an unauthenticated flood) wait in the kernel, not in a slot.
  if (!ec) {
    DeferAcceptUntilData(server->acceptor_.native_handle(),
                         static_cast<int>(absl::ToInt64Seconds(options.auth_timeout)));
  }
  if (ec) return absl::UnavailableError(absl::StrCat("listen on ", listen, ": ", ec.message()));
  server->port_ = server->acceptor_.local_endpoint().port();
  server->Accept();
  if (!options.unix_socket.empty()) PSWITCH_RETURN_IF_ERROR(server->ListenUnix());
  server->thread_ = std::thread([s = server.get()] {
    s->io_.run();
    s->io_done_.Notify();
  });
  return server;
}

void ClientServer::StopServing() {
  if (!thread_.joinable()) return;  // Start failed before the event loop ran
  absl::Notification stopped;
  asio::post(io_, [this, &stopped] {
    serving_ = false;
    asio::error_code ignored;
    acceptor_.close(ignored);
    unix_acceptor_.close(ignored);
    stopped.Notify();
  });
  stopped.WaitForNotification();
}

ClientServer::~ClientServer() {
  if (!thread_.joinable()) return;
  StopServing();
  // Posted after every reply posted so far: those go out before their connection closes. With
  // no connection and no acceptor left, the event loop runs dry and returns.
  asio::post(io_, [this] {
    for (const auto& weak : connections_) {
      if (auto conn = weak.lock()) conn->CloseAfterWrites();
    }
    connections_.clear();
    keep_running_.reset();
  });
  if (!io_done_.WaitForNotificationWithTimeout(absl::Seconds(5))) io_.stop();
  if (thread_.joinable()) thread_.join();
  // Ours to remove: no one can connect to it any more.
  if (unix_listening_) RemoveUnixSocketFile(options_.unix_socket, unix_file_);
}

void ClientServer::Accept() {
  acceptor_.async_accept([this](const asio::error_code& ec, asio::ip::tcp::socket socket) {
    if (ec) {
      proto::AcceptAgainLater(acceptor_, ec, "client", [this] { Accept(); });
      return;
    }
    asio::error_code ignored;
    socket.set_option(asio::ip::tcp::no_delay(true), ignored);
    asio::error_code local_ec, remote_ec;
    const asio::ip::tcp::endpoint local = socket.local_endpoint(local_ec);
    const asio::ip::tcp::endpoint remote = socket.remote_endpoint(remote_ec);
    if (local_ec || remote_ec) {
      // A peer that reset before the accept has no address (getpeername: ENOTCONN); its queued
      // bytes are still readable. Whoever it was, it is no one pswitchd can name: refused.
      base::Log(base::LogLevel::kInfo, "connection_refused")
          .Field("reason", "peer_gone")
          .Field("detail", (local_ec ? local_ec : remote_ec).message());
      socket.close(ignored);
      Accept();
      return;
    }
    Peer peer;
    peer.address = remote.address().to_string();
    const bool loopback = IsLoopbackAddress(remote.address());
    peer.insecure_remote = options_.tokens == nullptr && !loopback;
    if (options_.tokens == nullptr && loopback) {
      // Without tokens a loopback peer is whoever the kernel says owns its socket, never an
      // admin for connecting alone. Asked now, while the peer's socket surely exists.
      absl::StatusOr<uid_t> uid = LoopbackPeerUid(local, remote);
      if (!uid.ok()) {
        base::Log(base::LogLevel::kWarn, "connection_refused")
            .Field("reason", "peer_unknown")
            .Field("peer", peer.address)
            .Field("detail", uid.status().message());
        socket.close(ignored);
        Accept();
        return;
      }
      peer.principal = PrincipalOfUid(*uid, options_.tokens);
    }
    const int family = local.protocol().family();
    Serve(proto::FramedConnection::Socket(io_, asio::generic::stream_protocol(family, IPPROTO_TCP),
                                          socket.release()),
          std::move(peer));
    Accept();
  });
}

void ClientServer::AcceptUnix() {
  unix_acceptor_.async_accept(
      [this](const asio::error_code& ec, asio::local::stream_protocol::socket socket) {
        if (ec) {
          proto::AcceptAgainLater(unix_acceptor_, ec, "unix client", [this] { AcceptUnix(); });
          return;
        }
        asio::error_code ignored;
        absl::StatusOr<uid_t> uid = UnixPeerUid(socket.native_handle());
        if (!uid.ok()) {
          base::Log(base::LogLevel::kWarn, "connection_refused")
              .Field("reason", "peer_unknown")
              .Field("detail", uid.status().message());
          socket.close(ignored);
          AcceptUnix();
          return;
        }
        Peer peer;
        peer.address = absl::StrCat("unix:uid:", *uid);
        peer.unix_socket = true;
        peer.principal = PrincipalOfUid(*uid, options_.tokens);
        Serve(proto::FramedConnection::Socket(
                  io_, asio::generic::stream_protocol(AF_UNIX, SOCK_STREAM), socket.release()),
              std::move(peer));
        AcceptUnix();
      });
}

void ClientServer::Serve(proto::FramedConnection::Socket socket, Peer peer) {
  asio::error_code ignored;
  std::erase_if(connections_, [](const auto& weak) { return weak.expired(); });
  // A TCP connection with tokens must authenticate; the Unix socket's peers are known already.
  const bool must_authenticate = options_.tokens != nullptr && !peer.unix_socket;
  if (must_authenticate) {
    // Unauthenticated connections have slots of their own: a newcomer beyond them closes the
    // oldest, so idlers can neither crowd out authenticated clients nor the next one to come.
    if (unauthenticated_.size() >= options_.max_unauthenticated_connections) {
      EvictOldestUnauthenticated();
    }
  } else if (admitted_ >= options_.max_connections) {
    // Refused at once rather than left to pile up: each holds buffers and a session.
    base::Log(base::LogLevel::kWarn, "connection_refused")
        .Field("reason", "max_connections")
        .Field("limit", options_.max_connections);
    socket.close(ignored);
    return;
  }
  const std::string address = peer.address;
  const bool unix_socket = peer.unix_socket;
  // With tokens the bytes are the principal's (a Unix peer's is known now); without, each
  // connection is a client of its own (as the task quota counts them).
  const uint64_t number = ++connections_accepted_;
  std::string charged_to = absl::StrCat(address, "#", number);
  if (options_.tokens != nullptr) {
    charged_to = unix_socket ? peer.principal->name : std::string(kUnauthenticatedClient);
  }
  auto session = std::make_shared<Session>(&io_, &serving_, controller_, fill_, &options_, &owners_,
                                           &admission_, regions_, std::move(peer), number);
  proto::ConnectionLimits limits;
  limits.max_frame_bytes = options_.max_frame_bytes;
  limits.frame_timeout = options_.frame_timeout;
  limits.max_queued_bytes = options_.max_queued_reply_bytes;
  // Files travel only over the Unix socket; TCP reads never take any.
  limits.max_fds_per_frame = unix_socket ? kMaxFilesPerFrame : 0;
  limits.max_payload_bytes = MaxPayloadBytes(options_);
  session->Admit(this, BudgetCharge(budget_, charged_to));
  limits.held_bytes = [session](size_t bytes) { return session->Hold(bytes); };
  auto conn = proto::FramedConnection::Create(
      std::move(socket), std::move(limits),
      [session](proto::FramedConnection& c, std::vector<uint8_t> payload,
                std::vector<UniqueFd> fds) {
        session->Handle(c, std::move(payload), std::move(fds));
      },
      [](const absl::Status& status) { return ErrorReply(0, status); },
      [session, address](proto::FramedConnection&, const absl::Status& why) {
        session->Closed();
        // Limits at work (timeouts, budgets, bad frames) are the operator's to see.
        if (!why.ok()) {
          base::Log(base::LogLevel::kInfo, "client_disconnected")
              .Field("peer", address)
              .Field("reason", why.message());
        }
      });
  session->Attach(conn);
  if (must_authenticate) unauthenticated_.emplace(number, conn);
  conn->SetIdlePolicy([session] { return session->IdleAllowance(); });
  conn->Start();
  connections_.push_back(conn);
}

absl::Status ClientServer::ListenUnix() {
  const std::string& path = options_.unix_socket;
  // 0660: pswitchd's user and group connect; the directory decides who reaches it at all. Made
  // with that mode from the start, and never over another user's socket (unix_socket_file.h).
  PSWITCH_ASSIGN_OR_RETURN(unix_file_, CreateUnixSocketFile(path, 0660));
  asio::error_code ec;
  unix_acceptor_.assign(asio::local::stream_protocol(), unix_file_.fd.get(), ec);
  if (ec) {
    RemoveUnixSocketFile(path, unix_file_);
    return absl::UnavailableError(absl::StrCat("listen on ", path, ": ", ec.message()));
  }
  (void)unix_file_.fd.Release();  // the acceptor's now
  unix_listening_ = true;
  AcceptUnix();
  return absl::OkStatus();
}

void ClientServer::EvictOldestUnauthenticated() {
  std::erase_if(unauthenticated_, [](const auto& entry) {
    std::shared_ptr<proto::FramedConnection> c = entry.second.lock();
    return c == nullptr || c->closed();
  });
  if (unauthenticated_.empty()) return;
  // The oldest that has nothing waiting to be read: a client whose token is already in its
  // socket (sent, not yet read by this loop) is about to authenticate, and a flood of newcomers
  // must not evict it in that moment. Only when every one has bytes waiting, the oldest.
  std::shared_ptr<proto::FramedConnection> victim;
  for (const auto& [number, weak] : unauthenticated_) {
    std::shared_ptr<proto::FramedConnection> c = weak.lock();
    asio::error_code ec;
    if (c != nullptr && c->socket().available(ec) == 0 && !ec) {
      victim = std::move(c);
      break;
    }
  }
  if (victim == nullptr) victim = unauthenticated_.begin()->second.lock();
  // Its close handler takes it off the list.
  victim->Close(absl::ResourceExhaustedError(absl::StrCat(
      "evicted: ", unauthenticated_.size(),
      " connections were waiting to authenticate (--max-unauthenticated-connections); the "
      "oldest with nothing sent makes room for a newcomer")));
}

void ClientServer::ReturnMemorySoon() {
  if (return_memory_due_) return;
  return_memory_due_ = true;
  // Once for every connection that closes about now (a flood's connections close together).
  return_memory_.expires_after(std::chrono::milliseconds(200));
  return_memory_.async_wait([this](const asio::error_code&) {
    return_memory_due_ = false;
    const absl::Time start = absl::Now();
    ReturnFreedMemory();
    base::Log(base::LogLevel::kInfo, "memory_returned").FieldMs("took_ms", absl::Now() - start);
  });
}

}  // namespace pswitch::frontend
