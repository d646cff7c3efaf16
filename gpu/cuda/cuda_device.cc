#include "gpu/cuda/cuda_device.h"

#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "base/nvtx.h"
#include "base/status.h"
#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/cuda_memory.h"
#include "gpu/event_timeline.h"
#include "gpu/internal/job_ticket.h"
#include "gpu/timer_slack.h"

namespace pswitch::gpu::cuda {
namespace {

// Bytes on the copy stream ahead of the last group the CPU saw complete: at 50 GB/s, about
// 1.3 ms of copying, far more than the CPU's polling lag, so the stream never runs dry; and a
// cancel stops the transfer within about that much.
constexpr uint64_t kLookaheadBytes = 64ull << 20;
// Between two looks at the oldest in-flight group: short, so a group's completion is seen
// within a few microseconds; the CPU only observes, it never gates the copies.
constexpr absl::Duration kPollInterval = absl::Microseconds(5);
// Events are made once and reused (creating one costs microseconds on the switch path).
constexpr size_t kInitialEvents = 1024;
// How long a failed job's queued work may take to leave the stream (its owner kills the tenant
// that never drained, which releases the drain wait it is stuck on) before the engine declares
// the device lost.
constexpr absl::Duration kSettleTimeout = absl::Seconds(30);
constexpr absl::Duration kSettlePollInterval = absl::Microseconds(200);

// RAII for the engine's timing events.
class EventPool {
 public:
  EventPool() = default;
  EventPool(EventPool&& other) noexcept : events_(std::move(other.events_)) {}
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }
  // At least `count` events.
  absl::Status Reserve(size_t count) {
    while (events_.size() < count) {
      cudaEvent_t e = nullptr;
      PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventCreate(&e)));
      events_.push_back(e);
    }
    return absl::OkStatus();
  }
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

// Enqueues each group's copies on a dedicated stream followed by a device-side write of the
// group's ready flag. The CPU keeps a byte-bounded window of groups on the stream and observes
// completion through events to time them; it never waits for a group before enqueueing the next
// one inside the window.
class CudaCopyEngine : public CopyEngine {
 public:
  CudaCopyEngine(int device, CudaArena* arena, std::unique_ptr<CudaStream> stream,
                 EventPool events)
      : device_(device),
        arena_(arena),
        stream_(std::move(stream)),
        events_(std::move(events)),
        thread_([this] { Run(); }) {}

