// pswitchd's TCP and Unix-socket front end for clients: length-prefixed, verified FlatBuffers
// (proto/client.fbs) on one Asio event loop, with the same framing and limits on both. A
// malformed frame gets an error reply and closes that connection only; results of long tasks are
// pushed on the connection that submitted them.
//
// Who a connection is (docs/dataplane.md, "Identity on the local path"): a token's principal
// once it authenticates; else, on the Unix socket, the peer's uid (SO_PEERCRED) and, on TCP from
// loopback without tokens, the uid that owns the peer's socket (the kernel's socket diagnostics),
// each through PrincipalOfUid: pswitchd's own uid is an admin, every other a user, unless the
// token file maps it. A token presented on the Unix socket wins over the uid. Only a TCP peer
// beyond loopback without tokens (--insecure) is an anonymous admin.
//
// A SubmitTask may be followed by a raw payload (docs/dataplane.md, "TCP raw payload"): its
// Place::Payload inputs are received straight into a staging region of the connection's
// StagingPool, the worker reads them there and writes the outputs beside them, and with
// outputs_place Payload the reply's outputs are sent from there (one scatter-gather write). A
// payload refused for its size or its memory closes the connection after the error reply (the
// bytes would still have to be read to skip them); a request refused for anything else has its
// payload read and dropped, then the error reply, and the connection goes on.
//
// The Unix socket also takes files with frames (SCM_RIGHTS): a transfer area's memfd with
// RegisterArea, and a registration's weights, archive and plan (ClientRequest.passed_files).
#ifndef PSWITCH_FRONTEND_CLIENT_SERVER_H_
#define PSWITCH_FRONTEND_CLIENT_SERVER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "asio.hpp"
#include "controller/controller.h"
#include "controller/fill_manager.h"
#include "dataplane/region_table.h"
#include "frontend/admission.h"
#include "frontend/auth.h"
#include "frontend/byte_budget.h"
#include "frontend/client_quota.h"
#include "frontend/unix_socket_file.h"
#include "proto/framed_connection.h"
#include "registry/model_repository.h"

namespace pswitch::frontend {

using controller::Controller;
using controller::FillManager;
using registry::ModelRepository;

struct ClientServerOptions {
  uint32_t max_frame_bytes = proto::kDefaultMaxFrameBytes;
  // Raw payload one SubmitTask may carry (ClientRequest.payload_bytes: tensors received straight
  // into a staging region); 0: 4 x max_frame_bytes. Larger ones are refused before a byte of
  // them is read.
  uint64_t max_payload_bytes = 0;
  // Registrations that name models only are loaded from it (null: none).
  const ModelRepository* repository = nullptr;
  // Registrations may name server files (weights, plans): local use only.
  bool allow_client_paths = false;
  // Connections beyond this many are closed on accept (with tokens: authenticated ones, refused
  // when they authenticate).
  size_t max_connections = 256;
  // With tokens: connections still to authenticate, beside max_connections. A newcomer beyond
  // this closes the oldest of them: a real client authenticates within milliseconds, so the
  // oldest are the idlers.
  size_t max_unauthenticated_connections = 32;
  // Bearer tokens every connection must present first (null: no authentication).
  const TokenTable* tokens = nullptr;
  // A frame begun must arrive whole within this; slower senders are cut.
  absl::Duration frame_timeout = absl::Seconds(30);
  // A connection with no request for this long, and no answer owed to it, is closed.
  absl::Duration idle_timeout = absl::Minutes(10);
  // With tokens: a connection must authenticate within this of connecting.
  absl::Duration auth_timeout = absl::Seconds(10);
  // What every client may make pswitchd hold: incomplete frames and queued replies are charged
  // to the connection's client (its token's name; kUnauthenticatedClient before it
  // authenticates; without tokens, the connection itself). Shared with the HTTP port; null: a
  // budget of this server's own with ByteBudgetLimits' defaults.
  std::shared_ptr<ByteBudget> budget;
  // Replies queued on one connection whose peer does not read them (at least two frames).
  size_t max_queued_reply_bytes = 256 << 20;
  // Unfinished tasks one client may have (a client: its token's name, or without tokens one
  // connection).
  size_t max_tasks_per_client = 256;
  // Also serve clients on this Unix socket path (empty: TCP only). Created 0660 (the directory
  // decides who may reach it); a stale socket there is replaced, anything else is refused.
  std::string unix_socket;
  // The transfer regions every port shares (areas, Triton regions); must outlive the server.
  // Null: a table of the server's own with RegionLimits' defaults.
  dataplane::RegionTable* regions = nullptr;
};

// Files one frame may carry on the Unix socket: a registration's weights, archive and plan.
inline constexpr size_t kMaxFilesPerFrame = 4;

// Whether `listen` ("HOST:PORT", as ClientServer::Start takes it) admits only this machine.
bool IsLoopbackListen(const std::string& listen);

// Runs its own event-loop thread. `*controller` and `*fill` must outlive the server, or at least
// its StopServing().
class ClientServer {
 public:
  // `listen` is "HOST:PORT"; port 0 picks a free one (see port()).
  static absl::StatusOr<std::unique_ptr<ClientServer>> Start(const std::string& listen,
                                                             Controller* controller,
                                                             FillManager* fill,
                                                             ClientServerOptions options);
  // Flushes the replies already posted (tasks answered during shutdown), then closes every
  // connection; a client that stops reading holds it up for at most a few seconds.
  ~ClientServer();
  ClientServer(const ClientServer&) = delete;
  ClientServer& operator=(const ClientServer&) = delete;

