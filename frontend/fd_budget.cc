#include "frontend/fd_budget.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace pswitch::frontend {
namespace {

// What a soft limit may be raised to when the hard limit is unlimited.
uint64_t KernelMaxOpen() {
  uint64_t nr_open = 1 << 20;  // the kernel's default
  std::ifstream in("/proc/sys/fs/nr_open");
  if (uint64_t read = 0; in >> read && read > 0) nr_open = read;
  return nr_open;
}

}  // namespace

size_t FdsNeeded(const FdDemand& demand) {
  return demand.tcp_connections + demand.unauthenticated_connections + demand.http_connections +
         demand.gpus * (kFdsPerGpu + demand.workers_per_gpu * kFdsPerWorker) + kFdsBase;
}

absl::Status CheckFdBudget(const FdDemand& demand, uint64_t limit) {
  const size_t needed = FdsNeeded(demand);
  if (needed <= limit) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "pswitchd may need ", needed, " file descriptors (", demand.tcp_connections, " TCP + ",
      demand.unauthenticated_connections, " unauthenticated + ", demand.http_connections,
      " HTTP connections, ", demand.gpus * demand.workers_per_gpu, " workers on ", demand.gpus,
      " GPU(s), ", kFdsBase, " for files and margin) but RLIMIT_NOFILE allows ", limit,
      ": raise the limit (systemd LimitNOFILE=, ulimit -n, the container runtime's nofile) or "
      "lower --max-connections, --max-unauthenticated-connections or --http-max-connections"));
}

absl::StatusOr<FdLimit> RaiseFdLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(absl::StrCat("getrlimit(RLIMIT_NOFILE): ", std::strerror(errno)));
  }
  rlim_t target = limit.rlim_max;
  if (target == RLIM_INFINITY) target = static_cast<rlim_t>(KernelMaxOpen());
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < target) {
    rlimit raised = limit;
    raised.rlim_cur = target;
    if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      return absl::InternalError(
          absl::StrCat("setrlimit(RLIMIT_NOFILE, ", target, "): ", std::strerror(errno)));
    }
    limit.rlim_cur = target;
  }
  auto value = [](rlim_t v) { return v == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(v); };
  return FdLimit{value(limit.rlim_cur), value(limit.rlim_max)};
}

}  // namespace pswitch::frontend