  ~CudaCopyEngine() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      for (auto& q : queue_) q.second->Cancel();
    }
    thread_.join();
  }

  absl::StatusOr<std::shared_ptr<CopyTicket>> Submit(CopyJob job) override {
    {
      absl::MutexLock lock(&mu_);
      if (!lost_.ok()) return lost_;
    }
    PSWITCH_RETURN_IF_ERROR(ValidateCopyJob(job, arena_->size_bytes()));
    for (size_t g = 0; g < job.groups.size(); ++g) {
      PSWITCH_RETURN_IF_ERROR(
          FlagAddress(*job.ready_flags, job.ready_flag_base + static_cast<uint32_t>(g)).status());
    }
    if (job.drain_flags != nullptr) {
      PSWITCH_RETURN_IF_ERROR(FlagAddress(*job.drain_flags, job.drain_index).status());
    }
    auto ticket = std::make_shared<internal::JobTicket>(
        job.groups.size(), std::move(job.on_finished), std::move(job.on_stalled));
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("copy engine is shutting down");
    queue_.emplace_back(std::move(job), ticket);
    return ticket;
  }

 private:
  void Run() {
    // Every thread that touches CUDA names its device: the runtime's current device is per thread.
    absl::Status device = PSWITCH_CUDA(cudaSetDevice(device_));
    // This thread sleeps kPollInterval between looks at the stream; under the default 50 us
    // timer slack each look, and so each observed group time, would be that late.
    (void)SetThreadTimerSlackNs(1);
    while (true) {
      std::pair<CopyJob, std::shared_ptr<internal::JobTicket>> next;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::Status lost;
      {
        absl::MutexLock lock(&mu_);
        lost = lost_;
      }
      if (!device.ok() || !lost.ok()) {
        // Nothing of this job reaches the stream.
        next.second->Finish(!device.ok() ? device : lost);
        continue;
      }
      absl::Status status = Execute(next.first, *next.second);
      next.second->Finish(Settle(std::move(status), *next.second));
    }
  }

  // A job counts as finished only once the stream has nothing of it left: its owner then frees
  // the pinned sources and retires the unpublished flags to E + 1, and a copy or a flag write of
  // E still queued would read freed memory or move a flag back from E + 1 to E. A job that
  // failed (a timeout, a CUDA error) with work still queued is reported stalled, so its owner
  // releases what the work waits for, and finishes once the stream is idle; a stream still busy
  // kSettleTimeout later is lost, and so is the engine: every later job fails.
  absl::Status Settle(absl::Status status, internal::JobTicket& ticket) {
    cudaError_t state = cudaStreamQuery(stream_->get());
    if (state == cudaSuccess) return status;
    if (state != cudaErrorNotReady) return DeclareLost(CudaStatus(state, "cudaStreamQuery"));
    // (A job that succeeded has seen every group's event, so only a job without groups, whose
    // drain wait may still be queued, gets here without a failure: it just waits.)
    if (!status.ok()) ticket.Stall(status);
    const absl::Time give_up = absl::Now() + kSettleTimeout;
    while ((state = cudaStreamQuery(stream_->get())) == cudaErrorNotReady) {
      if (absl::Now() > give_up) {
        return DeclareLost(absl::DeadlineExceededError(absl::StrCat(
            "the copy stream still holds work of a failed job ",
            absl::FormatDuration(kSettleTimeout), " after it failed (", status.message(), ")")));
      }
      absl::SleepFor(kSettlePollInterval);
    }
    if (state != cudaSuccess) return DeclareLost(CudaStatus(state, "cudaStreamQuery"));
    return status;
  }

  absl::Status DeclareLost(const absl::Status& why) {
    absl::Status lost = absl::InternalError(
        absl::StrCat("CUDA copy engine lost: ", why.message(),
                     "; no further copies run (restart pswitchd, and check the GPU)"));
    absl::MutexLock lock(&mu_);
    if (lost_.ok()) lost_ = lost;
    return lost_;
  }

  absl::Status Execute(const CopyJob& job, internal::JobTicket& ticket) {
    if (ticket.cancelled()) return absl::CancelledError("copy job cancelled before it started");
    cudaStream_t s = stream_->get();
    const size_t n = job.groups.size();
    std::vector<uint64_t> bytes(n, 0);
    for (size_t g = 0; g < n; ++g) {
      for (const CopySpan& span : job.groups[g].spans) bytes[g] += span.bytes;
    }
    PSWITCH_RETURN_IF_ERROR(events_.Reserve(n + 1));
    if (job.drain_flags != nullptr) {
      // Device-side wait: the copies below cannot start before the old tenant wrote its drain
      // value. Its timeout is the CPU's: a tenant that never drains fails the job below, and
      // the scheduler kills it, which releases the wait (the flag is host memory).
      PSWITCH_RETURN_IF_ERROR(
          stream_->WaitFlag(*job.drain_flags, job.drain_index, job.drain_value, job.drain_timeout));
    }
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventRecord(events_[0], s)));
    LookaheadWindow window(bytes, kLookaheadBytes);
    std::vector<EventObservation> seen(n);
    // Nsight Systems: each group from its enqueue to its completion being seen (ended on any
    // return by the destructors).
    std::vector<base::NvtxRange> copy_ranges(n);
    absl::Status status;
    // The first group also waits for the drain; every later one gets the same bound from when
    // its predecessor was seen.
    absl::Time give_up = absl::Now() + job.drain_timeout;
    while (!window.done()) {
      while (status.ok() && window.MayEnqueue()) {
        if (ticket.cancelled()) {
          status = absl::CancelledError(absl::StrCat("cancelled at group ", window.enqueued()));
          break;
        }
        const size_t g = window.enqueued();
        if constexpr (base::kNvtxBuilt) {
          copy_ranges[g].Restart(absl::StrCat("copy group ", g, " (", bytes[g], " B)"));
        }
        for (const CopySpan& span : job.groups[g].spans) {
          if (span.bytes == 0) continue;
          // Default: the source is pinned host memory, or the arena itself for a move on the
          // device (WeightsCache::PlanMove); unified addressing tells which.
          PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaMemcpyAsync(
              arena_->base() + span.arena_offset, span.host, span.bytes, cudaMemcpyDefault, s)));
        }
        PSWITCH_RETURN_IF_ERROR(stream_->WriteFlag(
            *job.ready_flags, job.ready_flag_base + static_cast<uint32_t>(g), job.epoch));
        PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventRecord(events_[g + 1], s)));
        window.Enqueued();
      }
      if (window.completed() == window.enqueued()) break;  // cancelled: nothing left in flight
      // Observe the oldest group in flight; the CPU's pace never holds the stream up.
      const size_t g = window.completed();
      cudaError_t state = cudaEventQuery(events_[g + 1]);
      if (state == cudaErrorNotReady) {
        if (absl::Now() > give_up) {
          return absl::DeadlineExceededError(absl::StrCat(
              "group ", g, " not copied within ", absl::FormatDuration(job.drain_timeout),
              g == 0 && job.drain_flags != nullptr
                  ? absl::StrCat(" (previous tenant did not drain: flag ", job.drain_index,
                                 " never reached ", job.drain_value, ")")
                  : ""));
        }
        absl::SleepFor(kPollInterval);
        continue;
      }
      PSWITCH_RETURN_IF_ERROR(CudaStatus(state, "cudaEventQuery"));
      seen[g].seen_ns = base::MonotonicNowNs();
      copy_ranges[g].End();
      float ms = 0;
      PSWITCH_RETURN_IF_ERROR(
          PSWITCH_CUDA(cudaEventElapsedTime(&ms, events_[0], events_[g + 1])));
      seen[g].since_start_ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
      window.Completed();
      give_up = absl::Now() + job.drain_timeout;
      // Timings are anchored once more groups are seen (a tighter bound); publish progress now.
      ticket.RecordGroup(g, GroupTiming{0, 0, bytes[g]});
    }
    const size_t done = window.completed();
    std::vector<GroupTiming> timings =
        GroupTimings(std::span<const EventObservation>(seen.data(), done),
                     std::span<const uint64_t>(bytes.data(), done));
    for (size_t g = 0; g < done; ++g) ticket.RecordGroup(g, timings[g]);
    return status;
  }

  const int device_;
  CudaArena* const arena_;
  std::unique_ptr<CudaStream> stream_;
  EventPool events_;  // copy thread only
  absl::Mutex mu_;
  std::deque<std::pair<CopyJob, std::shared_ptr<internal::JobTicket>>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set once the stream held a failed job's work past kSettleTimeout, or failed: why no job
  // runs any more.
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

