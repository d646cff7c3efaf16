// The running stages of one pipeline, as child processes or threads, and how each one ended.
//
// Process mode forks without exec: the child is this program, so the stage body can be any
// function. Each child asks for SIGKILL when the coordinator dies (PR_SET_PDEATHSIG) and closes
// every descriptor but stdio and its own links, so a dead stage's sockets reach end-of-file at
// its neighbours instead of staying open in a sibling. The destructor kills and reaps whatever
// is still running, so no child outlives the group.
//
// Thread-compatible: one coordinator thread uses a group.
#ifndef PSWITCH_PIPELINE_INTERNAL_STAGE_GROUP_H_
#define PSWITCH_PIPELINE_INTERNAL_STAGE_GROUP_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pipeline/coordinator.h"
#include "base/unique_fd.h"

namespace pswitch::pipeline::internal {

class StageGroup {
 public:
  // Starts stage s with configs[s] and links[s] (moved in; this process keeps no copy of them).
  // `stage_main` must stay valid while the group lives (threads call it).
  static absl::StatusOr<std::unique_ptr<StageGroup>> Launch(StageLaunch launch,
                                                            std::vector<StageConfig> configs,
                                                            std::vector<StageLinks> links,
                                                            const StageMain& stage_main);
  ~StageGroup();
  StageGroup(const StageGroup&) = delete;
  StageGroup& operator=(const StageGroup&) = delete;

  // Collects stages that have ended, waiting until all have or `deadline` passes. True when all
  // have ended.
  bool Wait(absl::Time deadline);
  // SIGKILLs every stage process still running (threads cannot be killed: they end through
  // their closed sockets and receive timeouts).
  void KillRemaining();

  bool Ended(int stage) const;
  // True when the stage ended abnormally on its own: a signal this group did not send, or a
  // nonzero exit without an error report (the caller knows whether it got one).
  bool Crashed(int stage) const;
  // "stage 2 (pid 123)" or "stage 2 (thread)".
  std::string Name(int stage) const;
  // "exited with status 1", "killed by signal 11 (Segmentation fault)", a thread's error, or
  // "still running".
  std::string Outcome(int stage) const;
  // True when the stage ended with exit status 0 (or OK, for a thread).
  bool EndedCleanly(int stage) const;

 private:
  struct Child {
    pid_t pid = -1;
    UniqueFd pidfd;  // invalid where pidfd_open is unavailable; then Wait polls
    bool reaped = false;
    bool killed_by_us = false;
    int wait_status = 0;
  };
  struct ThreadResult {
    bool done = false;
    absl::Status status;
  };

  explicit StageGroup(StageLaunch launch, int stages);
  bool WaitProcesses(absl::Time deadline);
  bool WaitThreads(absl::Time deadline);

  const StageLaunch launch_;
  std::vector<Child> children_;       // process mode
  std::vector<std::thread> threads_;  // thread mode

  mutable absl::Mutex mu_;
  std::vector<ThreadResult> results_ ABSL_GUARDED_BY(mu_);  // thread mode
};

// Runs `stage_main` for one stage, turning an exception into Internal and sending any error to
// the coordinator over links.control before returning it.
absl::Status RunStageMain(const StageMain& stage_main, StageConfig config, StageLinks& links);

}  // namespace pswitch::pipeline::internal

#endif  // PSWITCH_PIPELINE_INTERNAL_STAGE_GROUP_H_
