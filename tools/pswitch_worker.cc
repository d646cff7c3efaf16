// pswitch-worker: a worker process, spawned by pswitchd (never by hand): it inherits its control
// socket and attaches to the memdaemon's socket.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "base/log.h"
#include "tools/cli.h"
#include "worker/worker.h"

ABSL_FLAG(uint32_t, worker_id, 0, "worker slot id");
ABSL_FLAG(int, control_fd, -1, "inherited control socket fd");
ABSL_FLAG(std::string, memdaemon_socket, "", "memdaemon Unix socket");
ABSL_FLAG(std::string, backend, "host", "device backend: host or cuda");
ABSL_FLAG(uint64_t, activation_bytes, 0, "arena lease for intermediate tensors; 0 = none");
ABSL_FLAG(std::string, data_root, "", "fill datasets resolve under it (set by pswitchd)");
ABSL_FLAG(int, device, 0, "CUDA device ordinal (the memdaemon's arena device)");

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv, "pswitch worker process (spawned by pswitchd).");
  auto backend = pswitch::gpu::ParseBackend(absl::GetFlag(FLAGS_backend));
  if (!backend.ok() || absl::GetFlag(FLAGS_control_fd) < 0 ||
      absl::GetFlag(FLAGS_memdaemon_socket).empty()) {
    std::fprintf(stderr,
                 "pswitch-worker: needs --control-fd, --memdaemon-socket and a valid "
                 "--backend; it is started by pswitchd\n");
    return 2;
  }
  pswitch::worker::WorkerOptions options;
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  options.backend = *backend;
  options.control_fd = absl::GetFlag(FLAGS_control_fd);
  options.memdaemon_socket = absl::GetFlag(FLAGS_memdaemon_socket);
  options.activation_bytes = absl::GetFlag(FLAGS_activation_bytes);
  options.device_ordinal = absl::GetFlag(FLAGS_device);
  options.data_root = absl::GetFlag(FLAGS_data_root);
  auto worker = pswitch::worker::Worker::Start(options);
  if (!worker.ok()) {
    pswitch::base::Log(pswitch::base::LogLevel::kError, "worker_start_failed")
        .Field("worker", options.worker_id)
        .Field("pid", ::getpid())
        .Field("error", worker.status());
    return 1;
  }
  absl::Status served = (*worker)->Serve();
  if (!served.ok()) {
    pswitch::base::Log(pswitch::base::LogLevel::kError, "worker_stopped")
        .Field("worker", options.worker_id)
        .Field("pid", ::getpid())
        .Field("error", served);
    return 1;
  }
  return 0;
}
