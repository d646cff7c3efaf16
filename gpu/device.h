// The device interface: everything above gpu/ reaches the accelerator only through these types,
// as LevelDB reaches the OS through Env. Two backends implement it: gpu/cuda (a real GPU) and
// gpu/host (shared host memory standing in for device memory, used by CI and GPU-less nodes).
//
// Objects and their lifetimes:
//   Device      opened once per process; creates everything below.
//   Arena       one contiguous device allocation, made once by the memdaemon and imported once
//               by each worker (host: memfd; cuda: a VMM allocation exported as an fd, or
//               cudaMalloc + IPC handle).
//   FlagArray   32-bit words addressed by arena offset (ready and drain flags); borrowed from the
//               arena. The words live in host memory shared by every process that maps the arena
//               (host: the memfd arena itself; CUDA: a registered memfd page beside it), so the
//               CPU reads and releases them without any stream.
//   HostBuffer  pinned host memory (the weight store).
//   Stream      an ordered queue of device work; can wait on and write flags without the CPU.
//   CopyEngine  copies groups of host ranges into the arena in order, publishing one ready flag
//               per group.
// Borrowed pointers (Arena*, FlagArray*) must outlive every object or job that holds them.
#ifndef PSWITCH_GPU_DEVICE_H_
#define PSWITCH_GPU_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "gpu/copy_engine.h"
#include "gpu/flags.h"

namespace pswitch::gpu {

enum class Backend { kHost, kCuda };
absl::string_view BackendName(Backend backend);
absl::StatusOr<Backend> ParseBackend(absl::string_view name);
// True when this build contains the CUDA backend.
bool CudaBackendBuilt();

struct DeviceOptions {
  Backend backend = Backend::kHost;
  int device_ordinal = 0;
  // Host backend: lock pinned buffers with mlock (fails clearly when RLIMIT_MEMLOCK is too low).
  bool lock_host_memory = true;
  // Host backend: copy engine pacing in bytes/s to model a PCIe link; 0 = as fast as memcpy.
  double copy_bandwidth_bytes_per_s = 0;
  // CUDA backend: arenas this device creates are chunks of VMM allocations, of which each
  // importer maps only what it is granted (workers see only what their task needs); false:
  // cudaMalloc shared by IPC handle, mapped whole by every importer. Imports follow the handle
  // either way. Off by default until a GPU run has validated it (docs/performance.md).
  bool cuda_vmm_arena = false;
};

// Flag words must lie in an arena's first kFlagWindowBytes (the CUDA backend mirrors only that
// window in host memory; the device bytes behind it stay unused).
inline constexpr uint64_t kFlagWindowBytes = 1ull << 20;

// The fds of chunks [first, first + count) of a chunked (CUDA VMM) arena, in order; asked for
// at most kMaxArenaChunksPerFetch at a time (so an importer never holds more fds than that).
inline constexpr uint64_t kMaxArenaChunksPerFetch = 64;
using ArenaChunkSource =
    std::function<absl::StatusOr<std::vector<UniqueFd>>(uint64_t first, uint64_t count)>;

// What another process needs to import an arena. `fd` (a memfd) travels by SCM_RIGHTS: host,
// the arena; CUDA, its flag window. CUDA's device memory: a VMM arena is chunks of
// `chunk_bytes`, each its own allocation, whose fds an importer fetches through `chunks` as it
// maps them (from the memdaemon, or the owner itself in-process); a cudaMalloc'd one is
// `ipc_handle`, the cudaIpcMemHandle_t bytes.
struct ArenaHandle {
  Backend backend = Backend::kHost;
  int device_ordinal = 0;
  uint64_t size_bytes = 0;
  std::string ipc_handle;
  UniqueFd fd;
  uint64_t chunk_bytes = 0;
  ArenaChunkSource chunks;
};

// Device memory shared between processes. Thread-safe.
class Arena {
 public:
  virtual ~Arena() = default;
  virtual uint64_t size_bytes() const = 0;
  // Device address of byte 0 (host backend: the process's mapping).
  virtual std::byte* base() const = 0;
  // True in the process that allocated it; only the owner can export.
  virtual bool owner() const = 0;
  virtual absl::StatusOr<ArenaHandle> Export() const = 0;
  // Sets [offset, offset + bytes) to `value` and waits for completion (scrub before handover).
  virtual absl::Status Fill(uint64_t offset, uint64_t bytes, uint8_t value) = 0;
  // Synchronous copies for checkpoints and verification (not the switch path).
  virtual absl::Status CopyToHost(uint64_t offset, std::span<std::byte> out) = 0;
  virtual absl::Status CopyFromHost(uint64_t offset, std::span<const std::byte> in) = 0;
  // `count` flag words at `offset` (4-byte aligned, inside the flag window). The array borrows
  // the arena.
  virtual absl::StatusOr<std::unique_ptr<FlagArray>> Flags(uint64_t offset, uint32_t count) = 0;

