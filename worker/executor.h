// How a worker computes on its backend: where task tensors live, how their memory comes out of
// the worker's activation lease, and the bounded section a task's kernels run in. The host
// executor computes on the CPU; the CUDA one (worker/cuda/, built only against a CUDA libtorch)
// on the arena's device, on the worker's stream. worker.cc sees only this interface.
#ifndef PSWITCH_WORKER_EXECUTOR_H_
#define PSWITCH_WORKER_EXECUTOR_H_

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/device.h"

namespace pswitch::worker {

class LeaseAllocator;
class RegionDevice;

// A task's kernels, on the worker's stream while it lives.
class ComputeSection {
 public:
  virtual ~ComputeSection() = default;
  // Returns once everything the task enqueued has finished (its weights and state are in the
  // arena); DeadlineExceeded after `timeout` (a stream waiting on a flag no one writes).
  virtual absl::Status Synchronize(const std::string& what, absl::Duration timeout) = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Where task tensors (inputs, activations) are made.
  virtual c10::Device tensor_device() const = 0;
  // Caps what the next run may allocate from the lease (0: no cap beyond the lease).
  virtual void SetActivationLimit(uint64_t bytes) = 0;
  // What was allocated so far (warm-up workspaces) stays for the process and counts against no
  // task's cap.
  virtual void MarkActivationsPersistent() = 0;
  // The next task is another owner's (model or principal): lease bytes earlier tasks touched are
  // zeroed before they are handed out again.
  virtual void NewActivationOwner() = 0;
  // Lease bytes left dirty by an owner change and not cleared yet (tests, measurements).
  virtual uint64_t DirtyActivationBytes() const = 0;
  // The host's lease allocator, for scoping CPU allocations to a task; null on CUDA.
  virtual LeaseAllocator* host_activations() const = 0;
  // Starts a section on `stream`; null when the backend needs none (the host computes in line).
  virtual absl::StatusOr<std::unique_ptr<ComputeSection>> Enter(gpu::Stream& stream) = 0;
  // What the backend does with mapped transfer regions (worker/region_map.h); lives as long as
  // the executor.
  virtual RegionDevice& region_device() = 0;
};

struct ExecutorOptions {
  gpu::Backend backend = gpu::Backend::kHost;
  int device_ordinal = 0;
  const std::byte* arena_base = nullptr;
  std::byte* lease_base = nullptr;  // the activation lease; null: none (host only)
  uint64_t lease_bytes = 0;
};

// Installs the backend's allocator over the lease (once per process, before any tensor).
absl::StatusOr<std::unique_ptr<Executor>> CreateExecutor(const ExecutorOptions& options);

// The CUDA executor: worker/cuda/cuda_executor.cc with a CUDA libtorch, else
// worker/no_cuda_executor.cc (Unimplemented, saying how to build it).
absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const ExecutorOptions& options);

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_EXECUTOR_H_
