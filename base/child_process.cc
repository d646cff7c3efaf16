#include "base/child_process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
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
  // This process's environment with spec.env's entries in place of any of the same name.
  std::vector<std::string> env = spec.env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const absl::string_view name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(spec.env.begin(), spec.env.end(), [&](const std::string& o) {
      return absl::string_view(o).substr(0, o.find('=')) == name;
    });
    if (!replaced) env.emplace_back(entry);
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
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
        if (fd != status_fd &&
            std::find(spec.inherit_fds.begin(), spec.inherit_fds.end(), fd) == spec.inherit_fds.end()) {
          ::close(fd);
        }
      }
    }
    for (int fd : spec.inherit_fds) {
      if (fd >= 0) ::fcntl(fd, F_SETFD, 0);  // survives exec
    }
    int error = 0;
    // nice(2) returns the new value, which may be -1: errno tells a failure (a lower priority
    // is always allowed, so only an out-of-range request fails, and that is clamped instead).
    if (spec.nice != 0) {
      errno = 0;
      (void)::nice(spec.nice);
    }
    if (spec.address_space_bytes > 0 && ::setrlimit(RLIMIT_AS, &limit) != 0) {
      error = errno;
    } else {
      ::execve(argv[0], argv.data(), envp.data());
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

std::vector<std::string> CpuThreadsEnv(int threads) {
  if (threads <= 0) return {};
  const std::string n = std::to_string(threads);
  return {"OMP_NUM_THREADS=" + n, "OPENBLAS_NUM_THREADS=" + n, "MKL_NUM_THREADS=" + n};
}

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return "ended";
}

namespace {

// Resident bytes of `pid` (0 if it cannot be read: it is exiting).
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream statm(absl::StrCat("/proc/", pid, "/statm"));
  uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

constexpr absl::Duration kSample = absl::Milliseconds(10);

}  // namespace

absl::StatusOr<BoundedChild> BoundedChild::Start(const BoundedChildSpec& spec) {
  // A memory file rather than a pipe: nothing to drain while waiting, and its size is the bound.
  UniqueFd out(::memfd_create("pswitch-child-stdout",
                              MFD_CLOEXEC | (spec.map_output ? MFD_ALLOW_SEALING : 0)));
  if (!out.valid()) return ErrnoStatus("memfd_create for a child's output");
  PSWITCH_ASSIGN_OR_RETURN(pid_t pid, SpawnChild({.argv = spec.argv,
                                                  .inherit_fds = spec.inherit_fds,
                                                  .stdout_fd = out.get(),
                                                  .env = spec.env,
                                                  .nice = spec.nice}));
  return BoundedChild(pid, std::move(out));
}

BoundedChild::BoundedChild(BoundedChild&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      out_(std::move(other.out_)),
      exited_(other.exited_),
      wait_status_(other.wait_status_) {}

BoundedChild::~BoundedChild() { Kill(); }

void BoundedChild::Kill() {
  if (pid_ <= 0 || exited_) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exited_ = true;
  wait_status_ = status;
}

bool BoundedChild::Running() {
  if (pid_ <= 0 || exited_) return false;
  int status = 0;
  pid_t reaped;
  while ((reaped = ::waitpid(pid_, &status, WNOHANG)) < 0 && errno == EINTR) {
  }
  if (reaped == pid_) {
    exited_ = true;
    wait_status_ = status;
  } else if (reaped < 0) {
    exited_ = true;  // not ours to wait for any more (reaped elsewhere): never used again
    wait_status_ = 0;
  }
  return !exited_;
}

absl::StatusOr<BoundedChildResult> BoundedChild::Wait(const BoundedChildSpec& spec) {
  if (pid_ <= 0 || !out_.valid()) {
    return absl::FailedPreconditionError(absl::StrCat(spec.what, ": no child to wait for"));
  }
  const UniqueFd out = std::move(out_);  // once only
  const absl::Time deadline = absl::Now() + spec.timeout;
  while (!exited_) {
    int status = 0;
    const pid_t reaped = ::waitpid(pid_, &status, WNOHANG);
    if (reaped < 0 && errno != EINTR) {
      const int error_number = errno;
      const absl::Status error = ErrnoStatus(absl::StrCat("waiting for ", spec.what), error_number);
      // ECHILD: reaped elsewhere, and its pid may be another process's by now: never killed.
      if (error_number == ECHILD) {
        exited_ = true;
      } else {
        Kill();
      }
      return error;
    }
    if (reaped == pid_) {
      exited_ = true;
      wait_status_ = status;
      break;
    }
    absl::Status bound;
    struct stat st {};
    if (absl::Now() >= deadline) {
      bound = absl::DeadlineExceededError(absl::StrCat(
          spec.what, " took longer than ", absl::FormatDuration(spec.timeout), spec.timeout_hint));
    } else if (ResidentBytes(pid_) > spec.memory_bytes) {
      bound = absl::ResourceExhaustedError(absl::StrCat(spec.what, " needed more than ",
                                                        spec.memory_bytes, " bytes of memory",
                                                        spec.memory_hint));
    } else if (::fstat(out.get(), &st) == 0 &&
               static_cast<uint64_t>(st.st_size) > spec.max_output_bytes) {
      bound = absl::ResourceExhaustedError(
          absl::StrCat(spec.what, " wrote more than ", spec.max_output_bytes, " bytes"));
    }
    if (!bound.ok()) {
      Kill();
      return bound;
    }
    if (spec.on_sample) spec.on_sample();
    absl::SleepFor(kSample);
  }
  // What it sent just before it exited is still waiting for the caller.
  if (spec.on_sample) spec.on_sample();
  const int status = wait_status_;
  BoundedChildResult result;
  result.wait_status = status;
  // Read through our own descriptor (the child's offset is its own), at the size it has now: a
  // descendant left behind could still write, and what it adds is not read.
  struct stat st {};
  if (::fstat(out.get(), &st) != 0) return ErrnoStatus(absl::StrCat("the output of ", spec.what));
  if (static_cast<uint64_t>(st.st_size) > spec.max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(spec.what, " wrote more than ", spec.max_output_bytes, " bytes"));
  }
  // Sealed, the output can no longer change under a mapping: a descendant still holding it open
  // finds its writes refused. One holding a shared mapping of it (or a child that sealed it
  // itself) makes the seal fail, and then it is copied as it is now.
  if (spec.map_output && ::fcntl(out.get(), F_ADD_SEALS,
                                 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) == 0) {
    PSWITCH_ASSIGN_OR_RETURN(result.mapped_output,
                             MappedFile::MapSealed(out, absl::StrCat("the output of ", spec.what),
                                                   spec.max_output_bytes));
    return result;
  }
  result.output.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < result.output.size()) {
    const ssize_t n = ::pread(out.get(), result.output.data() + done, result.output.size() - done,
                              static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(absl::StrCat("reading the output of ", spec.what));
    if (n == 0) break;  // truncated meanwhile
    done += static_cast<size_t>(n);
  }
  result.output.resize(done);
  return result;
}

absl::StatusOr<BoundedChildResult> RunBoundedChild(const BoundedChildSpec& spec) {
  PSWITCH_ASSIGN_OR_RETURN(BoundedChild child, BoundedChild::Start(spec));
  return child.Wait(spec);
}

}  // namespace pswitch::base
