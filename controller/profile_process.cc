#include "controller/profile_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/child_process.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace pswitch::controller {
namespace {

constexpr size_t kMaxProfileJsonBytes = 16 << 20;
constexpr int kSampleMs = 50;

// Resident bytes of `pid` (0 if it cannot be read: it is exiting).
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream statm(absl::StrCat("/proc/", pid, "/statm"));
  uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// Kills and reaps `pid` on every path out of ProfileInChild that has not reaped it.
class ChildGuard {
 public:
  explicit ChildGuard(pid_t pid) : pid_(pid) {}
  ~ChildGuard() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Reap();
    }
  }
  // It was reaped by the caller.
  void Forget() { pid_ = -1; }

 private:
  void Reap() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }


  pid_t pid_;
};

}  // namespace

absl::StatusOr<grouping::Profile> ProfileInChild(const ProfileChildOptions& options,
                                                 const std::string& zoo, uint32_t batch,
                                                 int archive_fd) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe for the profiler");
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  PSWITCH_ASSIGN_OR_RETURN(
      pid_t pid,
      base::SpawnChild({.argv = {options.binary, absl::StrCat("--profile_model=", zoo),
                                 absl::StrCat("--profile_batch=", batch),
                                 absl::StrCat("--profile_device=", options.device),
                                 absl::StrCat("--profile_bandwidth=", options.bandwidth_bytes_per_s),
                                 absl::StrCat("--profile_archive_fd=", archive_fd)},
                        .inherit_fd = archive_fd,
                        .stdout_fd = write_end.get()}));
  ChildGuard child(pid);
  write_end.Reset();  // EOF once the child exits
  const std::string what = absl::StrCat("profiling '", zoo, "' at batch ", batch);
  const absl::Time deadline = absl::Now() + options.timeout;
  std::string json;
  char buffer[64 << 10];
  while (true) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, " took longer than ", absl::FormatDuration(options.timeout),
          "; register with a find-grouping plan, or a smaller batch"));
    }
    if (ResidentBytes(pid) > options.memory_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " needed more than ", options.memory_bytes,
          " bytes of memory (--profile-memory-bytes); register with a smaller batch or a plan"));
    }
    pollfd readable{read_end.get(), POLLIN, 0};
    const int ready = ::poll(&readable, 1, kSampleMs);
    if (ready < 0 && errno != EINTR) return ErrnoStatus("poll on the profiler");
    if (ready <= 0) continue;
    const ssize_t n = ::read(read_end.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("read from the profiler");
    if (n == 0) break;  // the child closed its stdout: it is exiting
    if (json.size() + static_cast<size_t>(n) > kMaxProfileJsonBytes) {
      return absl::InternalError(absl::StrCat(what, ": the profiler's output is too large"));
    }
    json.append(buffer, static_cast<size_t>(n));
  }
  // Its stdout is closed; a child that then never exits is still held to the deadline.
  int status = 0;
  pid_t reaped;
  while ((reaped = ::waitpid(pid, &status, WNOHANG)) == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (reaped != pid) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": the profiler did not exit within the timeout"));
  }
  child.Forget();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(what, " failed: the profiler ",
                                            base::DescribeExit(status), " (see pswitchd's log)"));
  }
  absl::StatusOr<grouping::Profile> profile = grouping::ParseProfileJson(json);
  if (!profile.ok()) {
    return absl::InternalError(
        absl::StrCat(what, ": the profiler's output is not a profile: ", profile.status().message()));
  }
  return profile;
}

}  // namespace pswitch::controller
