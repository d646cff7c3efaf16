#include "registry/profile_process.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/child_process.h"
#include "base/status.h"

namespace pswitch::registry {
namespace {

constexpr uint64_t kMaxProfileJsonBytes = 16 << 20;
// Exit status of an inspection that refused the archive (tools/pswitch_worker.cc).
constexpr int kRefused = 3;

uint64_t FileBytes(int fd) {
  struct stat st {};
  return fd >= 0 && ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace

absl::StatusOr<grouping::Profile> ProfileInChild(const ProfileChildOptions& options,
                                                 const std::string& zoo, uint32_t batch,
                                                 int archive_fd) {
  const std::string what = absl::StrCat("profiling '", zoo, "' at batch ", batch);
  PSWITCH_ASSIGN_OR_RETURN(
      base::BoundedChildResult run,
      base::RunBoundedChild(
          {.argv = {options.binary, absl::StrCat("--profile_model=", zoo),
                    absl::StrCat("--profile_batch=", batch),
                    absl::StrCat("--profile_device=", options.device),
                    absl::StrCat("--profile_bandwidth=", options.bandwidth_bytes_per_s),
                    absl::StrCat("--profile_archive_fd=", archive_fd)},
           .inherit_fds = {archive_fd},
           .memory_bytes = options.memory_bytes,
           .timeout = options.timeout,
           .max_output_bytes = kMaxProfileJsonBytes,
           .what = what,
           .memory_hint = " (--profile-memory-bytes); register with a smaller batch or a plan",
           .timeout_hint = "; register with a find-grouping plan, or a smaller batch"}));
  if (!WIFEXITED(run.wait_status) || WEXITSTATUS(run.wait_status) != 0) {
    return absl::InternalError(absl::StrCat(what, " failed: the profiler ",
                                            base::DescribeExit(run.wait_status),
                                            " (see pswitchd's log)"));
  }
  absl::StatusOr<grouping::Profile> profile = grouping::ParseProfileJson(run.output);
  if (!profile.ok()) {
    return absl::InternalError(
        absl::StrCat(what, ": the profiler's output is not a profile: ", profile.status().message()));
  }
  return profile;
}

absl::StatusOr<models::ModelFacts> InspectInChild(const ProfileChildOptions& options,
                                                  const std::string& name, int archive_fd,
                                                  int weights_fd, const std::string& weights_name,
                                                  uint64_t max_facts_bytes) {
  const std::string what = absl::StrCat("checking the archive of '", name, "'");
  std::vector<std::string> argv = {options.binary, absl::StrCat("--inspect_name=", name),
                                   absl::StrCat("--inspect_archive_fd=", archive_fd)};
  if (weights_fd >= 0) {
    argv.push_back(absl::StrCat("--inspect_weights_fd=", weights_fd));
    argv.push_back(absl::StrCat("--inspect_weights_name=", weights_name));
  }
  PSWITCH_ASSIGN_OR_RETURN(
      base::BoundedChildResult run,
      base::RunBoundedChild(
          {.argv = std::move(argv),
           .inherit_fds = {archive_fd, weights_fd},
           .memory_bytes = options.memory_bytes + 4 * FileBytes(archive_fd) + FileBytes(weights_fd),
           .timeout = options.timeout,
           .max_output_bytes = max_facts_bytes,
           .what = what,
           .memory_hint = " (--profile-memory-bytes plus four times the archive's size)",
           .timeout_hint = " (--profile-timeout-s)"}));
  if (WIFEXITED(run.wait_status) && WEXITSTATUS(run.wait_status) == kRefused) {
    return models::DecodeRefusal(run.output, what);
  }
  if (!WIFEXITED(run.wait_status) || WEXITSTATUS(run.wait_status) != 0) {
    // Most likely the archive itself: a crafted file can crash libtorch's loader.
    return absl::InvalidArgumentError(
        absl::StrCat(what, " failed: the checker ", base::DescribeExit(run.wait_status),
                     " (see pswitchd's log); the archive is damaged or not a pswitch.export "
                     "archive"));
  }
  return models::DecodeModelFacts(std::move(run.output), what);
}

}  // namespace pswitch::registry
