// Serves libtorch's CPU allocations (intermediate tensors, gradients) from the worker's lease of
// the arena while a task runs, so the hot path never calls the system allocator and a task's
// memory is bounded by its lease. Outside tasks (model construction at load time) allocations go
// to libtorch's default allocator. A task that outgrows its lease fails alone, with an error
// naming the lease size, and frees what it had.
#ifndef PSWITCH_WORKER_LEASE_ALLOCATOR_H_
#define PSWITCH_WORKER_LEASE_ALLOCATOR_H_

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "models/torch_version.h"
#include "worker/lease_blocks.h"

namespace pswitch::worker {

// First-fit with coalescing over [base, base + bytes). Thread-safe (libtorch's intra-op threads
// may allocate). Blocks may outlive a task; they return to the lease whenever freed. It supports
// libtorch's raw (pointer-only) interface, which oneDNN uses, so there is one per process:
// Install() creates it, and it is never destroyed (tensors it served may live to the end).
class LeaseAllocator final : public c10::Allocator {
 public:
  // Creates the process's allocator over the lease and makes it libtorch's CPU allocator.
  // `fallback` serves allocations outside tasks. Call once.
  static LeaseAllocator* Install(std::byte* base, uint64_t bytes, c10::Allocator* fallback);

  // libtorch 2.3 made allocate() non-const and added copy_data().
#if PSWITCH_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Allocate(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &RawFree; }

  // While active, allocations come from the lease (and fail when it is full).
  void set_active(bool active) { active_.store(active, std::memory_order_release); }
  // Caps the bytes in use while active (0 = the whole lease): allocations beyond it fail.
  void set_limit(uint64_t bytes) { limit_.store(bytes, std::memory_order_release); }
  // Another model or principal's task begins: what earlier tasks left in the lease is zeroed
  // before any of it is handed out again (LeaseBlocks::NewOwner).
  void NewOwner() { blocks_.NewOwner(); }
  uint64_t dirty_bytes() const { return blocks_.dirty_bytes(); }
  uint64_t in_use_bytes() const { return blocks_.in_use_bytes(); }
  uint64_t peak_bytes() const { return blocks_.peak_bytes(); }
  uint64_t capacity_bytes() const { return blocks_.capacity_bytes(); }

 private:
  LeaseAllocator(std::byte* base, uint64_t bytes, c10::Allocator* fallback);
  c10::DataPtr Allocate(size_t n) const;
  // Frees a pointer this allocator (or, outside tasks, its fallback) returned.
  static void RawFree(void* ptr);

  c10::Allocator* const fallback_;
  const c10::DeleterFnPtr fallback_raw_deleter_;
  std::atomic<bool> active_{false};
  std::atomic<uint64_t> limit_{0};

  mutable LeaseBlocks blocks_;  // mutable: libtorch 1.x calls allocate() on a const allocator
};

// Activates `allocator` for a scope (one task).
class ScopedLeaseAllocation {
 public:
  explicit ScopedLeaseAllocation(LeaseAllocator* allocator) : allocator_(allocator) {
    if (allocator_ != nullptr) allocator_->set_active(true);
  }
  ~ScopedLeaseAllocation() {
    if (allocator_ != nullptr) allocator_->set_active(false);
  }
  ScopedLeaseAllocation(const ScopedLeaseAllocation&) = delete;
  ScopedLeaseAllocation& operator=(const ScopedLeaseAllocation&) = delete;

 private:
  LeaseAllocator* const allocator_;
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_LEASE_ALLOCATOR_H_
