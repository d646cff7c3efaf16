// The blocks of one arena lease that an allocator has handed to libtorch: first fit with
// coalescing (memdaemon::FreeList) over the lease's aligned bytes, the size of every block in
// use, and usage figures. Shared by the CPU allocator (lease_allocator.h) and the CUDA one
// (cuda/cuda_lease_allocator.h); it never touches the memory, so the range may be device memory.
#ifndef PSWITCH_WORKER_LEASE_BLOCKS_H_
#define PSWITCH_WORKER_LEASE_BLOCKS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "memdaemon/free_list.h"

namespace pswitch::worker {

// Thread-safe: libtorch allocates and frees from several threads (intra-op pool, autograd).
class LeaseBlocks {
 public:
  // Blocks inside [base, base + bytes), each starting at a multiple of `alignment` (a power of
  // two); the range must stay mapped while blocks are in use.
  LeaseBlocks(std::byte* base, uint64_t bytes, uint64_t alignment);
  LeaseBlocks(const LeaseBlocks&) = delete;
  LeaseBlocks& operator=(const LeaseBlocks&) = delete;

  // The start of a free block of at least `bytes` (rounded up to the alignment, at least one
  // unit), now in use; nullptr when no free range is large enough, or when the block would take
  // the bytes in use past `limit_bytes` (0 = no limit below the lease size).
  // The limit counts only bytes taken since the last MarkPersistent.
  std::byte* Take(uint64_t bytes, uint64_t limit_bytes = 0);
  // The bytes in use now are the process's own for good (cuBLAS/cuDNN workspaces made by a
  // warm-up), not any task's: later limits do not count them.
  void MarkPersistent();
  // Returns the block starting at `ptr` to the free list. False, changing nothing, unless a block
  // in use starts there.
  bool Give(const void* ptr);
  // True when `ptr` lies inside the lease (in a block or not).
  bool Contains(const void* ptr) const {
    auto* p = static_cast<const std::byte*>(ptr);
    return p >= base_ && p < base_ + bytes_;
  }

  // Why a Take(bytes, limit_bytes) fails, for the allocators' error messages: the task memory
  // cap it would exceed, or the lease's usage and largest free block.
  std::string DescribeShortage(uint64_t bytes, uint64_t limit_bytes = 0) const;
  uint64_t in_use_bytes() const;
  uint64_t peak_bytes() const;
  uint64_t capacity_bytes() const { return bytes_; }

 private:
  uint64_t RoundUp(uint64_t bytes) const {
    return (std::max<uint64_t>(bytes, 1) + alignment_ - 1) & ~(alignment_ - 1);
  }

  std::byte* const base_;
  const uint64_t bytes_;
  const uint64_t alignment_;

  mutable absl::Mutex mu_;
  memdaemon::FreeList free_ ABSL_GUARDED_BY(mu_);           // offsets from base_
  std::map<uint64_t, uint64_t> used_ ABSL_GUARDED_BY(mu_);  // offset -> bytes
  uint64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t persistent_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes a limit counts.
  uint64_t TaskBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_use_ > persistent_ ? in_use_ - persistent_ : 0;
  }
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_LEASE_BLOCKS_H_
