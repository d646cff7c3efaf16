// Test-only: an in-process memory daemon on the host backend, for tests of what sits on top of
// one (transmissions, state areas, the scheduler's parts).
#ifndef PSWITCH_MEMDAEMON_HOST_TEST_DAEMON_H_
#define PSWITCH_MEMDAEMON_HOST_TEST_DAEMON_H_

#include <memory>

#include "memdaemon/memdaemon.h"

namespace pswitch::memdaemon {

inline absl::StatusOr<std::unique_ptr<MemDaemon>> HostTestDaemon(uint64_t arena_bytes = 64 << 20) {
  MemDaemonOptions options;
  options.arena_bytes = arena_bytes;
  return MemDaemon::Create(options);
}

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_HOST_TEST_DAEMON_H_
