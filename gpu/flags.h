// Ready and drain flags: 32-bit words inside the shared arena.
//
// Epoch protocol. Every transmission (switch) gets a fresh epoch from the memdaemon, counting up
// from 1 and never reused. The copy engine writes the epoch into group g's ready flag after the
// group's bytes landed; a consumer waiting for group g of epoch E is released when the flag
// reaches E. Comparisons are cyclic ((int32_t)(flag - E) >= 0, the same test as
// CU_STREAM_WAIT_VALUE_GEQ), so a flag still holding an earlier switch's epoch never releases a
// later wait, and a wait on an epoch that was superseded (the flag jumped past E) is released
// and reported as superseded rather than hanging. Drain flags work the same way: the previous
// tenant writes its release value once none of its work is in flight, and the copy engine waits
// for that value before writing the first byte of the next model.
#ifndef PSWITCH_GPU_FLAGS_H_
#define PSWITCH_GPU_FLAGS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pswitch::gpu {

// True when `value` has reached `target` in cyclic 32-bit order.
inline bool EpochReached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

// A view of `size()` flag words in an arena. Thread-safe; usable from any process that mapped
// the arena. Borrows the arena.
class FlagArray {
 public:
  virtual ~FlagArray() = default;
  virtual uint32_t size() const = 0;
  // Arena offset of word 0.
  virtual uint64_t arena_offset() const = 0;
  virtual absl::StatusOr<uint32_t> Load(uint32_t index) const = 0;
  // Writes `value` and wakes waiters (from the CPU; devices write through Stream::WriteFlag).
  virtual absl::Status Store(uint32_t index, uint32_t value) = 0;
  // Store, unless the word already holds `value` or a later epoch (cyclic order), atomically:
  // retiring a superseded switch's groups must never move a newer switch's flag back.
  virtual absl::Status Advance(uint32_t index, uint32_t value) = 0;
  // Blocks until word `index` reaches `target` (cyclic >=) and returns the value seen;
  // DeadlineExceeded after `timeout`, OutOfRange for a bad index.
  virtual absl::StatusOr<uint32_t> WaitAtLeast(uint32_t index, uint32_t target,
                                               absl::Duration timeout) const = 0;

  // A consumer's wait for group data of `epoch`: OK when the flag equals it, Aborted when a
  // newer epoch superseded it (the data is not this switch's), DeadlineExceeded on timeout.
  absl::Status WaitReady(uint32_t index, uint32_t epoch, absl::Duration timeout) const;
};

// After a task ran on a transmitted model: Aborted unless each of the `groups` ready flags from
// `base` holds exactly `epoch`. A device-side wait (>=) is released by a retired transmission's
// epoch + 1 just as by epoch itself, so a task whose transmission did not complete would
// otherwise finish on partly old weights. Both backends run this check after every task.
absl::Status CheckGroupsHoldEpoch(const FlagArray& flags, uint32_t base, uint32_t groups,
                                  uint32_t epoch);

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_FLAGS_H_