  uint16_t port() const { return port_; }
  // The Unix socket served ("" if none).
  const std::string& unix_socket() const { return options_.unix_socket; }
  // The transfer regions this server's admission resolves tensors in: give the same table to
  // the other ports.
  dataplane::RegionTable& regions() { return *regions_; }
  // Shared with the HTTP port, so a client's tasks and cap are the same on both.
  TaskOwners& owners() { return owners_; }
  ClientQuota& quota() { return quota_; }
  // Every port's way to queue a task (quota, owners, model access, inputs, deadline), with this
  // port's owners and quota.
  TaskAdmission& admission() { return admission_; }

  // Graceful shutdown, first step: refuses new connections and answers every new request with
  // Unavailable, so the controller and fill manager are no longer called; replies to requests
  // already accepted (task results) are still delivered. Idempotent; returns once in effect.
  void StopServing();

 private:
  class Session;
  // Who is on the other end, as far as the transport tells.
  struct Peer {
    std::string address;  // the TCP peer's address, or "unix:uid:N"
    bool unix_socket = false;
    // Without tokens, beyond loopback (only with --insecure): whoever reaches the port is an
    // anonymous admin, the operator's choice. Decided at accept, from ends the kernel gave.
    bool insecure_remote = false;
    std::optional<Principal> principal;  // from the kernel (PrincipalOfUid); none: a token's
  };
  ClientServer(Controller* controller, FillManager* fill, ClientServerOptions options)
      : controller_(controller),
        fill_(fill),
        options_(options),
        own_regions_(options.regions == nullptr ? std::make_unique<dataplane::RegionTable>()
                                                : nullptr),
        regions_(options.regions != nullptr ? options.regions : own_regions_.get()),
        quota_(options.max_tasks_per_client),
        sink_(ControllerTaskSink(controller, fill)),
        admission_(sink_.get(), &quota_, &owners_, /*max_copies=*/8, regions_),
        budget_(options.budget != nullptr ? options.budget
                                          : std::make_shared<ByteBudget>(ByteBudgetLimits{})),
        acceptor_(io_) {}
  void Accept();
  void AcceptUnix();
  // Binds the Unix socket (replacing a stale one), 0660, and starts accepting on it.
  absl::Status ListenUnix();
  // Serves one accepted connection of either transport.
  void Serve(proto::FramedConnection::Socket socket, Peer peer);
  // Closes the connection that has waited longest to authenticate and has sent nothing yet
  // (else the oldest).
  void EvictOldestUnauthenticated();
  // A connection that held many bytes closed: soon, once for all that close about then, the
  // allocator gives its free pages back to the system.
  void ReturnMemorySoon();

  Controller* const controller_;
  FillManager* const fill_;
  const ClientServerOptions options_;
  const std::unique_ptr<dataplane::RegionTable> own_regions_;  // when the options gave none
  dataplane::RegionTable* const regions_;
  TaskOwners owners_;
  ClientQuota quota_;
  const std::unique_ptr<TaskSink> sink_;
  TaskAdmission admission_;
  const std::shared_ptr<ByteBudget> budget_;
  asio::io_context io_;
  // Keeps the event loop running (posts always execute) until the destructor lets it run dry.
  asio::executor_work_guard<asio::io_context::executor_type> keep_running_{io_.get_executor()};
  asio::ip::tcp::acceptor acceptor_;
  asio::local::stream_protocol::acceptor unix_acceptor_{io_};
  bool unix_listening_ = false;  // the socket file is ours to remove
  UnixSocketFile unix_file_;     // its file (its fd is the acceptor's)
  uint16_t port_ = 0;
  // Event-loop thread only.
  bool serving_ = true;
  uint64_t connections_accepted_ = 0;
  std::vector<std::weak_ptr<proto::FramedConnection>> connections_;
  size_t admitted_ = 0;  // connections counted against max_connections
  // Connections still to authenticate, by number: the oldest first.
  std::map<uint64_t, std::weak_ptr<proto::FramedConnection>> unauthenticated_;
  asio::steady_timer return_memory_{io_};  // ReturnMemorySoon's
  bool return_memory_due_ = false;
  absl::Notification io_done_;  // the event loop has returned
  std::thread thread_;
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_CLIENT_SERVER_H_
