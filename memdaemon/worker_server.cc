#include "memdaemon/worker_server.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "memdaemon/arena_layout.h"
#include "memdaemon/weight_layout.h"
#include "proto/accept_retry.h"
#include "proto/frame_channel.h"
#include "proto/framed_connection.h"
#include "proto/framing.h"
#include "proto/memdaemon_generated.h"
#include "proto/wire_status.h"

namespace pswitch::memdaemon {
namespace {

// Control messages are tiny; anything bigger is a confused or hostile peer.
constexpr uint32_t kMaxFrameBytes = 64 << 10;

std::vector<uint8_t> Bytes(const flatbuffers::FlatBufferBuilder& b) {
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

std::vector<uint8_t> ErrorReply(uint64_t request_id, const absl::Status& status) {
  flatbuffers::FlatBufferBuilder b;
  auto error = proto::CreateWireError(b, status);
  proto::Finish(b, proto::CreateMemReply(b, request_id, proto::MemReplyBody::Error, error.Union()));
  return Bytes(b);
}

}  // namespace

// One worker connection's state: the leases it holds. Lives on the io thread only.
class WorkerServer::Session {
 public:
  // `self_peer`: the peer is this very process (it needs no attach secret).
  Session(WorkerServer* server, bool self_peer)
      : server_(server), arena_(server->arena_), leases_(server->leases_), self_peer_(self_peer) {}
  ~Session() {
    for (const Lease& lease : held_) (void)leases_->Release(lease.offset, lease.owner);
  }

  void Handle(proto::FramedConnection& conn, std::vector<uint8_t> payload) {
    auto request = proto::VerifyPayload<proto::MemRequest>(payload, "memdaemon request");
    if (!request.ok()) {
      conn.Reject(ErrorReply(0, request.status()));
      return;
    }
    uint64_t id = (*request)->request_id();
    flatbuffers::FlatBufferBuilder b;
    if ((*request)->body_type() != proto::MemRequestBody::AttachArena && !attached_) {
      conn.Reject(ErrorReply(id, absl::PermissionDeniedError("attach the arena first")));
      return;
    }
    switch ((*request)->body_type()) {
      case proto::MemRequestBody::AttachArena: {
        const auto* secret = (*request)->body_as_AttachArena()->attach_secret();
        if (!self_peer_ && (secret == nullptr ||
                            !server_->RedeemAttachSecret(std::string(
                                reinterpret_cast<const char*>(secret->data()), secret->size())))) {
          base::Log(base::LogLevel::kWarn, "memdaemon_attach_refused")
              .Field("worker", (*request)->body_as_AttachArena()->worker_id())
              .Field("pid", (*request)->body_as_AttachArena()->pid());
          conn.Reject(ErrorReply(
              id, absl::PermissionDeniedError(
                      "no valid attach secret: only workers pswitchd spawned attach the arena, "
                      "each once")));
          return;
        }
        absl::StatusOr<gpu::ArenaHandle> handle = arena_->Export();
        if (!handle.ok()) {
          conn.Send(ErrorReply(id, handle.status()));
          return;
        }
        auto ipc = b.CreateVector(reinterpret_cast<const uint8_t*>(handle->ipc_handle.data()),
                                  handle->ipc_handle.size());
        auto grant = proto::CreateArenaGrant(
            b, handle->backend == gpu::Backend::kCuda ? proto::Backend::Cuda : proto::Backend::Host,
            handle->device_ordinal, handle->size_bytes, ipc, kReadyFlagsOffset, kReadyFlagCount,
            kDrainFlagCount, kWeightAlignmentBytes, handle->chunk_bytes, leases_->alignment());
        proto::Finish(b, proto::CreateMemReply(b, id, proto::MemReplyBody::ArenaGrant, grant.Union()));
        attached_ = true;
        conn.Send(Bytes(b), std::move(handle->fd));
        return;
      }
      case proto::MemRequestBody::ExportChunks: {
        // A worker maps what its task needs and asks for those chunks' fds the first time; it
        // holds the arena's whole memory either way, as a host worker holds the arena's memfd.
        auto* req = (*request)->body_as_ExportChunks();
        if (req->count() == 0 || req->count() > kMaxChunksPerRequest) {
          conn.Send(
              ErrorReply(id, absl::InvalidArgumentError(absl::StrCat(
                                 "ask for 1 to ", kMaxChunksPerRequest, " chunks at a time"))));
          return;
        }
        absl::StatusOr<std::vector<UniqueFd>> fds =
            arena_->ExportChunks(req->first(), req->count());
        if (!fds.ok()) {
          conn.Send(ErrorReply(id, fds.status()));
          return;
        }
        for (size_t i = 0; i < fds->size(); ++i) {
          flatbuffers::FlatBufferBuilder c;
          auto chunk = proto::CreateArenaChunk(c, req->first() + i);
          proto::Finish(
              c, proto::CreateMemReply(c, id, proto::MemReplyBody::ArenaChunk, chunk.Union()));
          conn.Send(Bytes(c), std::move((*fds)[i]));
        }
        return;
      }
      case proto::MemRequestBody::RequestLease: {
        auto* req = (*request)->body_as_RequestLease();
        absl::StatusOr<Lease> lease = leases_->Acquire(req->owner()->str(), req->bytes());
        if (!lease.ok()) {
          conn.Send(ErrorReply(id, lease.status()));
          return;
        }
        held_.push_back(*lease);
        auto granted = proto::CreateLeaseGranted(b, lease->offset, lease->bytes);
        proto::Finish(b, proto::CreateMemReply(b, id, proto::MemReplyBody::LeaseGranted, granted.Union()));
        conn.Send(Bytes(b));
        return;
      }
      case proto::MemRequestBody::ReleaseLease: {
        auto* req = (*request)->body_as_ReleaseLease();
        absl::Status released = leases_->Release(req->offset(), req->owner()->str());
        if (!released.ok()) {
          conn.Send(ErrorReply(id, released));
          return;
        }
        std::erase_if(held_, [&](const Lease& l) { return l.offset == req->offset(); });
        auto done = proto::CreateLeaseReleased(b, req->offset());
        proto::Finish(b, proto::CreateMemReply(b, id, proto::MemReplyBody::LeaseReleased, done.Union()));
        conn.Send(Bytes(b));
        return;
      }
      default:
        conn.Reject(ErrorReply(id, absl::InvalidArgumentError("unknown memdaemon request")));
        return;
    }
  }

