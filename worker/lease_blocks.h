// The blocks of one arena lease that an allocator has handed to libtorch: first fit with
// coalescing (memdaemon::FreeList) over the lease's aligned bytes, the size of every block in
// use, and usage figures. Shared by the CPU allocator (lease_allocator.h) and the CUDA one
// (cuda/cuda_lease_allocator.h); it never touches the memory, so the range may be device memory.
//
// Clearing between owners. A block handed out first-fit holds whatever the last task left there
// (an archive returning torch.empty would read it). The lease therefore tracks which bytes were
// handed out since the current owner (a model and principal: the worker decides) began, and
// NewOwner() marks all of them dirty. Take() reports the dirty parts of the block it returns and
// forgets them: the allocator clears exactly those (memset; on CUDA a memset on the compute
// stream) before anyone sees the block. A task pays only for the bytes it takes that an earlier
// owner touched, and a block that was in use across the change (a warm-up's cuBLAS workspace)
// is cleared when it is next handed out.
#ifndef PSWITCH_WORKER_LEASE_BLOCKS_H_
#define PSWITCH_WORKER_LEASE_BLOCKS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

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

  // A range of the lease an allocator must clear before handing its block out.
  struct Range {
    std::byte* start;
    uint64_t bytes;
  };

  // The start of a free block of at least `bytes` (rounded up to the alignment, at least one
  // unit), now in use; nullptr when no free range is large enough, or when the block would take
  // the bytes in use past `limit_bytes` (0 = no limit below the lease size).
  // The limit counts only bytes taken since the last MarkPersistent. When `to_clear` is given,
  // the parts of the block an earlier owner touched are appended to it (and count as clean from
  // now on): the caller clears them before the block is used.
  std::byte* Take(uint64_t bytes, uint64_t limit_bytes = 0, std::vector<Range>* to_clear = nullptr);
  // Another owner begins: every byte handed out until now is dirty until cleared.
  void NewOwner();
  // Bytes an owner change left dirty and no Take has cleared yet.
  uint64_t dirty_bytes() const;
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
  // Disjoint, coalesced [start, end) offsets: handed out under the current owner, and written
  // under an earlier one and not cleared since.
  std::map<uint64_t, uint64_t> touched_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> dirty_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_LEASE_BLOCKS_H_
