#include "worker/lease_blocks.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace pswitch::worker {
namespace {

// Offsets are kept relative to the base; the usable range starts at its first aligned byte.
uint64_t AlignmentSkew(const std::byte* base, uint64_t alignment) {
  return (alignment - reinterpret_cast<uintptr_t>(base) % alignment) % alignment;
}

uint64_t UsableBytes(const std::byte* base, uint64_t bytes, uint64_t alignment) {
  uint64_t skew = AlignmentSkew(base, alignment);
  return bytes > skew ? (bytes - skew) & ~(alignment - 1) : 0;
}

// Adds [start, end) to a set of disjoint [start, end) ranges, coalescing neighbours.
void AddRange(std::map<uint64_t, uint64_t>& set, uint64_t start, uint64_t end) {
  auto it = set.upper_bound(start);
  if (it != set.begin() && std::prev(it)->second >= start) {
    --it;
    start = it->first;
    end = std::max(end, it->second);
    it = set.erase(it);
  }
  while (it != set.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = set.erase(it);
  }
  set[start] = end;
}

// Removes [start, end) from `set`, calling `removed(s, e)` for each part of it that was there.
template <typename Fn>
void CutRange(std::map<uint64_t, uint64_t>& set, uint64_t start, uint64_t end, Fn removed) {
  auto it = set.upper_bound(start);
  if (it != set.begin() && std::prev(it)->second > start) --it;
  while (it != set.end() && it->first < end) {
    const uint64_t s = it->first, e = it->second;
    it = set.erase(it);
    if (s < start) set[s] = start;
    if (e > end) set[end] = e;
    removed(std::max(s, start), std::min(e, end));
  }
}

}  // namespace

LeaseBlocks::LeaseBlocks(std::byte* base, uint64_t bytes, uint64_t alignment)
    : base_(base),
      bytes_(bytes),
      alignment_(alignment),
      free_(AlignmentSkew(base, alignment), UsableBytes(base, bytes, alignment)) {}

std::byte* LeaseBlocks::Take(uint64_t bytes, uint64_t limit_bytes, std::vector<Range>* to_clear) {
  uint64_t size = RoundUp(bytes);
  absl::MutexLock lock(&mu_);
  if (limit_bytes != 0 && TaskBytes() + size > limit_bytes) return nullptr;
  std::optional<uint64_t> offset = free_.Take(size);
  if (!offset.has_value()) return nullptr;
  used_[*offset] = size;
  in_use_ += size;
  peak_ = std::max(peak_, in_use_);
  if (to_clear != nullptr) {
    CutRange(dirty_, *offset, *offset + size, [&](uint64_t s, uint64_t e) {
      to_clear->push_back(Range{base_ + s, e - s});
    });
  }
  AddRange(touched_, *offset, *offset + size);
  return base_ + *offset;
}

void LeaseBlocks::NewOwner() {
  absl::MutexLock lock(&mu_);
  for (const auto& [start, end] : touched_) AddRange(dirty_, start, end);
  touched_.clear();
}

uint64_t LeaseBlocks::dirty_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t bytes = 0;
  for (const auto& [start, end] : dirty_) bytes += end - start;
  return bytes;
}

bool LeaseBlocks::Give(const void* ptr) {
  if (!Contains(ptr)) return false;
  uint64_t offset = static_cast<uint64_t>(static_cast<const std::byte*>(ptr) - base_);
  absl::MutexLock lock(&mu_);
  auto used = used_.find(offset);
  if (used == used_.end()) return false;
  uint64_t size = used->second;
  used_.erase(used);
  in_use_ -= size;
  free_.Give(offset, size);
  return true;
}

std::string LeaseBlocks::DescribeShortage(uint64_t bytes, uint64_t limit_bytes) const {
  absl::MutexLock lock(&mu_);
  if (limit_bytes != 0 && TaskBytes() + RoundUp(bytes) > limit_bytes) {
    return absl::StrCat("task memory cap of ", limit_bytes, " bytes exceeded: ", bytes,
                        " bytes requested with ", TaskBytes(),
                        " in use by the task (the cap is the fill job's memory_bytes, or less when its bubble "
                        "has less free)");
  }
  return absl::StrCat("activation lease exhausted: ", bytes, " bytes requested, ", in_use_, " of ",
                      bytes_, " bytes in use, largest free block ", free_.largest_bytes(),
                      " bytes (raise pswitchd --activation-bytes)");
}

void LeaseBlocks::MarkPersistent() {
  absl::MutexLock lock(&mu_);
  persistent_ = in_use_;
}

uint64_t LeaseBlocks::in_use_bytes() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

uint64_t LeaseBlocks::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

}  // namespace pswitch::worker
