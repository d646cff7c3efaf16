// The file-descriptor budget: how many descriptors pswitchd may need at once, from its caps, and
// whether RLIMIT_NOFILE covers them. Under systemd's default soft limit of 1,024, 1,500 idle
// HTTP connections once starved the TCP port (accept: "Too many open files") and the respawn
// of a killed worker (issue 27, item 2): pswitchd now raises its soft limit to the hard limit
// and refuses to start when even that is short of what its caps allow.
#ifndef PSWITCH_FRONTEND_FD_BUDGET_H_
#define PSWITCH_FRONTEND_FD_BUDGET_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pswitch::frontend {

// What pswitchd may hold open at once: every connection its caps admit, and its workers.
struct FdDemand {
  size_t tcp_connections = 0;              // --max-connections
  size_t unauthenticated_connections = 0;  // --max-unauthenticated-connections (with tokens)
  size_t http_connections = 0;             // --http-max-connections (0: no HTTP port)
  size_t gpus = 1;                         // --gpus
  size_t workers_per_gpu = 1;              // 1 + --standby-workers
};

// Descriptors pswitchd holds per worker: its socket, its pidfd and its memory-daemon connection
// (3, measured on the host backend), and a replacement's beside it while one is respawned.
inline constexpr size_t kFdsPerWorker = 8;
// Per GPU: the memory daemon's socket and arena memfd, the copy engine (2 measured on the host
// backend), and on CUDA the driver's device files (about 20 a context; not measured here).
inline constexpr size_t kFdsPerGpu = 32;
// Everything else: stdio and the log, the listening sockets, the event loops' epoll, eventfd
// and timer descriptors (about 20 measured), repository files and archives being read, the
// children that check archives and profile plans (memfd, pipes, pidfd), and a margin.
inline constexpr size_t kFdsBase = 128;

// The descriptors `demand` may take at once.
size_t FdsNeeded(const FdDemand& demand);

// OK when `limit` (RLIMIT_NOFILE's soft limit) covers `demand`; otherwise FailedPrecondition
// naming the need, its parts, the limit and the flags that lower the need.
absl::Status CheckFdBudget(const FdDemand& demand, uint64_t limit);

struct FdLimit {
  uint64_t soft = 0;
  uint64_t hard = 0;
};
// Raises this process's RLIMIT_NOFILE soft limit to its hard limit (at most the kernel's
// fs.nr_open) and returns the limits now in force.
absl::StatusOr<FdLimit> RaiseFdLimit();

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_FD_BUDGET_H_