 private:
  WorkerServer* const server_;
  gpu::Arena* const arena_;
  LeaseTable* const leases_;
  const bool self_peer_;
  bool attached_ = false;
  std::vector<Lease> held_;
};

namespace {

// The arena goes only to this user's processes that pswitchd itself started or to itself
// (in-process users: tests, the link probe): SO_PEERCRED, checked against the peer's parent in
// /proc. Which of those children are workers is the attach secret's job (Session). `*self` says
// whether the peer is this process.
absl::Status CheckPeer(int fd, bool* self) {
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus("SO_PEERCRED");
  }
  if (cred.uid != ::geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("peer pid ", cred.pid, " runs as uid ", cred.uid, ", not as pswitchd"));
  }
  *self = cred.pid == ::getpid();
  if (*self) return absl::OkStatus();
  std::ifstream in(absl::StrCat("/proc/", cred.pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  char state = 0;
  int ppid = 0;
  if (close == std::string::npos ||
      std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2 || ppid != ::getpid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("peer pid ", cred.pid, " is not a worker pswitchd started"));
  }
  return absl::OkStatus();
}

}  // namespace

WorkerServer::WorkerServer(std::string socket_path, gpu::Arena* arena, LeaseTable* leases)
    : socket_path_(std::move(socket_path)), arena_(arena), leases_(leases), acceptor_(io_) {}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(const std::string& socket_path,
                                                                  gpu::Arena* arena,
                                                                  LeaseTable* leases) {
  std::unique_ptr<WorkerServer> server(new WorkerServer(socket_path, arena, leases));
  asio::error_code ec;
  std::error_code fs_ec;
  if (std::filesystem::is_socket(socket_path, fs_ec)) {
    // A live daemon answers; a stale file left by a crashed one does not and is replaced.
    if (proto::FrameChannel::Connect(socket_path).ok()) {
      return absl::AlreadyExistsError(
          absl::StrCat("memdaemon socket '", socket_path, "' is in use by another process"));
    }
    std::filesystem::remove(socket_path, fs_ec);
  }
  asio::local::stream_protocol::endpoint endpoint(socket_path);
  server->acceptor_.open(endpoint.protocol(), ec);
  if (!ec) server->acceptor_.bind(endpoint, ec);
  // Only this user may connect, whatever the umask (it hands out the arena's fd); peers are
  // checked again on accept.
  if (!ec && ::chmod(socket_path.c_str(), 0600) != 0) {
    ec = asio::error_code(errno, asio::system_category());
  }
  if (!ec) server->acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("memdaemon socket '", socket_path, "': ", ec.message()));
  }
  server->Accept();
  server->thread_ = std::thread([s = server.get()] { s->io_.run(); });
  return server;
}

