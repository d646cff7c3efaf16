#include "base/child_process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace pswitch::base {

absl::StatusOr<pid_t> SpawnChild(const ChildSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("no program to start");
  // Everything the child needs is prepared before fork: this process has threads.
  std::vector<std::string> args = spec.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const int max_fd = static_cast<int>(std::min<long>(::sysconf(_SC_OPEN_MAX), 1 << 16));
  const rlimit limit{spec.address_space_bytes, spec.address_space_bytes};
  // Close-on-exec: EOF tells the parent the exec happened (until then the child is a copy of
  // this process, whose memory a caller must not mistake for the child's); a failed exec
  // writes its errno first.
  int status_pipe[2];
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) return ErrnoStatus("pipe for a child's exec");
  UniqueFd status_read(status_pipe[0]), status_write(status_pipe[1]);
  const int status_fd = status_write.get();
  pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    return ErrnoStatus(absl::StrCat("fork for ", spec.argv[0]), error);
  }
  if (pid == 0) {
    // Die with the daemon rather than linger as an orphan.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(127);
    if (spec.stdout_fd >= 0 && ::dup2(spec.stdout_fd, STDOUT_FILENO) < 0) _exit(127);
    // Only stdio and the named fd may reach the child: an inherited client or worker connection
    // would keep that peer's socket open after the peer is gone.
    if (::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) != 0) {
      for (int fd = 3; fd < max_fd; ++fd) {
        if (fd != spec.inherit_fd && fd != status_fd) ::close(fd);
      }
    }
    if (spec.inherit_fd >= 0) ::fcntl(spec.inherit_fd, F_SETFD, 0);  // survives exec
    int error = 0;
    if (spec.address_space_bytes > 0 && ::setrlimit(RLIMIT_AS, &limit) != 0) {
      error = errno;
    } else {
      ::execv(argv[0], argv.data());
      error = errno;
    }
    (void)!::write(status_fd, &error, sizeof(error));
    _exit(127);
  }
  status_write.Reset();
  int exec_error = 0;
  ssize_t n;
  while ((n = ::read(status_read.get(), &exec_error, sizeof(exec_error))) < 0 && errno == EINTR) {
  }
  if (n == static_cast<ssize_t>(sizeof(exec_error))) {
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return ErrnoStatus(absl::StrCat("starting ", spec.argv[0]), exec_error);
  }
  return pid;
}

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return "ended";
}

}  // namespace pswitch::base
