// Serves libtorch's CUDA allocations (activations, gradients, cuBLAS/cuDNN workspaces) from the
// worker's lease of the arena, so a task never calls cudaMalloc (the memdaemon holds almost all
// device memory) and its memory is bounded by the lease. The CUDA counterpart of
// worker/lease_allocator.h.
//
// Design note. It is installed through torch's CUDAPluggableAllocator function-pointer factory
// (libtorch_cuda), which has kept its signature across 2.x, rather than by subclassing
// c10::cuda::CUDACachingAllocator::CUDAAllocator, whose virtual interface changes between
// releases. libtorch refuses to swap an allocator that has served anything, so Install() must
// run before the process's first CUDA allocation: before the first model is bound to the arena
// (binding asks libtorch which device holds the arena, which initialises CUDA).
//
// Streams. libtorch frees a tensor when its last CPU reference goes, while kernels using it may
// still be queued on the stream it was allocated on. A freed block therefore goes back to the
// free list in stream order (StreamFrees, worker/stream_frees.h), as in c10's caching allocator:
// an allocation on the block's own stream reuses it at once; one on another stream (the default
// stream while a model is bound or warmed up outside the task's compute stream) that the free
// list cannot serve fences the other streams' freed blocks with one event each and waits,
// bounded, for those events before it fails. Frees cost no CUDA call; events are recorded only
// when memory runs short across streams. Recording a block on a second stream
// (Tensor::record_stream) would need more bookkeeping and is refused with an error instead of
// racing.
//
// Limits of the pluggable allocator: it answers no statistics (cacheInfo, getDeviceStats throw),
// so cuDNN's benchmark mode (at::globalContext().setBenchmarkCuDNN), which sizes workspaces with
// cacheInfo, must stay off, as it is by default; the heuristic mode works unchanged.
#ifndef PSWITCH_WORKER_CUDA_CUDA_LEASE_ALLOCATOR_H_
#define PSWITCH_WORKER_CUDA_CUDA_LEASE_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/lease_blocks.h"
#include "worker/stream_frees.h"

namespace pswitch::worker::cuda {

// Thread-safe (libtorch allocates from the task thread and autograd's device thread). One per
// process, never destroyed: tensors it served may live to the end.
class CudaLeaseAllocator {
 public:
  // Makes the lease [base, base + bytes) of device `device_ordinal`'s memory (an arena mapped in
  // this process) libtorch's CUDA allocator. FailedPrecondition when libtorch has already made a
  // CUDA allocation or an allocator was already installed; InvalidArgument for an empty lease.
  static absl::StatusOr<CudaLeaseAllocator*> Install(std::byte* base, uint64_t bytes,
                                                     int device_ordinal);

  CudaLeaseAllocator(const CudaLeaseAllocator&) = delete;
  CudaLeaseAllocator& operator=(const CudaLeaseAllocator&) = delete;

  // Caps the bytes in use (0 = the whole lease): a fill task's memory cap, so it fails alone.
  void set_limit(uint64_t bytes) { limit_bytes_.store(bytes, std::memory_order_release); }
  // What is in use now (the warm-up's cuBLAS/cuDNN workspaces) is the process's, not a task's:
  // limits stop counting it.
  void MarkPersistent() { blocks_.MarkPersistent(); }
  // Another model or principal's task begins: what earlier tasks left in the lease is zeroed
  // (cudaMemsetAsync on the current stream, the task's compute stream) before any of it is
  // handed out again (LeaseBlocks::NewOwner).
  void NewOwner() { blocks_.NewOwner(); }
  uint64_t dirty_bytes() const { return blocks_.dirty_bytes(); }
  uint64_t in_use_bytes() const { return blocks_.in_use_bytes(); }
  uint64_t peak_bytes() const { return blocks_.peak_bytes(); }
  uint64_t capacity_bytes() const { return blocks_.capacity_bytes(); }
  int device_ordinal() const { return device_ordinal_; }

 private:
  CudaLeaseAllocator(std::byte* base, uint64_t bytes, int device_ordinal);
  // The pluggable allocator's callbacks (`stream`: the cudaStream_t the block is for, or was
  // allocated on). Allocate throws c10::OutOfMemoryError (a c10::Error, caught at the worker's
  // task boundary) when the lease cannot serve `bytes`.
  void* Allocate(size_t bytes, int device, void* stream);
  void Free(void* ptr, void* stream);
  // Gives back to the lease the freed blocks an allocation on `stream` may use now. With
  // `fence`, fences the other streams' blocks and polls until some come back or `wait_until`
  // passed. True when any block came back.
  bool Reclaim(void* stream, bool fence, absl::Time wait_until);
  // StreamFrees' events: cudaEvent_t, made once and reused.
  void* RecordEvent(void* stream);
  void RecycleEvent(void* event);

  const int device_ordinal_;
  std::atomic<uint64_t> limit_bytes_{0};
  LeaseBlocks blocks_;
  absl::Mutex events_mu_;
  std::vector<void*> spare_events_ ABSL_GUARDED_BY(events_mu_);
  StreamFrees freed_;  // last: its callbacks use the members above
};

}  // namespace pswitch::worker::cuda

#endif  // PSWITCH_WORKER_CUDA_CUDA_LEASE_ALLOCATOR_H_