WorkerServer::~WorkerServer() {
  io_.stop();
  if (thread_.joinable()) thread_.join();
  std::error_code ec;
  std::filesystem::remove(socket_path_, ec);
}

absl::StatusOr<std::string> WorkerServer::IssueAttachSecret() {
  std::string secret(32, '\0');
  size_t filled = 0;
  while (filled < secret.size()) {
    const ssize_t n = ::getrandom(secret.data() + filled, secret.size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus("getrandom for an attach secret");
    filled += static_cast<size_t>(n);
  }
  absl::MutexLock lock(&secrets_mu_);
  if (unused_secrets_.size() >= kMaxUnusedSecrets) unused_secrets_.pop_front();
  unused_secrets_.push_back(secret);
  return secret;
}

bool WorkerServer::RedeemAttachSecret(const std::string& secret) {
  if (secret.size() != 32) return false;
  absl::MutexLock lock(&secrets_mu_);
  for (auto it = unused_secrets_.begin(); it != unused_secrets_.end(); ++it) {
    // Constant time per candidate: a peer learns nothing from how long a refusal takes.
    unsigned char diff = 0;
    for (size_t i = 0; i < secret.size(); ++i) diff |= (*it)[i] ^ secret[i];
    if (diff == 0) {
      unused_secrets_.erase(it);
      return true;
    }
  }
  return false;
}

void WorkerServer::Accept() {
  acceptor_.async_accept(
      [this](const asio::error_code& ec, asio::local::stream_protocol::socket socket) {
        if (ec) {
          proto::AcceptAgainLater(acceptor_, ec, "memdaemon", [this] { Accept(); });
          return;
        }
        bool self_peer = false;
        if (absl::Status peer = CheckPeer(socket.native_handle(), &self_peer); !peer.ok()) {
          base::Log(base::LogLevel::kWarn, "memdaemon_peer_refused").Field("detail", peer);
          Accept();
          return;  // `socket` closes
        }
        proto::FramedConnection::Socket generic(
            io_, asio::generic::stream_protocol(AF_UNIX, SOCK_STREAM), socket.release());
        auto session = std::make_shared<Session>(this, self_peer);
        auto conn = proto::FramedConnection::Create(
            std::move(generic),
            proto::ConnectionLimits{.max_frame_bytes = kMaxFrameBytes,
                                    .max_queued_bytes = kMaxQueuedReplyBytes},
            [session](proto::FramedConnection& c, std::vector<uint8_t> payload) {
              session->Handle(c, std::move(payload));
            },
            [](const absl::Status& status) { return ErrorReply(0, status); },
            // The session (and its leases) lives as long as the connection's handlers.
            [](proto::FramedConnection&, const absl::Status&) {});
        conn->Start();
        Accept();
      });
}

}  // namespace pswitch::memdaemon