class CudaDevice : public Device {
 public:
  CudaDevice(int device, const DriverApi* api, std::string name, bool vmm_arena)
      : device_(device),
        api_(api),
        name_(std::move(name)),
        vmm_arena_(vmm_arena),
        releaser_(std::make_shared<PinnedReleaser>(device)) {}

  Backend backend() const override { return Backend::kCuda; }
  std::string description() const override { return name_; }
  absl::StatusOr<uint64_t> FreeMemoryBytes() override {
    size_t free_bytes = 0, total_bytes = 0;
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device_)));
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes)));
    return free_bytes;
  }
  absl::StatusOr<std::unique_ptr<Arena>> CreateArena(uint64_t bytes) override {
    return CudaArena::Create(device_, bytes, api_, vmm_arena_);
  }
  absl::StatusOr<std::unique_ptr<Arena>> ImportArena(ArenaHandle handle) override {
    return CudaArena::Import(device_, std::move(handle), api_);
  }
  absl::StatusOr<std::unique_ptr<HostBuffer>> AllocatePinned(uint64_t bytes) override {
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device_)));
    return CudaHostBuffer::Allocate(bytes, releaser_);
  }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device_)));
    return CudaStream::Create(api_);
  }
  absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCopyEngine(Arena& arena) override {
    auto* cuda_arena = dynamic_cast<CudaArena*>(&arena);
    if (cuda_arena == nullptr)
      return absl::InvalidArgumentError("CUDA copy engine needs a CUDA arena");
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device_)));
    PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> stream, CudaStream::Create(api_));
    EventPool events;
    PSWITCH_RETURN_IF_ERROR(events.Reserve(kInitialEvents));
    return std::make_unique<CudaCopyEngine>(device_, cuda_arena, std::move(stream),
                                            std::move(events));
  }

 private:
  const int device_;
  const DriverApi* const api_;
  const std::string name_;
  const bool vmm_arena_;
  // Frees this device's pinned buffers off their owners' threads; shared with each buffer.
  const std::shared_ptr<PinnedReleaser> releaser_;
};

}  // namespace
}  // namespace pswitch::gpu::cuda

namespace pswitch::gpu {

absl::StatusOr<std::unique_ptr<Device>> OpenCudaDevice(const DeviceOptions& options) {
  int count = 0;
  absl::Status counted = cuda::CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (!counted.ok() || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device available: ",
                     counted.ok() ? "cudaGetDeviceCount returned 0" : counted.message()));
  }
  if (options.device_ordinal < 0 || options.device_ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", options.device_ordinal,
                                                   " out of range (", count, " devices)"));
  }
  PSWITCH_ASSIGN_OR_RETURN(const cuda::DriverApi* api, cuda::GetDriverApi());
  cudaDeviceProp prop;
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaGetDeviceProperties(&prop, options.device_ordinal)));
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(options.device_ordinal)));
  return std::make_unique<cuda::CudaDevice>(
      options.device_ordinal, api, absl::StrCat("cuda:", options.device_ordinal, " ", prop.name),
      options.cuda_vmm_arena);
}

}  // namespace pswitch::gpu
