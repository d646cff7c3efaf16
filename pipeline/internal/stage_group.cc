#include "pipeline/internal/stage_group.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"
#include "pipeline/internal/control.h"
#include "pipeline/wire.h"
#include "base/status.h"

namespace pswitch::pipeline::internal {
namespace {

// Closes every descriptor except those in `keep` (which must include stdio to keep it).
void CloseAllExcept(std::vector<int> keep) {
  std::sort(keep.begin(), keep.end());
  unsigned int from = 0;
  for (int fd : keep) {
    if (fd < 0) continue;
    if (static_cast<unsigned int>(fd) > from) {
      if (::syscall(SYS_close_range, from, static_cast<unsigned int>(fd) - 1, 0u) != 0) {
        for (unsigned int f = from; f < static_cast<unsigned int>(fd); ++f) ::close(f);
      }
    }
    from = static_cast<unsigned int>(fd) + 1;
  }
  if (::syscall(SYS_close_range, from, ~0u, 0u) != 0) {
    const long max_fd = std::min<long>(::sysconf(_SC_OPEN_MAX), 1 << 16);
    for (long f = from; f < max_fd; ++f) ::close(static_cast<int>(f));
  }
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return absl::StrCat("was killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return "ended";
}

}  // namespace

absl::Status RunStageMain(const StageMain& stage_main, StageConfig config, StageLinks& links) {
  absl::Status status;
  try {
    status = stage_main(std::move(config), links);
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("uncaught exception: ", e.what()));
  } catch (...) {
    status = absl::InternalError("uncaught exception");
  }
  if (!status.ok() && links.control.valid()) {
    // Best effort: the coordinator also learns of the failure from the socket closing.
    (void)SendMessage(links.control.get(), TextMessage(MessageKind::kError, 0, EncodeError(status)),
                      absl::Now() + absl::Seconds(1));
  }
  return status;
}

StageGroup::StageGroup(StageLaunch launch, int stages) : launch_(launch) {
  if (launch == StageLaunch::kProcesses) {
    children_.resize(stages);
  } else {
    absl::MutexLock lock(&mu_);
    results_.resize(stages);
  }
}

absl::StatusOr<std::unique_ptr<StageGroup>> StageGroup::Launch(StageLaunch launch,
                                                               std::vector<StageConfig> configs,
                                                               std::vector<StageLinks> links,
                                                               const StageMain& stage_main) {
  const int stages = static_cast<int>(links.size());
  std::unique_ptr<StageGroup> group(new StageGroup(launch, stages));
  if (launch == StageLaunch::kThreads) {
    for (int s = 0; s < stages; ++s) {
      group->threads_.emplace_back([g = group.get(), s, &stage_main, config = configs[s],
                                    l = std::move(links[s])]() mutable {
        absl::Status status = RunStageMain(stage_main, std::move(config), l);
        // Close the stage's sockets before reporting done, as a process exit would.
        l = StageLinks();
        absl::MutexLock lock(&g->mu_);
        g->results_[s] = {true, std::move(status)};
      });
    }
    return group;
  }

  // Buffered output would otherwise be flushed once by every child too.
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  for (int s = 0; s < stages; ++s) {
    const pid_t pid = ::fork();
    if (pid < 0) return ErrnoStatus(absl::StrCat("fork stage ", s));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(127);  // the coordinator died before prctl
      StageLinks& mine = links[s];
      CloseAllExcept(
          {0, 1, 2, mine.control.get(), mine.prev.get(), mine.next.get(), mine.tied.get()});
      // The other stages' ends were closed above; forget them without closing again.
      for (int other = 0; other < stages; ++other) {
        if (other == s) continue;
        links[other].control.Release();
        links[other].prev.Release();
        links[other].next.Release();
        links[other].tied.Release();
      }
      absl::Status status = RunStageMain(stage_main, std::move(configs[s]), mine);
      std::fflush(stdout);
      std::fflush(stderr);
      // _exit: the parent's atexit handlers and static destructors are not this stage's.
      _exit(status.ok() ? 0 : 1);
    }
    Child& child = group->children_[s];
    child.pid = pid;
    const long pidfd = ::syscall(SYS_pidfd_open, pid, 0);
    if (pidfd >= 0) child.pidfd.Reset(static_cast<int>(pidfd));
  }
  return group;  // `links` goes out of scope: the parent closes its copies of the stages' ends
}

