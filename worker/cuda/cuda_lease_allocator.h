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
// Streams. A freed block returns to the free list at once, with no event. That is safe because a
// worker runs every kernel of a task on one stream (compute_stream.h; autograd runs each backward
// op on its forward op's stream): a kernel that reuses a block is enqueued after every kernel
// that used it before, exactly the argument c10's caching allocator makes for single-stream
// blocks. Recording a block on another stream (Tensor::record_stream) would need events and is
// refused with an error instead of racing.
//
// Limits of the pluggable allocator: it answers no statistics (cacheInfo, getDeviceStats throw),
// so cuDNN's benchmark mode (at::globalContext().setBenchmarkCuDNN), which sizes workspaces with
// cacheInfo, must stay off, as it is by default; the heuristic mode works unchanged.
#ifndef PSWITCH_WORKER_CUDA_CUDA_LEASE_ALLOCATOR_H_
#define PSWITCH_WORKER_CUDA_CUDA_LEASE_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/lease_blocks.h"

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
  // The pluggable allocator's callbacks. Allocate throws c10::OutOfMemoryError (a c10::Error,
  // caught at the worker's task boundary) when the lease cannot serve `bytes`.
  void* Allocate(size_t bytes, int device);
  void Free(void* ptr);

  const int device_ordinal_;
  std::atomic<uint64_t> limit_bytes_{0};
  LeaseBlocks blocks_;
};

}  // namespace pswitch::worker::cuda

#endif  // PSWITCH_WORKER_CUDA_CUDA_LEASE_ALLOCATOR_H_
