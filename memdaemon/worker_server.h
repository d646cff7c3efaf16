// The memdaemon's Unix-socket endpoint for workers: arena attach (the arena handle, with the
// memfd passed as SCM_RIGHTS on the host backend), lease requests and releases. Leases a
// connection holds are released when it closes, so a crashed worker leaks no arena memory.
#ifndef PSWITCH_MEMDAEMON_WORKER_SERVER_H_
#define PSWITCH_MEMDAEMON_WORKER_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
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

 private:
  class Session;
  WorkerServer(std::string socket_path, gpu::Arena* arena, LeaseTable* leases);
  void Accept();

  const std::string socket_path_;
  gpu::Arena* const arena_;
  LeaseTable* const leases_;
  asio::io_context io_;
  asio::local::stream_protocol::acceptor acceptor_;
  std::thread thread_;
};

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_WORKER_SERVER_H_
