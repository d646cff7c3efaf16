// The memdaemon's Unix-socket endpoint for workers: arena attach (the arena handle, with the
// memfd passed as SCM_RIGHTS on the host backend), lease requests and releases. Leases a
// connection holds are released when it closes, so a crashed worker leaks no arena memory.
//
// Who gets the arena. The socket is 0600 and a peer must be this user's process whose parent is
// pswitchd (SO_PEERCRED); that alone admits every child pswitchd starts, including the
// archive-checking and profiling children that run hostile archives. So attaching also takes a
// one-time secret that pswitchd issues for each worker it spawns (IssueAttachSecret) and hands
// over through an inherited pipe, never argv or the environment: other children never get one,
// and a secret works once. Only pswitchd's own process (tests, the link probe) attaches without.
// A connection that has not attached may not request or release leases.
#ifndef PSWITCH_MEMDAEMON_WORKER_SERVER_H_
#define PSWITCH_MEMDAEMON_WORKER_SERVER_H_

#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "asio.hpp"
#include "gpu/device.h"
#include "memdaemon/lease_table.h"

namespace pswitch::memdaemon {

// Runs its own Asio event loop thread. `*arena` and `*leases` must outlive the server.
class WorkerServer {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const std::string& socket_path,
                                                             gpu::Arena* arena, LeaseTable* leases);
  ~WorkerServer();
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  const std::string& socket_path() const { return socket_path_; }

  // A new one-time attach secret (32 random bytes) for one worker about to be spawned. Issued
  // secrets that are never used are forgotten oldest first past kMaxUnusedSecrets. Thread-safe.
  absl::StatusOr<std::string> IssueAttachSecret();
  static constexpr size_t kMaxUnusedSecrets = 1024;

 private:
  class Session;
  WorkerServer(std::string socket_path, gpu::Arena* arena, LeaseTable* leases);
  void Accept();
  // True (once) for a secret IssueAttachSecret returned.
  bool RedeemAttachSecret(const std::string& secret);

  const std::string socket_path_;
  gpu::Arena* const arena_;
  LeaseTable* const leases_;
  asio::io_context io_;
  asio::local::stream_protocol::acceptor acceptor_;
  std::thread thread_;

  absl::Mutex secrets_mu_;
  std::deque<std::string> unused_secrets_ ABSL_GUARDED_BY(secrets_mu_);  // oldest first
};

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_WORKER_SERVER_H_
