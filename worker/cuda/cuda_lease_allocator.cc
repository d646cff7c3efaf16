#include "worker/cuda/cuda_lease_allocator.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "models/zoo_model.h"

namespace pswitch::worker::cuda {
namespace {

// c10's caching allocator rounds every block to 512 bytes; kernels tuned for it may assume that
// alignment for vectorised access.
constexpr uint64_t kAlignment = 512;
// How long an allocation the lease cannot serve now waits for blocks freed on other streams.
constexpr absl::Duration kPendingFreeTimeout = absl::Seconds(10);

std::atomic<CudaLeaseAllocator*> g_installed{nullptr};

}  // namespace

CudaLeaseAllocator::CudaLeaseAllocator(std::byte* base, uint64_t bytes, int device_ordinal)
    : device_ordinal_(device_ordinal),
      blocks_(base, bytes, kAlignment),
      freed_(StreamFrees::EventOps{[this](void* stream) { return RecordEvent(stream); },
                                   [](void* event) {
                                     return cudaEventQuery(static_cast<cudaEvent_t>(event)) ==
                                            cudaSuccess;
                                   },
                                   [this](void* event) { RecycleEvent(event); }}) {}

absl::StatusOr<CudaLeaseAllocator*> CudaLeaseAllocator::Install(std::byte* base, uint64_t bytes,
                                                                int device_ordinal) {
  if (base == nullptr || bytes < kAlignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA activation lease of ", bytes, " bytes is too small"));
  }
  if (g_installed.load(std::memory_order_acquire) != nullptr) {
    return absl::FailedPreconditionError("a CUDA lease allocator is already installed");
  }
  std::unique_ptr<CudaLeaseAllocator> self(new CudaLeaseAllocator(base, bytes, device_ordinal));
  CudaLeaseAllocator* raw = self.get();
  namespace pluggable = torch::cuda::CUDAPluggableAllocator;
  absl::Status installed = models::CatchTorch("installing the CUDA lease allocator", [&] {
    std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator =
        pluggable::createCustomAllocator(
            [raw](size_t size, int device, cudaStream_t stream) {
              return raw->Allocate(size, device, stream);
            },
            [raw](void* ptr, size_t, int, cudaStream_t stream) { raw->Free(ptr, stream); });
    auto* plugged = dynamic_cast<pluggable::CUDAPluggableAllocator*>(allocator.get());
    TORCH_CHECK(plugged != nullptr, "createCustomAllocator returned an unexpected type");
    plugged->set_record_stream_fn([raw](void* ptr, cudaStream_t stream) {
      // Recording on the stream the task runs on changes nothing; any other stream would need
      // the event bookkeeping this allocator deliberately does without.
      TORCH_CHECK(stream == c10::cuda::getCurrentCUDAStream(
                                static_cast<c10::DeviceIndex>(raw->device_ordinal_))
                                .stream(),
                  "pswitch worker: a tensor of the arena lease (", ptr,
                  ") was recorded on a second CUDA stream; the lease allocator supports one "
                  "compute stream per task");
    });
    // Throws "Can't swap an already initialized allocator" once libtorch allocated on CUDA.
    pluggable::changeCurrentAllocator(allocator);
  });
  if (!installed.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        installed.message(),
        " (the lease allocator must be installed before libtorch's first CUDA allocation)"));
  }
  g_installed.store(self.release(), std::memory_order_release);
  return raw;
}

void* CudaLeaseAllocator::Allocate(size_t bytes, int device, void* stream) {
  TORCH_CHECK(device == device_ordinal_, "pswitch worker: CUDA allocation on device ", device,
              ", but the worker's arena lease is on device ", device_ordinal_);
  const uint64_t limit = limit_bytes_.load(std::memory_order_acquire);
  std::vector<LeaseBlocks::Range> to_clear;
  // Blocks freed on this stream come back at once; other streams' once their fence completed.
  (void)Reclaim(stream, /*fence=*/false, absl::InfinitePast());
  std::byte* ptr = blocks_.Take(bytes, limit, &to_clear);
  // Short of memory: wait for blocks other streams still use. Bounded, since a stream stuck on
  // a flag no one writes must not hang the allocation.
  const absl::Time give_up = absl::Now() + kPendingFreeTimeout;
  while (ptr == nullptr && Reclaim(stream, /*fence=*/true, give_up)) {
    ptr = blocks_.Take(bytes, limit, &to_clear);
  }
  // Thrown as c10's caching allocator throws its own out-of-memory errors: cuDNN catches it and
  // retries with a smaller workspace. Never a null return, which c10 would take as a tensor.
  TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr, "pswitch worker on cuda:", device_ordinal_,
                   ": ", blocks_.DescribeShortage(bytes, limit));
  if (!to_clear.empty()) {
    // What an earlier owner left here, cleared on the stream the block is allocated for (a
    // task's compute stream): ordered before any kernel of the new owner, microseconds on the
    // device.
    for (const LeaseBlocks::Range& range : to_clear) {
      const cudaError_t cleared =
          cudaMemsetAsync(range.start, 0, range.bytes, static_cast<cudaStream_t>(stream));
      if (cleared != cudaSuccess) {
        (void)blocks_.Give(ptr);
        TORCH_CHECK(false, "pswitch worker on cuda:", device_ordinal_,
                    ": cudaMemsetAsync clearing a lease block: ", cudaGetErrorString(cleared));
      }
    }
  }
  return ptr;
}

void CudaLeaseAllocator::Free(void* ptr, void* stream) {
  // Called from tensor destructors: a pointer that is not ours is a bug worth a warning, not a
  // throw from a destructor.
  if (!blocks_.Contains(ptr)) {
    TORCH_WARN("pswitch worker: freeing ", ptr, ", which the CUDA lease allocator never served");
    return;
  }
  freed_.Freed(ptr, stream);
}

bool CudaLeaseAllocator::Reclaim(void* stream, bool fence, absl::Time wait_until) {
  absl::Duration pause = absl::Microseconds(2);
  while (true) {
    std::vector<void*> reusable = freed_.Reusable(stream, fence);
    for (void* ptr : reusable) (void)blocks_.Give(ptr);
    if (!reusable.empty()) return true;
    if (!fence || !freed_.waiting() || absl::Now() >= wait_until) return false;
    fence = false;  // fenced once; now only wait for those events
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Microseconds(100));
  }
}

void* CudaLeaseAllocator::RecordEvent(void* stream) {
  cudaEvent_t event = nullptr;
  {
    absl::MutexLock lock(&events_mu_);
    if (!spare_events_.empty()) {
      event = static_cast<cudaEvent_t>(spare_events_.back());
      spare_events_.pop_back();
    }
  }
  if (event == nullptr && cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
    return nullptr;  // the blocks stay for their own stream's reuse
  }
  if (cudaEventRecord(event, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
    RecycleEvent(event);
    return nullptr;
  }
  return event;
}

void CudaLeaseAllocator::RecycleEvent(void* event) {
  absl::MutexLock lock(&events_mu_);
  spare_events_.push_back(event);
}

}  // namespace pswitch::worker::cuda
