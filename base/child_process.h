// Starting a helper process from a multi-threaded daemon: fork + exec with nothing but stdio
// and the fds named inherited, killed with its parent (PR_SET_PDEATHSIG), optionally under an
// address-space limit. The child runs only async-signal-safe code before exec.
#ifndef PSWITCH_BASE_CHILD_PROCESS_H_
#define PSWITCH_BASE_CHILD_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pswitch::base {

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0]: the binary's path
  int inherit_fd = -1;            // kept open across exec at its number (-1: none)
  int stdout_fd = -1;             // becomes the child's stdout (-1: this process's)
  uint64_t address_space_bytes = 0;  // RLIMIT_AS; 0: none (CUDA reserves far more than it uses)
};

// The child's pid once it has exec'd (it must be reaped, waitpid, by the caller); an error naming
// errno when the exec failed (the child is reaped then).
absl::StatusOr<pid_t> SpawnChild(const ChildSpec& spec);

// "exited with status N" / "killed by signal N (name)", from a waitpid status.
std::string DescribeExit(int wait_status);

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_CHILD_PROCESS_H_
