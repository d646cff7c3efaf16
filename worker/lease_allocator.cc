#include "worker/lease_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"

namespace pswitch::worker {
namespace {

// Cache-line alignment, as libtorch's default CPU allocator gives (it uses 64 bytes).
constexpr uint64_t kAlignment = 64;

// Offsets are kept relative to the base; the usable range starts at its first aligned byte.
uint64_t AlignmentSkew(const std::byte* base) {
  return (kAlignment - reinterpret_cast<uintptr_t>(base) % kAlignment) % kAlignment;
}

}  // namespace

// The one instance RawFree reaches (raw deleters are plain function pointers).
std::atomic<LeaseAllocator*> g_installed{nullptr};

LeaseAllocator* LeaseAllocator::Install(std::byte* base, uint64_t bytes, c10::Allocator* fallback) {
  auto* allocator = new LeaseAllocator(base, bytes, fallback);
  g_installed.store(allocator, std::memory_order_release);
  c10::SetCPUAllocator(allocator, /*priority=*/100);
  return allocator;
}

LeaseAllocator::LeaseAllocator(std::byte* base, uint64_t bytes, c10::Allocator* fallback)
    : base_(base),
      bytes_(bytes),
      fallback_(fallback),
      fallback_raw_deleter_(fallback->raw_deleter()),
      free_(AlignmentSkew(base),
            bytes > AlignmentSkew(base) ? (bytes - AlignmentSkew(base)) & ~(kAlignment - 1) : 0) {}

c10::DataPtr LeaseAllocator::Allocate(size_t n) const {
  if (!active_.load(std::memory_order_acquire)) return fallback_->allocate(n);
  uint64_t size = (std::max<uint64_t>(n, 1) + kAlignment - 1) & ~(kAlignment - 1);
  uint64_t offset = 0;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t limit = limit_.load(std::memory_order_acquire);
    // A fill task's memory cap: it fails alone instead of taking what the main job may need.
    TORCH_CHECK(limit == 0 || in_use_ + size <= limit, "task memory cap of ", limit,
                " bytes exceeded: ", n, " bytes requested with ", in_use_, " in use");
    std::optional<uint64_t> taken = free_.Take(size);
    // Thrown as libtorch throws its own out-of-memory errors; the task boundary catches it.
    TORCH_CHECK(taken.has_value(), "worker activation lease exhausted: ", n, " bytes requested, ",
                in_use_, " of ", bytes_, " bytes in use (raise pswitchd --activation-bytes)");
    offset = *taken;
    in_use_ += size;
    peak_ = std::max(peak_, in_use_);
    used_[offset] = size;
  }
  // Context == data, as libtorch's raw interface requires.
  void* ptr = base_ + offset;
  return c10::DataPtr(ptr, ptr, &LeaseAllocator::RawFree, c10::Device(c10::kCPU));
}

void LeaseAllocator::RawFree(void* ptr) {
  LeaseAllocator* self = g_installed.load(std::memory_order_acquire);
  auto* p = static_cast<std::byte*>(ptr);
  if (self != nullptr && p >= self->base_ && p < self->base_ + self->bytes_) {
    self->Release(static_cast<uint64_t>(p - self->base_));
  } else if (self != nullptr && self->fallback_raw_deleter_ != nullptr) {
    self->fallback_raw_deleter_(ptr);  // raw-allocated outside a task
  }
}

void LeaseAllocator::Release(uint64_t offset) const {
  absl::MutexLock lock(&mu_);
  auto used = used_.find(offset);
  if (used == used_.end()) return;  // not a block start: nothing of ours
  uint64_t bytes = used->second;
  used_.erase(used);
  in_use_ -= bytes;
  free_.Give(offset, bytes);
}

uint64_t LeaseAllocator::in_use_bytes() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

uint64_t LeaseAllocator::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

}  // namespace pswitch::worker