  // Per-range access for an importing process (issue 29 item 2): a worker touches only what its
  // task needs (the flags, its activation lease, the model it runs, read-only when it infers),
  // so a model that escaped its tensors faults rather than reads another tenant's bytes.
  enum class Access { kNone, kRead, kReadWrite };
  // The unit access is granted in (ranges widen to it); 0 when this arena cannot restrict access
  // and every byte stays readable and writable (a CUDA arena shared by IPC handle).
  virtual uint64_t access_granularity() const { return 0; }
  // True where the flag words live outside the memory SetAccess governs (CUDA: a registered
  // host page every importer maps whole), so RestrictAccess leaves them reachable.
  virtual bool flags_outside_device_memory() const { return false; }
  // False where a kRead grant maps read-write because the device cannot map read-only.
  virtual bool read_only_access() const { return true; }
  // From now on nothing of the arena is accessible to this process but what SetAccess grants.
  // FailedPrecondition for the owner (it copies into every region) and where
  // access_granularity() is 0.
  virtual absl::Status RestrictAccess();
  // What this process may do with [offset, offset + bytes), widened to access_granularity().
  // FailedPrecondition before RestrictAccess.
  virtual absl::Status SetAccess(uint64_t offset, uint64_t bytes, Access access);
  // Owner of a chunked arena (access_granularity() > 0 on CUDA): new fds for chunks [first,
  // first + count). Unimplemented elsewhere.
  virtual absl::StatusOr<std::vector<UniqueFd>> ExportChunks(uint64_t first, uint64_t count) const;
  // What the device may do at `offset` in this process, as its driver reports it, without
  // touching the bytes (a fault would end a CUDA context). Unimplemented where the backend
  // cannot tell (the host backend: ask the pages).
  virtual absl::StatusOr<Access> AccessAt(uint64_t offset) const;

  // OutOfRange unless [offset, offset + bytes) lies inside the arena.
  absl::Status CheckRange(uint64_t offset, uint64_t bytes) const;
  // CheckRange for `count` flag words inside the flag window, plus InvalidArgument unless
  // `offset` is 4-byte aligned.
  absl::Status CheckFlagPlacement(uint64_t offset, uint32_t count) const;
};

// OutOfRange unless [offset, offset + bytes) lies inside [0, arena_bytes); overflow-safe.
absl::Status CheckArenaRange(uint64_t offset, uint64_t bytes, uint64_t arena_bytes);

// Pinned (page-locked) host memory, DMA-able by the copy engine. Not thread-safe.
class HostBuffer {
 public:
  virtual ~HostBuffer() = default;
  virtual std::byte* data() const = 0;
  virtual uint64_t size_bytes() const = 0;
};

// A task marks its first layer's start and end and each later group's gate (the trace's
// per-group compute): up to 62 groups are timed.
inline constexpr size_t kMaxStreamMarks = 64;

// An ordered queue of device work (host backend: runs inline on the calling thread).
class Stream {
 public:
  virtual ~Stream() = default;
  // Work enqueued after this waits until flags[index] reaches `epoch` (cyclic >=). Host: blocks
  // the caller up to `timeout`; CUDA: a device-side wait (the timeout is enforced by the CPU
  // side, which can force the flag forward).
  virtual absl::Status WaitFlag(const FlagArray& flags, uint32_t index, uint32_t epoch,
                                absl::Duration timeout) = 0;
  // Writes `value` to flags[index] once all work enqueued before it has finished.
  virtual absl::Status WriteFlag(FlagArray& flags, uint32_t index, uint32_t value) = 0;
  // Waits until all enqueued work finished; DeadlineExceeded after `timeout`, and the work is
  // still queued then. Never blocks unboundedly: a stream may wait on a flag no one writes.
  virtual absl::Status Synchronize(absl::Duration timeout) = 0;
  // Marks this point of the stream's work, for timing (host: now, its work runs inline). At most
  // kMaxStreamMarks between two TakeMarks; ResourceExhausted beyond.
  virtual absl::Status Mark() = 0;
  // Once the stream is idle (after Synchronize): the CLOCK_MONOTONIC time each mark was reached,
  // in order; clears them.
  virtual absl::StatusOr<std::vector<int64_t>> TakeMarks() = 0;
  // cudaStream_t for the CUDA backend, nullptr for host.
  virtual void* native_handle() const = 0;
};

// Host backend: the lock file whose holder owns simulated device `index`'s compute (a
// time-sliced GPU, gpu/host/compute_lock.h); fill tasks and main-job stages share it.
std::string HostComputeLockPath(int index);

class Device {
 public:
  virtual ~Device() = default;
  // Opens the backend named in `options`; FailedPrecondition when it is not built or no device.
  static absl::StatusOr<std::unique_ptr<Device>> Open(const DeviceOptions& options);

  virtual Backend backend() const = 0;
  virtual std::string description() const = 0;
  // Device memory currently free (host backend: available physical memory).
  virtual absl::StatusOr<uint64_t> FreeMemoryBytes() = 0;
  // A zeroed arena of `bytes`, exportable to other processes.
  virtual absl::StatusOr<std::unique_ptr<Arena>> CreateArena(uint64_t bytes) = 0;
  // Maps an exported arena; call once per process lifetime (IPC opens are expensive).
  virtual absl::StatusOr<std::unique_ptr<Arena>> ImportArena(ArenaHandle handle) = 0;
  virtual absl::StatusOr<std::unique_ptr<HostBuffer>> AllocatePinned(uint64_t bytes) = 0;
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  // A copy engine writing into `arena`, which must outlive it.
  virtual absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCopyEngine(Arena& arena) = 0;
};

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_DEVICE_H_
