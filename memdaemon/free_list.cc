#include "memdaemon/free_list.h"

#include <algorithm>
#include <iterator>

namespace pswitch::memdaemon {

std::optional<uint64_t> FreeList::Take(uint64_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    uint64_t offset = it->first;
    uint64_t rest = it->second - bytes;
    free_.erase(it);
    if (rest > 0) free_[offset + bytes] = rest;
    return offset;
  }
  return std::nullopt;
}

void FreeList::Give(uint64_t offset, uint64_t bytes) {
  auto it = free_.emplace(offset, bytes).first;
  // Coalesce with the next and the previous free block.
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

uint64_t FreeList::largest_bytes() const {
  uint64_t largest = 0;
  for (const auto& [offset, bytes] : free_) largest = std::max(largest, bytes);
  return largest;
}

}  // namespace pswitch::memdaemon
