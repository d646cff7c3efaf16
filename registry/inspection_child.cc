#include "registry/inspection_child.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/child_process.h"
#include "base/log.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "models/inspection_wire.h"

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
  InspectionChildOptions once = options;
  once.standby = false;
  return Inspector(std::move(once)).Inspect(request);
}

struct Inspector::Child {
  base::BoundedChild process;
  UniqueFd requests;  // our end of the child's request socket
};

Inspector::Inspector(InspectionChildOptions options) : options_(std::move(options)) { Replenish(); }

Inspector::~Inspector() = default;

uint64_t Inspector::standby_used() const {
  absl::MutexLock lock(&mu_);
  return standby_used_;
}

pid_t Inspector::standby_pid() const {
  absl::MutexLock lock(&mu_);
  return standby_ != nullptr ? standby_->process.pid() : 0;
}

absl::StatusOr<std::unique_ptr<Inspector::Child>> Inspector::StartChild(bool standby) const {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return ErrnoStatus("socketpair for an inspector");
  }
  UniqueFd ours(pair[0]);
  const UniqueFd theirs(pair[1]);  // the child's once started; closed here after
  PSWITCH_ASSIGN_OR_RETURN(
      base::BoundedChild process,
      base::BoundedChild::Start(
          {.argv = {options_.binary, absl::StrCat("--inspect_request_fd=", theirs.get()),
                    absl::StrCat("--profile_device=", options_.auto_plan.device),
                    absl::StrCat("--profile_bandwidth=", options_.auto_plan.bandwidth_bytes_per_s),
                    // Only a standby has time to prepare: a child started for a waiting
                    // request would only delay it (and hold a device context it may not need).
                    absl::StrCat("--inspect_prepare=", standby)},
           .inherit_fds = {theirs.get()},
           .env = base::CpuThreadsEnv(options_.cpu_threads),
           // Registration is background work: under contention its inspector (a standby loading
           // libtorch, a CPU profile) yields the cores to the tasks being served.
           .nice = kInspectorNice,
           // The facts hold the weights: decoded where the child wrote them, not copied.
           .map_output = true}));
  return std::make_unique<Child>(Child{std::move(process), std::move(ours)});
}

absl::StatusOr<std::unique_ptr<Inspector::Child>> Inspector::TakeChild() {
  {
    absl::MutexLock lock(&mu_);
    if (standby_ != nullptr && standby_->process.Running()) {
      ++standby_used_;
      return std::move(standby_);
    }
    standby_.reset();  // died while it waited (reaped): a fresh one below
  }
  return StartChild(/*standby=*/false);
}

void Inspector::Replenish() {
  if (!options_.standby) return;
  {
    absl::MutexLock lock(&mu_);
    if (standby_ != nullptr) return;
  }
  absl::StatusOr<std::unique_ptr<Child>> child = StartChild(/*standby=*/true);
  if (!child.ok()) {
    // The next inspection starts its own and reports why it cannot.
    base::Log(base::LogLevel::kWarn, "inspector_standby_failed").Field("error", child.status());
    return;
  }
  absl::MutexLock lock(&mu_);
  if (standby_ == nullptr) standby_ = std::move(*child);
}

absl::StatusOr<Inspector::Attempt> Inspector::TryOnce(const InspectionRequest& request,
                                                      base::BoundedChildSpec bounds, bool standby) {
  std::unique_ptr<Child> child;
  if (standby) {
    PSWITCH_ASSIGN_OR_RETURN(child, TakeChild());
  } else {
    PSWITCH_ASSIGN_OR_RETURN(child, StartChild(/*standby=*/false));
  }
  const absl::Status sent = models::SendInspectionRequest(child->requests.get(), request);
  // A child that has gone already (FailedPrecondition) never took the request: said below.
  if (!sent.ok() && !absl::IsFailedPrecondition(sent)) {
    return absl::Status(sent.code(),
                        absl::StrCat(bounds.what, ": sending the request: ", sent.message()));
  }
  // Its reports come back on the same socket while it works, read at every sample. The first
  // (the build step) says it took the request. A hostile child could send reports without end:
  // a real inspection makes a few dozen, so past kMaxReports they are dropped.
  Attempt attempt;
  bounds.on_sample = [fd = child->requests.get(), &request, &attempt] {
    models::DrainInspectionProgress(fd, [&](const models::InspectionProgress& p) {
      if (++attempt.reports > kMaxReports || !request.on_progress) return;
      request.on_progress(p);
    });
  };
  PSWITCH_ASSIGN_OR_RETURN(attempt.run, child->process.Wait(bounds));
  return attempt;
}

absl::StatusOr<models::ModelFacts> Inspector::Inspect(const InspectionRequest& request) {
  const std::string what =
      request.zoo.empty() ? absl::StrCat("checking the archive of '", request.name, "'")
                          : absl::StrCat("inspecting '", request.name, "' (", request.zoo, ")");
  const std::string profiling =
      request.profile_batch > 0 ? "; register with a find-grouping plan, or a smaller batch" : "";
  const base::BoundedChildSpec bounds{
      .memory_bytes =
          options_.memory_bytes + 4 * FileBytes(request.archive_fd) + FileBytes(request.weights_fd),
      .timeout = options_.timeout,
      .max_output_bytes = request.max_facts_bytes,
      .what = what,
      .memory_hint =
          absl::StrCat(request.zoo.empty() ? " (--profile-memory-bytes plus four times the "
                                             "archive's size and the checkpoint's)"
                                           : " (--profile-memory-bytes plus the checkpoint's size)",
                       profiling),
      .timeout_hint = absl::StrCat(" (--profile-timeout-s)", profiling),
      .map_output = true};
  // The next standby starts however this inspection ends, once it has (so that the two do not
  // share the cores while this one runs; the registration's later phases still do).
  absl::Cleanup replenish = [this] { Replenish(); };
  PSWITCH_ASSIGN_OR_RETURN(Attempt attempt, TryOnce(request, bounds, options_.standby));
  if (attempt.reports == 0) {
    // It ended before it took the request (a standby that died as it was taken, a child that
    // failed while loading its libraries): the inspector's failure, not the model's. Once more,
    // with a child started for it.
    PSWITCH_ASSIGN_OR_RETURN(attempt, TryOnce(request, bounds, /*standby=*/false));
    if (attempt.reports == 0) {
      return absl::InternalError(absl::StrCat(what, " failed: the inspector ",
                                              base::DescribeExit(attempt.run.wait_status),
                                              " before it took the request (see pswitchd's log)"));
    }
  }
  base::BoundedChildResult& run = attempt.run;
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
