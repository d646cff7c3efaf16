#include "worker/lease_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pswitch::worker {
namespace {

// Cache-line alignment, as libtorch's default CPU allocator gives (it uses 64 bytes).
constexpr uint64_t kAlignment = 64;

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
    : fallback_(fallback),
      fallback_raw_deleter_(fallback->raw_deleter()),
      blocks_(base, bytes, kAlignment) {}

c10::DataPtr LeaseAllocator::Allocate(size_t n) const {
  if (!active_.load(std::memory_order_acquire)) return fallback_->allocate(n);
  // A fill task's memory cap: it fails alone instead of taking what the main job may need.
  const uint64_t limit = limit_.load(std::memory_order_acquire);
  std::vector<LeaseBlocks::Range> to_clear;
  std::byte* ptr = blocks_.Take(n, limit, &to_clear);
  // Thrown as libtorch throws its own out-of-memory errors; the task boundary catches it.
  TORCH_CHECK(ptr != nullptr, blocks_.DescribeShortage(n, limit));
  // What an earlier owner left here (torch.empty would hand it to this task).
  for (const LeaseBlocks::Range& range : to_clear) std::memset(range.start, 0, range.bytes);
  // Context == data, as libtorch's raw interface requires.
  return c10::DataPtr(ptr, ptr, &LeaseAllocator::RawFree, c10::Device(c10::kCPU));
}

void LeaseAllocator::RawFree(void* ptr) {
  LeaseAllocator* self = g_installed.load(std::memory_order_acquire);
  if (self != nullptr && self->blocks_.Contains(ptr)) {
    self->blocks_.Give(ptr);  // not a block start: nothing of ours, nothing changes
  } else if (self != nullptr && self->fallback_raw_deleter_ != nullptr) {
    self->fallback_raw_deleter_(ptr);  // raw-allocated outside a task
  }
}

}  // namespace pswitch::worker
