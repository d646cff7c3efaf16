// CUDA-backend memory objects: the IPC-shareable arena, its flag words, pinned buffers and
// streams. Internal to gpu/cuda.
//
// Flags live in host memory, not in the device arena. The arena's first kFlagWindowBytes are
// mirrored by a memfd page that every process maps and registers with the driver
// (cudaHostRegisterMapped); streams wait on and write its device alias with the stream memory
// operations, and the CPU reads and writes it with plain atomics. Why: a CPU-side release that
// went through a stream (cuStreamWriteValue32) could queue behind the very device wait it must
// release, in an order the hardware scheduler does not promise (CUDA_DEVICE_MAX_CONNECTIONS
// folds streams onto shared queues), and a flag read through cudaMemcpy would block behind the
// same waits. Host-resident flags make every release and every read independent of any stream.
#ifndef PSWITCH_GPU_CUDA_CUDA_MEMORY_H_
#define PSWITCH_GPU_CUDA_CUDA_MEMORY_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "gpu/cuda/driver_api.h"
#include "gpu/cuda/vmm_memory.h"
#include "gpu/device.h"

namespace pswitch::gpu::cuda {

// A non-blocking stream, destroyed with the object. WaitFlag and Synchronize may be called from
// different threads; Mark and TakeMarks from one.
//
// Timeouts of device-side waits. The device cannot abandon a cuStreamWaitValue32; only a write
// of the flag releases it. WaitFlag therefore records each wait with its deadline, and
// Synchronize fails as soon as a recorded wait has outlived its own timeout with its flag still
// short of the epoch, naming the flag, instead of sitting out its (usually longer) bound. The
// work stays queued: the caller must treat the stream as unusable until the flag is written
// (the scheduler retires flags of a failed switch to E + 1, and kills an undrained tenant).
class CudaStream : public Stream {
 public:
  static absl::StatusOr<std::unique_ptr<CudaStream>> Create(const DriverApi* api);
  ~CudaStream() override;
  absl::Status WaitFlag(const FlagArray& flags, uint32_t index, uint32_t epoch,
                        absl::Duration timeout) override;
  absl::Status WriteFlag(FlagArray& flags, uint32_t index, uint32_t value) override;
  absl::Status Synchronize(absl::Duration timeout) override;
  absl::Status Mark() override;
  absl::StatusOr<std::vector<int64_t>> TakeMarks() override;
  void* native_handle() const override { return stream_; }
  cudaStream_t get() const { return stream_; }

 private:
  CudaStream(cudaStream_t stream, const DriverApi* api) : stream_(stream), api_(api) {}
  // A device-side wait enqueued by WaitFlag that the stream may not have passed yet. `flags`
  // is borrowed (it must outlive the wait, as the device wait itself requires).
  struct PendingWait {
    const FlagArray* flags;
    uint32_t index;
    uint32_t epoch;
    absl::Time deadline;
  };
  // DeadlineExceeded naming the first recorded wait that is past its deadline with its flag
  // still short of its epoch; OK otherwise.
  absl::Status CheckWaits(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(waits_mu_);

  cudaStream_t const stream_;
  const DriverApi* const api_;
  mutable absl::Mutex waits_mu_;
  // Since the stream was last seen idle, in order.
  std::vector<PendingWait> waits_ ABSL_GUARDED_BY(waits_mu_);
  // Timing events for Mark, made on first use and reused; [kMaxStreamMarks] is the end mark.
  std::vector<cudaEvent_t> mark_events_;
  size_t marks_ = 0;
};

// Made here (owner) or imported (one import per process), in one of two forms:
//   VMM    chunks of physical memory exported as fds (gpu/cuda/vmm_memory.h); an importer maps
//          nothing but what it is granted (issue 29 item 2), RestrictAccess or not;
//   IPC    cudaMalloc shared by cudaIpcMemHandle; every importer maps it whole.
class CudaArena : public Arena {
 public:
  static absl::StatusOr<std::unique_ptr<CudaArena>> Create(int device, uint64_t bytes,
                                                           const DriverApi* api, bool vmm);
  static absl::StatusOr<std::unique_ptr<CudaArena>> Import(int device, ArenaHandle handle,
                                                           const DriverApi* api);
  ~CudaArena() override;

