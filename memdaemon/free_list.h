// First-fit allocation of offsets in a range, with freed neighbours coalesced. The bookkeeping
// shared by the arena's lease table and the workers' activation allocator.
#ifndef PSWITCH_MEMDAEMON_FREE_LIST_H_
#define PSWITCH_MEMDAEMON_FREE_LIST_H_

#include <cstdint>
#include <map>
#include <optional>

namespace pswitch::memdaemon {

// Not thread-safe: owners guard it with their own mutex.
class FreeList {
 public:
  // The free range [begin, begin + bytes).
  FreeList(uint64_t begin, uint64_t bytes) {
    if (bytes > 0) free_[begin] = bytes;
  }

  // The offset of the first free block of at least `bytes`, now taken; nullopt when none fits.
  std::optional<uint64_t> Take(uint64_t bytes);
  // Returns [offset, offset + bytes), which must have come from Take.
  void Give(uint64_t offset, uint64_t bytes);
  uint64_t largest_bytes() const;

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes
};

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_FREE_LIST_H_
