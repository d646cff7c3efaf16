// Starting a helper process from a multi-threaded daemon: fork + exec with nothing but stdio
// and the fds named inherited, killed with its parent (PR_SET_PDEATHSIG), optionally under an
// address-space limit. The child runs only async-signal-safe code before exec. RunBoundedChild
// runs such a helper to its end within time, memory and output bounds.
#ifndef PSWITCH_BASE_CHILD_PROCESS_H_
#define PSWITCH_BASE_CHILD_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mapped_file.h"
#include "base/unique_fd.h"

namespace pswitch::base {

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0]: the binary's path
  std::vector<int> inherit_fds;   // kept open across exec at their numbers (negative: ignored)
  int stdout_fd = -1;             // becomes the child's stdout (-1: this process's)
  uint64_t address_space_bytes = 0;  // RLIMIT_AS; 0: none (CUDA reserves far more than it uses)
  // "NAME=VALUE" entries set in the child's environment (replacing this process's values); the
  // rest of the environment is inherited.
  std::vector<std::string> env;
  // Added to the child's nice value (0: this process's): background work that must yield the
  // CPU to the tasks being served.
  int nice = 0;
};

// The child's pid once it has exec'd (it must be reaped, waitpid, by the caller); an error naming
// errno when the exec failed (the child is reaped then).
absl::StatusOr<pid_t> SpawnChild(const ChildSpec& spec);

// The environment entries that hold a child's compute libraries (OpenMP, OpenBLAS, MKL) to
// `threads` threads each, for ChildSpec::env; none for 0 (the libraries' defaults: every core).
std::vector<std::string> CpuThreadsEnv(int threads);

// "exited with status N" / "killed by signal N (name)", from a waitpid status.
std::string DescribeExit(int wait_status);

// A helper run to its end under bounds, its stdout a memory file read back afterwards.
struct BoundedChildSpec {
  std::vector<std::string> argv;
  std::vector<int> inherit_fds;
  std::vector<std::string> env;        // as ChildSpec::env
  int nice = 0;                        // as ChildSpec::nice
  uint64_t memory_bytes = 4ull << 30;  // resident memory, sampled every 10 ms: beyond it, killed
  absl::Duration timeout = absl::Minutes(2);
  uint64_t max_output_bytes = 16 << 20;  // stdout beyond it: killed
  std::string what;                      // "profiling 'x' at batch 2", for messages
  std::string memory_hint;               // appended to the ResourceExhausted message
  std::string timeout_hint;              // appended to the DeadlineExceeded message
  // Large output: sealed and mapped once the child has exited, not copied (falls back to a copy
  // when something the child left behind holds a mapping of it, or it was sealed already).
  bool map_output = false;
  // Called at every sample while Wait waits and once after the child exited (optional): e.g. to
  // read the child's progress. It must not block: the bounds are checked between its calls.
  std::function<void()> on_sample;
};

struct BoundedChildResult {
  int wait_status = 0;
  // Its stdout (untrusted): mapped when asked for and possible, else copied into `output`.
  std::string output;
  std::shared_ptr<const MappedFile> mapped_output;
  absl::string_view bytes() const {
    return mapped_output != nullptr ? mapped_output->bytes() : absl::string_view(output);
  }
};

// A bounded helper started now and held to its bounds once waited for: a standby started ahead
// of its work (it loads its libraries meanwhile) and given that work later, e.g. on a socket.
// Destroying it kills and reaps the child if it has not been reaped.
class BoundedChild {
 public:
  // Starts spec.argv (with spec.inherit_fds and spec.env), its stdout a fresh memory file.
  static absl::StatusOr<BoundedChild> Start(const BoundedChildSpec& spec);
  BoundedChild(BoundedChild&& other) noexcept;
  BoundedChild& operator=(BoundedChild&&) = delete;
  BoundedChild(const BoundedChild&) = delete;
  ~BoundedChild();

  pid_t pid() const { return pid_; }
  // False once it has exited (reaped here; Wait then returns how it ended).
  bool Running();
  // Runs it until it exits under spec's bounds (memory, output, and the timeout counted from
  // now) and returns what it wrote to stdout. The child is killed and reaped on every error:
  // ResourceExhausted past the memory bound, DeadlineExceeded past the timeout,
  // ResourceExhausted for output past its bound. Once only.
  absl::StatusOr<BoundedChildResult> Wait(const BoundedChildSpec& spec);

 private:
  BoundedChild(pid_t pid, UniqueFd out) : pid_(pid), out_(std::move(out)) {}
  void Kill();

  pid_t pid_ = -1;  // -1: reaped, or moved from
  UniqueFd out_;
  bool exited_ = false;
  int wait_status_ = 0;
};

// Starts the child and waits for it (BoundedChild::Start, then Wait).
absl::StatusOr<BoundedChildResult> RunBoundedChild(const BoundedChildSpec& spec);

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_CHILD_PROCESS_H_
