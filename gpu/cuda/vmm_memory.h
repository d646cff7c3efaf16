// Device memory made with CUDA's virtual memory management API, so that each process maps only
// the ranges it is granted (issue 29 item 2). Internal to gpu/cuda.
//
// The arena is a row of chunks, each its own physical allocation of the driver's mapping
// granularity (2 MiB), mapped side by side in one virtual range: the driver maps an allocation
// only whole (cuMemMap's offset "currently must be zero", and a smaller size is refused with
// CUDA_ERROR_NOT_SUPPORTED: found on the H200, 2026-11-27), so a grant of part of the arena must
// be made of whole allocations. The owner (the memdaemon) creates and maps every chunk; an
// importer (a worker) reserves a virtual range of the same size and maps, at the same offsets,
// only the chunks of what it is granted, importing each chunk's fd the first time it needs it
// (ChunkSource: from the memdaemon, or the owner in the same process). An arena offset names the
// same bytes everywhere, an address the importer did not map faults on the GPU, and a write to a
// read-only grant too.
//
// Costs: a grant of n chunks is n cuMemMap calls (plus n imports the first time) and one
// cuMemSetAccess for the whole range; a revoke n cuMemUnmap calls, which the driver may make
// wait for this process's device work, so callers revoke only once that work has finished.
#ifndef PSWITCH_GPU_CUDA_VMM_MEMORY_H_
#define PSWITCH_GPU_CUDA_VMM_MEMORY_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/unique_fd.h"
#include "gpu/cuda/driver_api.h"
#include "gpu/device.h"

namespace pswitch::gpu::cuda {

// Thread-safe.
class VmmMemory {
 public:
  // The owner: `bytes` (rounded up to whole chunks) on `device`, every chunk mapped read-write.
  // The CUDA context of `device` must be current.
  static absl::StatusOr<std::unique_ptr<VmmMemory>> Create(int device, uint64_t bytes,
                                                           const VmmApi* api);
  // An importer of the owner's `bytes` in chunks of `chunk_bytes` (the owner's granularity);
  // nothing is mapped until SetAccess grants it. `chunks` gives the fds of the chunks it maps,
  // asked for kMaxArenaChunksPerFetch at most at a time, each batch imported before the next.
  static absl::StatusOr<std::unique_ptr<VmmMemory>> Import(int device, uint64_t bytes,
                                                           uint64_t chunk_bytes, const VmmApi* api,
                                                           ArenaChunkSource chunks);
  ~VmmMemory();
  VmmMemory(const VmmMemory&) = delete;
  VmmMemory& operator=(const VmmMemory&) = delete;

  std::byte* base() const { return reinterpret_cast<std::byte*>(base_); }
  // The chunk size: the unit of allocation, mapping and access.
  uint64_t granularity() const { return chunk_bytes_; }
  uint64_t chunk_count() const { return chunk_count_; }
  // Owner only: new descriptors for chunks [first, first + count).
  absl::StatusOr<std::vector<UniqueFd>> ExportChunks(uint64_t first, uint64_t count) const;
  // Importer: asks the driver, once, whether it maps device memory read-only (on the first
  // chunk, whose device bytes hold nothing). Where it does not, a kRead grant maps read-write
  // and read_only_supported() is false (the caller says so in its log).
  absl::Status ProbeReadOnly();
  bool read_only_supported() const;
  // Importer: what this process may do with [offset, offset + bytes), widened to whole chunks;
  // every other chunk keeps its access.
  absl::Status SetAccess(uint64_t offset, uint64_t bytes, Arena::Access access);

 private:
  VmmMemory(int device, const VmmApi* api, uint64_t chunk_bytes, uint64_t chunk_count, bool owner,
            ArenaChunkSource chunks)
      : device_(device),
        api_(api),
        chunk_bytes_(chunk_bytes),
        chunk_count_(chunk_count),
        owner_(owner),
        source_(std::move(chunks)),
        handles_(chunk_count, 0),
        mapped_(chunk_count, false),
        access_(chunk_count, Arena::Access::kNone) {}
  absl::Status Reserve();
  // Imports the chunks of [first, end) this process has no handle for yet.
  absl::Status ImportChunks(uint64_t first, uint64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Protect(uint64_t first, uint64_t end, Arena::Access access)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MapChunk(uint64_t chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UnmapChunk(uint64_t chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CUdeviceptr At(uint64_t chunk) const { return base_ + chunk * chunk_bytes_; }

  const int device_;
  const VmmApi* const api_;
  const uint64_t chunk_bytes_;
  const uint64_t chunk_count_;
  const bool owner_;
  const ArenaChunkSource source_;
  CUdeviceptr base_ = 0;
  mutable absl::Mutex mu_;
  bool read_only_supported_ ABSL_GUARDED_BY(mu_) = true;
  // Per chunk: its allocation in this process (0: none yet), whether it is mapped here, and
  // the access last set on it (kNone where unmapped).
  std::vector<CUmemGenericAllocationHandle> handles_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> mapped_ ABSL_GUARDED_BY(mu_);
  std::vector<Arena::Access> access_ ABSL_GUARDED_BY(mu_);
};

// What the current device may do at `at` as its driver reports it (CU_POINTER_ATTRIBUTE_ACCESS_
// FLAGS; kNone for an address nothing is mapped at), without touching the memory: tests and
// self-checks ask this instead of faulting the context.
absl::StatusOr<Arena::Access> DeviceAccessAt(const void* at);

}  // namespace pswitch::gpu::cuda

#endif  // PSWITCH_GPU_CUDA_VMM_MEMORY_H_