StageGroup::~StageGroup() {
  if (launch_ == StageLaunch::kProcesses) {
    KillRemaining();
    Wait(absl::InfiniteFuture());
  } else {
    for (std::thread& t : threads_) t.join();
  }
}

bool StageGroup::Wait(absl::Time deadline) {
  return launch_ == StageLaunch::kProcesses ? WaitProcesses(deadline) : WaitThreads(deadline);
}

bool StageGroup::WaitProcesses(absl::Time deadline) {
  while (true) {
    std::vector<pollfd> fds;
    bool all = true, polling = false;
    for (Child& child : children_) {
      if (child.reaped) continue;
      int status = 0;
      const pid_t r = ::waitpid(child.pid, &status, WNOHANG);
      if (r == child.pid || (r < 0 && errno == ECHILD)) {
        child.reaped = true;
        child.wait_status = status;
        child.pidfd.Reset();
        continue;
      }
      all = false;
      if (child.pidfd.valid()) {
        fds.push_back({child.pidfd.get(), POLLIN, 0});
      } else {
        polling = true;
      }
    }
    if (all) return true;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    // A pidfd becomes readable when its process exits; without pidfds, poll waitpid at 1 ms.
    int timeout_ms = left == absl::InfiniteDuration()
                         ? -1
                         : static_cast<int>(absl::ToInt64Milliseconds(left) + 1);
    if (polling) timeout_ms = 1;
    ::poll(fds.data(), fds.size(), timeout_ms);
  }
}

bool StageGroup::WaitThreads(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::all_of(results_.begin(), results_.end(),
                       [](const ThreadResult& r) { return r.done; });
  };
  return mu_.AwaitWithDeadline(absl::Condition(&all_done), deadline);
}

void StageGroup::KillRemaining() {
  for (Child& child : children_) {
    if (child.reaped) continue;
    int status = 0;
    if (::waitpid(child.pid, &status, WNOHANG) == child.pid) {
      child.reaped = true;
      child.wait_status = status;
      continue;
    }
    child.killed_by_us = true;
    ::kill(child.pid, SIGKILL);
  }
}

bool StageGroup::Ended(int stage) const {
  if (launch_ == StageLaunch::kProcesses) return children_[stage].reaped;
  absl::MutexLock lock(&mu_);
  return results_[stage].done;
}

bool StageGroup::Crashed(int stage) const {
  if (launch_ == StageLaunch::kThreads) return false;
  const Child& child = children_[stage];
  return child.reaped && !child.killed_by_us && WIFSIGNALED(child.wait_status);
}

bool StageGroup::EndedCleanly(int stage) const {
  if (launch_ == StageLaunch::kProcesses) {
    const Child& child = children_[stage];
    return child.reaped && WIFEXITED(child.wait_status) && WEXITSTATUS(child.wait_status) == 0;
  }
  absl::MutexLock lock(&mu_);
  return results_[stage].done && results_[stage].status.ok();
}

std::string StageGroup::Name(int stage) const {
  if (launch_ == StageLaunch::kProcesses) {
    return absl::StrCat("stage ", stage, " (pid ", children_[stage].pid, ")");
  }
  return absl::StrCat("stage ", stage, " (thread)");
}

std::string StageGroup::Outcome(int stage) const {
  if (launch_ == StageLaunch::kProcesses) {
    const Child& child = children_[stage];
    if (!child.reaped) return "still running";
    std::string how = DescribeWaitStatus(child.wait_status);
    if (child.killed_by_us) absl::StrAppend(&how, " by the coordinator");
    return how;
  }
  absl::MutexLock lock(&mu_);
  if (!results_[stage].done) return "still running";
  return results_[stage].status.ok() ? "ended" : results_[stage].status.ToString();
}

}  // namespace pswitch::pipeline::internal
