#include "gpu/host/host_copy_engine.h"

#include <time.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/status.h"

namespace pswitch::gpu::host {
namespace {

// Chunk size bounds both pacing granularity and how quickly a cancel takes effect.
constexpr uint64_t kChunkBytes = 1 << 20;

void SleepUntilNs(int64_t deadline_ns) {
  timespec ts{static_cast<time_t>(deadline_ns / 1'000'000'000),
              static_cast<long>(deadline_ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

}  // namespace

HostCopyEngine::HostCopyEngine(HostArena* arena, double bandwidth_bytes_per_s)
    : arena_(arena), bandwidth_bytes_per_s_(bandwidth_bytes_per_s), thread_([this] { Run(); }) {}

HostCopyEngine::~HostCopyEngine() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (Queued& q : queue_) q.ticket->Cancel();
  }
  thread_.join();
}

absl::StatusOr<std::shared_ptr<CopyTicket>> HostCopyEngine::Submit(CopyJob job) {
  PSWITCH_RETURN_IF_ERROR(ValidateCopyJob(job, arena_->size_bytes()));
  auto ticket = std::make_shared<internal::JobTicket>(job.groups.size(), std::move(job.on_finished),
                                                      std::move(job.on_stalled));
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::CancelledError("copy engine is shutting down");
  queue_.push_back(Queued{std::move(job), ticket});
  return ticket;
}

void HostCopyEngine::Run() {
  while (true) {
    Queued next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    next.ticket->Finish(Execute(next.job, *next.ticket));
  }
}

absl::Status HostCopyEngine::Execute(const CopyJob& job, internal::JobTicket& ticket) {
  if (ticket.cancelled()) return absl::CancelledError("copy job cancelled before it started");
  if (job.drain_flags != nullptr) {
    absl::StatusOr<uint32_t> drained =
        job.drain_flags->WaitAtLeast(job.drain_index, job.drain_value, job.drain_timeout);
    if (!drained.ok()) {
      return absl::Status(drained.status().code(), absl::StrCat("previous tenant did not drain: ",
                                                                drained.status().message()));
    }
  }
  const int64_t job_start_ns = base::MonotonicNowNs();
  uint64_t job_bytes = 0;
  for (size_t g = 0; g < job.groups.size(); ++g) {
    GroupTiming timing;
    timing.copy_start_ns = base::MonotonicNowNs();
    for (const CopySpan& span : job.groups[g].spans) {
      for (uint64_t done = 0; done < span.bytes;) {
        if (ticket.cancelled()) {
          return absl::CancelledError(absl::StrCat("copy job cancelled in group ", g));
        }
        uint64_t n = std::min(kChunkBytes, span.bytes - done);
        std::memcpy(arena_->base() + span.arena_offset + done, span.host + done, n);
        done += n;
        job_bytes += n;
        if (bandwidth_bytes_per_s_ > 0) {
          // Pace against the job's start, so per-chunk rounding never accumulates.
          SleepUntilNs(job_start_ns + static_cast<int64_t>(static_cast<double>(job_bytes) * 1e9 /
                                                           bandwidth_bytes_per_s_));
        }
      }
      timing.bytes += span.bytes;
    }
    // Read before the store: a consumer woken by it must never appear to start before "ready".
    timing.ready_ns = base::MonotonicNowNs();
    PSWITCH_RETURN_IF_ERROR(job.ready_flags->Store(job.ready_flag_base + g, job.epoch));
    ticket.RecordGroup(g, timing);
  }
  return absl::OkStatus();
}

}  // namespace pswitch::gpu::host