  uint64_t size_bytes() const override { return size_bytes_; }
  std::byte* base() const override { return base_; }
  bool owner() const override { return owner_; }
  absl::StatusOr<ArenaHandle> Export() const override;
  absl::Status Fill(uint64_t offset, uint64_t bytes, uint8_t value) override;
  absl::Status CopyToHost(uint64_t offset, std::span<std::byte> out) override;
  absl::Status CopyFromHost(uint64_t offset, std::span<const std::byte> in) override;
  absl::StatusOr<std::unique_ptr<FlagArray>> Flags(uint64_t offset, uint32_t count) override;
  uint64_t access_granularity() const override;
  bool flags_outside_device_memory() const override { return true; }
  bool read_only_access() const override;
  absl::Status RestrictAccess() override;
  absl::Status SetAccess(uint64_t offset, uint64_t bytes, Access access) override;
  absl::StatusOr<Access> AccessAt(uint64_t offset) const override;
  absl::StatusOr<std::vector<UniqueFd>> ExportChunks(uint64_t first, uint64_t count) const override;

 private:
  // The registered host page holding the flag window; unmapped and unregistered with it.
  class FlagWindow;

  CudaArena(int device, std::byte* base, uint64_t bytes, bool owner, std::unique_ptr<VmmMemory> vmm,
            std::unique_ptr<CudaStream> side_stream, std::unique_ptr<FlagWindow> flags);

  const int device_;
  std::byte* const base_;
  const uint64_t size_bytes_;
  const bool owner_;
  // Set for a VMM arena; base_ is its mapping.
  std::unique_ptr<VmmMemory> vmm_;
  std::atomic<bool> restricted_{false};
  std::unique_ptr<FlagWindow> flag_window_;
  // Synchronous host-side operations (fills, flag loads/stores, checkpoints) run here so they
  // never serialise with the copy or compute streams.
  std::unique_ptr<CudaStream> side_stream_;
};

// Frees pinned buffers on a thread of its own. cudaFreeHost unpins every page and may wait for
// the device: milliseconds for a large buffer, on whichever thread drops the last reference (a
// scheduler's event loop, when a task's optimizer checkpoint is dropped). Thread-safe; its
// destructor frees what is still queued and joins the thread.
class PinnedReleaser {
 public:
  explicit PinnedReleaser(int device);
  ~PinnedReleaser();
  PinnedReleaser(const PinnedReleaser&) = delete;
  PinnedReleaser& operator=(const PinnedReleaser&) = delete;
  // Queues `data` (from cudaHostAlloc) for cudaFreeHost; returns at once.
  void Release(void* data);

 private:
  void Run();
  const int device_;
  absl::Mutex mu_;
  std::vector<void*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest exists
};

// Pinned memory from cudaHostAlloc; freed by `releaser` (shared: the buffer may outlive the
// device that made it, e.g. a checkpoint kept for another GPU).
class CudaHostBuffer : public HostBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<CudaHostBuffer>> Allocate(
      uint64_t bytes, std::shared_ptr<PinnedReleaser> releaser);
  ~CudaHostBuffer() override;
  std::byte* data() const override { return data_; }
  uint64_t size_bytes() const override { return size_bytes_; }

 private:
  CudaHostBuffer(std::byte* data, uint64_t bytes, std::shared_ptr<PinnedReleaser> releaser)
      : data_(data), size_bytes_(bytes), releaser_(std::move(releaser)) {}
  std::byte* const data_;
  const uint64_t size_bytes_;
  const std::shared_ptr<PinnedReleaser> releaser_;
};

// Device address (the registered host page's device alias) of flag word `index`; the flag array
// must come from a CudaArena.
absl::StatusOr<CUdeviceptr> FlagAddress(const FlagArray& flags, uint32_t index);

}  // namespace pswitch::gpu::cuda

#endif  // PSWITCH_GPU_CUDA_CUDA_MEMORY_H_
