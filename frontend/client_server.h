// pswitchd's TCP front end for clients: length-prefixed, verified FlatBuffers (proto/client.fbs)
// on an Asio event loop. A malformed frame gets an error reply and closes that connection only;
// results of long tasks are pushed on the connection that submitted them.
#ifndef PSWITCH_FRONTEND_CLIENT_SERVER_H_
#define PSWITCH_FRONTEND_CLIENT_SERVER_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "asio.hpp"
#include "controller/controller.h"
#include "controller/fill_manager.h"
#include "controller/model_repository.h"
#include "frontend/admission.h"
#include "frontend/auth.h"
#include "frontend/byte_budget.h"
#include "frontend/client_quota.h"
#include "proto/framed_connection.h"

namespace pswitch::frontend {

using controller::Controller;
using controller::FillManager;
using controller::ModelRepository;

struct ClientServerOptions {
  uint32_t max_frame_bytes = proto::kDefaultMaxFrameBytes;
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
};

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
  ClientServer(Controller* controller, FillManager* fill, ClientServerOptions options)
      : controller_(controller),
        fill_(fill),
        options_(options),
        quota_(options.max_tasks_per_client),
        sink_(ControllerTaskSink(controller)),
        admission_(sink_.get(), &quota_, &owners_),
        budget_(options.budget != nullptr ? options.budget
                                          : std::make_shared<ByteBudget>(ByteBudgetLimits{})),
        acceptor_(io_) {}
  void Accept();
  // Closes the connection that has waited longest to authenticate and has sent nothing yet
  // (else the oldest).
  void EvictOldestUnauthenticated();
  // A connection that held many bytes closed: soon, once for all that close about then, the
  // allocator gives its free pages back to the system.
  void ReturnMemorySoon();

  Controller* const controller_;
  FillManager* const fill_;
  const ClientServerOptions options_;
  TaskOwners owners_;
  ClientQuota quota_;
  const std::unique_ptr<TaskSink> sink_;
  TaskAdmission admission_;
  const std::shared_ptr<ByteBudget> budget_;
  asio::io_context io_;
  // Keeps the event loop running (posts always execute) until the destructor lets it run dry.
  asio::executor_work_guard<asio::io_context::executor_type> keep_running_{io_.get_executor()};
  asio::ip::tcp::acceptor acceptor_;
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
