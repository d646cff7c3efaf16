#include "gpu/device.h"

#include <time.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "gpu/host/compute_lock.h"
#include "gpu/host/host_device.h"
#include "gpu/internal/job_ticket.h"
#include "base/status.h"
#ifdef PSWITCH_WITH_CUDA
#include "gpu/cuda/cuda_device.h"
#endif

namespace pswitch::gpu {

absl::string_view BackendName(Backend backend) {
  return backend == Backend::kCuda ? "cuda" : "host";
}

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  if (name == "host") return Backend::kHost;
  if (name == "cuda") return Backend::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", name, "' (expected 'host' or 'cuda')"));
}

bool CudaBackendBuilt() {
#ifdef PSWITCH_WITH_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Device>> Device::Open(const DeviceOptions& options) {
  if (options.backend == Backend::kHost) return OpenHostDevice(options);
#ifdef PSWITCH_WITH_CUDA
  return OpenCudaDevice(options);
#else
  return absl::FailedPreconditionError(
      "this pswitch build has no CUDA backend (configure with -DPSWITCH_CUDA=ON)");
#endif
}

std::string HostComputeLockPath(int index) { return ComputeLock::DefaultPath(index); }

absl::Status FlagArray::WaitReady(uint32_t index, uint32_t epoch, absl::Duration timeout) const {
  absl::StatusOr<uint32_t> seen = WaitAtLeast(index, epoch, timeout);
  if (!seen.ok()) return seen.status();
  if (*seen != epoch) {
    return absl::AbortedError(
        absl::StrCat("flag ", index, ": switch epoch ", epoch, " was superseded by epoch ", *seen));
  }
  return absl::OkStatus();
}

absl::Status CheckGroupsHoldEpoch(const FlagArray& flags, uint32_t base, uint32_t groups,
                                  uint32_t epoch) {
  for (uint32_t g = 0; g < groups; ++g) {
    PSWITCH_ASSIGN_OR_RETURN(uint32_t seen, flags.Load(base + g));
    if (seen != epoch) {
      return absl::AbortedError(absl::StrCat(
          "group ", g, " of the model holds epoch ", seen, ", not ", epoch,
          ": its transmission did not complete, so the task's result is discarded"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckArenaRange(uint64_t offset, uint64_t bytes, uint64_t arena_bytes) {
  if (offset > arena_bytes || bytes > arena_bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat("range [", offset, ", +", bytes, ") outside the ",
                                              arena_bytes, "-byte arena"));
  }
  return absl::OkStatus();
}

absl::Status Arena::RestrictAccess() {
  return absl::FailedPreconditionError("this arena cannot restrict a process's access to it");
}

absl::Status Arena::SetAccess(uint64_t, uint64_t, Access) {
  return absl::FailedPreconditionError("this arena cannot restrict a process's access to it");
}

absl::StatusOr<std::vector<UniqueFd>> Arena::ExportChunks(uint64_t, uint64_t) const {
  return absl::UnimplementedError("this arena is not made of chunks");
}

absl::StatusOr<Arena::Access> Arena::AccessAt(uint64_t) const {
  return absl::UnimplementedError("this arena cannot report its access");
}

absl::Status Arena::CheckRange(uint64_t offset, uint64_t bytes) const {
  return CheckArenaRange(offset, bytes, size_bytes());
}

absl::Status Arena::CheckFlagPlacement(uint64_t offset, uint32_t count) const {
  if (offset % alignof(uint32_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("flag offset ", offset, " not 4-aligned"));
  }
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, uint64_t{count} * sizeof(uint32_t)));
  return CheckArenaRange(offset, uint64_t{count} * sizeof(uint32_t),
                         std::min(size_bytes(), kFlagWindowBytes));
}

absl::Status ValidateCopyJob(const CopyJob& job, uint64_t arena_bytes) {
  if (job.ready_flags == nullptr) return absl::InvalidArgumentError("copy job without ready flags");
  if (job.epoch == 0) return absl::InvalidArgumentError("copy job epoch 0 is reserved");
  if (job.groups.size() > job.ready_flags->size() ||
      job.ready_flag_base > job.ready_flags->size() - job.groups.size()) {
    return absl::OutOfRangeError(absl::StrCat("copy job needs ready flags [", job.ready_flag_base,
                                              ", ", job.ready_flag_base + job.groups.size(),
                                              ") but the array has ", job.ready_flags->size()));
  }
  if (job.drain_flags != nullptr && job.drain_index >= job.drain_flags->size()) {
    return absl::OutOfRangeError(absl::StrCat("drain flag ", job.drain_index, " out of range"));
  }
  for (size_t g = 0; g < job.groups.size(); ++g) {
    for (const CopySpan& span : job.groups[g].spans) {
      if (span.bytes > 0 && span.host == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("group ", g, ": null host pointer"));
      }
      if (span.arena_offset > arena_bytes || span.bytes > arena_bytes - span.arena_offset) {
        return absl::OutOfRangeError(absl::StrCat("group ", g, ": span [", span.arena_offset, ", +",
                                                  span.bytes, ") outside the ", arena_bytes,
                                                  "-byte arena"));
      }
    }
  }
  return absl::OkStatus();
}

namespace internal {

absl::StatusOr<std::vector<GroupTiming>> JobTicket::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&finished_), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("copy job still running after ",
                                                    absl::FormatDuration(timeout), " (",
                                                    groups_done(), " groups done)"));
  }
  if (!status_.ok()) return status_;
  return timings_;
}

bool JobTicket::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

void JobTicket::RecordGroup(size_t group, const GroupTiming& timing) {
  {
    absl::MutexLock lock(&mu_);
    timings_[group] = timing;
  }
  groups_done_.store(group + 1, std::memory_order_release);
}

void JobTicket::Stall(const absl::Status& status) {
  if (stalled_.exchange(true, std::memory_order_acq_rel)) return;
  // Dropped after the call, as on_finished: what it captured must not live as long as the ticket.
  if (std::function<void(const absl::Status&)> stalled = std::move(on_stalled_)) stalled(status);
}

void JobTicket::Finish(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    finished_ = true;
  }
  // Outside the lock (the callback may look at this ticket), and dropped after: what it captured
  // must not live as long as the ticket.
  if (std::function<void()> done = std::move(on_finished_)) done();
}

}  // namespace internal
}  // namespace pswitch::gpu
