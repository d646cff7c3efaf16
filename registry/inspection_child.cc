#include "registry/inspection_child.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/child_process.h"
#include "base/status.h"

namespace pswitch::registry {
namespace {

// Exit status of an inspection that refused the model (tools/pswitch_worker.cc).
constexpr int kRefused = 3;

uint64_t FileBytes(int fd) {
  struct stat st {};
  return fd >= 0 && ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace

absl::StatusOr<models::ModelFacts> InspectInChild(const InspectionChildOptions& options,
                                                  const InspectionRequest& request) {
  const std::string what =
      request.zoo.empty() ? absl::StrCat("checking the archive of '", request.name, "'")
                          : absl::StrCat("inspecting '", request.name, "' (", request.zoo, ")");
  std::vector<std::string> argv = {options.binary, absl::StrCat("--inspect_name=", request.name)};
  if (request.zoo.empty()) {
    argv.push_back(absl::StrCat("--inspect_archive_fd=", request.archive_fd));
  } else {
    argv.push_back(absl::StrCat("--inspect_zoo=", request.zoo));
  }
  if (!request.dtype.empty()) argv.push_back(absl::StrCat("--inspect_dtype=", request.dtype));
  if (request.weights_fd >= 0) {
    argv.push_back(absl::StrCat("--inspect_weights_fd=", request.weights_fd));
    argv.push_back(absl::StrCat("--inspect_weights_name=", request.weights_name));
  }
  if (request.profile_batch > 0) {
    argv.push_back(absl::StrCat("--inspect_profile_batch=", request.profile_batch));
    argv.push_back(absl::StrCat("--profile_device=", options.auto_plan.device));
    argv.push_back(absl::StrCat("--profile_bandwidth=", options.auto_plan.bandwidth_bytes_per_s));
  }
  const std::string profiling =
      request.profile_batch > 0 ? "; register with a find-grouping plan, or a smaller batch" : "";
  PSWITCH_ASSIGN_OR_RETURN(
      base::BoundedChildResult run,
      base::RunBoundedChild(
          {.argv = std::move(argv),
           .inherit_fds = {request.archive_fd, request.weights_fd},
           .env = base::CpuThreadsEnv(options.cpu_threads),
           .memory_bytes = options.memory_bytes + 4 * FileBytes(request.archive_fd) +
                           FileBytes(request.weights_fd),
           .timeout = options.timeout,
           .max_output_bytes = request.max_facts_bytes,
           .what = what,
           .memory_hint = absl::StrCat(request.zoo.empty()
                                           ? " (--profile-memory-bytes plus four times the "
                                             "archive's size and the checkpoint's)"
                                           : " (--profile-memory-bytes plus the checkpoint's size)",
                                       profiling),
           .timeout_hint = absl::StrCat(" (--profile-timeout-s)", profiling),
           // The facts hold the weights: decoded where the child wrote them, not copied.
           .map_output = true}));
  if (WIFEXITED(run.wait_status) && WEXITSTATUS(run.wait_status) == kRefused) {
    return models::DecodeRefusal(run.bytes(), what);
  }
  if (!WIFEXITED(run.wait_status) || WEXITSTATUS(run.wait_status) != 0) {
    const std::string how =
        absl::StrCat(what, " failed: the inspector ", base::DescribeExit(run.wait_status),
                     " (see pswitchd's log)");
    // For an archive, most likely the archive itself: a crafted file can crash libtorch's
    // loader. A zoo model's build is pswitchd's own: its crash is not the client's fault.
    if (!request.zoo.empty()) return absl::InternalError(how);
    return absl::InvalidArgumentError(
        absl::StrCat(how, "; the archive is damaged or not a pswitch.export archive"));
  }
  if (run.mapped_output != nullptr) {
    const absl::string_view bytes = run.mapped_output->bytes();
    return models::DecodeModelFacts(std::move(run.mapped_output), bytes, what);
  }
  return models::DecodeModelFacts(std::move(run.output), what);
}

}  // namespace pswitch::registry
