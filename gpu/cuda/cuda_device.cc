#include "gpu/cuda/cuda_device.h"

#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/cuda_memory.h"
#include "gpu/internal/job_ticket.h"
#include "proto/status.h"

namespace pswitch::gpu::cuda {
namespace {

// Groups enqueued ahead of the last completed one: enough to keep the copy engine busy, few
// enough that a cancel stops the transfer within a few groups.
constexpr size_t kLookaheadGroups = 4;

// RAII for a timing event.
class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  absl::Status Init() { return PSWITCH_CUDA(cudaEventCreate(&event_)); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Enqueues each group's copies on a dedicated stream followed by a device-side write of the
// group's ready flag; the CPU only paces enqueueing (lookahead) and collects timings.
class CudaCopyEngine : public CopyEngine {
 public:
  CudaCopyEngine(CudaArena* arena, std::unique_ptr<CudaStream> stream, const DriverApi* api)
      : arena_(arena), stream_(std::move(stream)), api_(api), thread_([this] { Run(); }) {}

  ~CudaCopyEngine() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      for (auto& q : queue_) q.second->Cancel();
    }
    thread_.join();
  }

  absl::StatusOr<std::shared_ptr<CopyTicket>> Submit(CopyJob job) override {
    PSWITCH_RETURN_IF_ERROR(ValidateCopyJob(job, arena_->size_bytes()));
    for (size_t g = 0; g < job.groups.size(); ++g) {
      PSWITCH_RETURN_IF_ERROR(
          FlagAddress(*job.ready_flags, job.ready_flag_base + static_cast<uint32_t>(g)).status());
    }
    auto ticket = std::make_shared<internal::JobTicket>(job.groups.size());
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("copy engine is shutting down");
    queue_.emplace_back(std::move(job), ticket);
    return ticket;
  }

 private:
  void Run() {
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
      absl::Status status = Execute(next.first, *next.second);
      // Whatever happened, nothing of this job may still be in flight when it is reported.
      absl::Status synced = stream_->Synchronize();
      next.second->Finish(status.ok() ? synced : status);
    }
  }

  absl::Status Execute(const CopyJob& job, internal::JobTicket& ticket) {
    if (ticket.cancelled()) return absl::CancelledError("copy job cancelled before it started");
    cudaStream_t s = stream_->get();
    if (job.drain_flags != nullptr) {
      // Device-side wait: the copies below cannot start before the old tenant's stream wrote
      // its drain value. The CPU bounds it: a tenant that never drains fails the job.
      PSWITCH_RETURN_IF_ERROR(
          stream_->WaitFlag(*job.drain_flags, job.drain_index, job.drain_value, job.drain_timeout));
    }
    const size_t n = job.groups.size();
    std::vector<Event> start(n), end(n);
    Event origin;
    PSWITCH_RETURN_IF_ERROR(origin.Init());
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventRecord(origin.get(), s)));
    int64_t origin_ns = 0;
    size_t collected = 0;
    auto collect = [&](size_t g) -> absl::Status {
      absl::Time give_up = absl::Now() + job.drain_timeout;
      // Poll rather than block so an undrained tenant cannot hang this thread forever.
      while (cudaEventQuery(end[g].get()) == cudaErrorNotReady) {
        if (absl::Now() > give_up) {
          return absl::DeadlineExceededError(absl::StrCat("group ", g, " not copied after ",
                                                          absl::FormatDuration(job.drain_timeout)));
        }
        absl::SleepFor(absl::Microseconds(20));
      }
      PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventSynchronize(end[g].get())));
      if (g == 0) origin_ns = MonotonicNowNs();
      float start_ms = 0, end_ms = 0;
      PSWITCH_RETURN_IF_ERROR(
          PSWITCH_CUDA(cudaEventElapsedTime(&start_ms, origin.get(), start[g].get())));
      PSWITCH_RETURN_IF_ERROR(
          PSWITCH_CUDA(cudaEventElapsedTime(&end_ms, origin.get(), end[g].get())));
      // Event times are relative; anchor them at the host time group 0 was seen complete.
      GroupTiming timing;
      timing.copy_start_ns = origin_ns + static_cast<int64_t>(start_ms * 1e6);
      timing.ready_ns = origin_ns + static_cast<int64_t>(end_ms * 1e6);
      for (const CopySpan& span : job.groups[g].spans) timing.bytes += span.bytes;
      ticket.RecordGroup(g, timing);
      return absl::OkStatus();
    };
    for (size_t g = 0; g < n; ++g) {
      if (ticket.cancelled()) return absl::CancelledError(absl::StrCat("cancelled at group ", g));
      PSWITCH_RETURN_IF_ERROR(start[g].Init());
      PSWITCH_RETURN_IF_ERROR(end[g].Init());
      PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventRecord(start[g].get(), s)));
      for (const CopySpan& span : job.groups[g].spans) {
        if (span.bytes == 0) continue;
        PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaMemcpyAsync(
            arena_->base() + span.arena_offset, span.host, span.bytes, cudaMemcpyHostToDevice, s)));
      }
      PSWITCH_RETURN_IF_ERROR(stream_->WriteFlag(
          *job.ready_flags, job.ready_flag_base + static_cast<uint32_t>(g), job.epoch));
      PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaEventRecord(end[g].get(), s)));
      if (g >= kLookaheadGroups) PSWITCH_RETURN_IF_ERROR(collect(collected++));
    }
    while (collected < n) PSWITCH_RETURN_IF_ERROR(collect(collected++));
    return absl::OkStatus();
  }

  CudaArena* const arena_;
  std::unique_ptr<CudaStream> stream_;
  const DriverApi* const api_;
  absl::Mutex mu_;
  std::deque<std::pair<CopyJob, std::shared_ptr<internal::JobTicket>>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class CudaDevice : public Device {
 public:
  CudaDevice(int device, const DriverApi* api, std::string name)
      : device_(device), api_(api), name_(std::move(name)) {}

  Backend backend() const override { return Backend::kCuda; }
  std::string description() const override { return name_; }
  absl::StatusOr<uint64_t> FreeMemoryBytes() override {
    size_t free_bytes = 0, total_bytes = 0;
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device_)));
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes)));
    return free_bytes;
  }
  absl::StatusOr<std::unique_ptr<Arena>> CreateArena(uint64_t bytes) override {
    return CudaArena::Create(device_, bytes, api_);
  }
  absl::StatusOr<std::unique_ptr<Arena>> ImportArena(ArenaHandle handle) override {
    return CudaArena::Import(device_, handle, api_);
  }
  absl::StatusOr<std::unique_ptr<HostBuffer>> AllocatePinned(uint64_t bytes) override {
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device_)));
    return CudaHostBuffer::Allocate(bytes);
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
    return std::make_unique<CudaCopyEngine>(cuda_arena, std::move(stream), api_);
  }

 private:
  const int device_;
  const DriverApi* const api_;
  const std::string name_;
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
      options.device_ordinal, api, absl::StrCat("cuda:", options.device_ordinal, " ", prop.name));
}

}  // namespace pswitch::gpu
