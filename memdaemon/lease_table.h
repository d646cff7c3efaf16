// Sub-allocation of the arena's data region into leases, each with exactly one owner.
#ifndef PSWITCH_MEMDAEMON_LEASE_TABLE_H_
#define PSWITCH_MEMDAEMON_LEASE_TABLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/device.h"
#include "memdaemon/free_list.h"

namespace pswitch::memdaemon {

struct Lease {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::string owner;
};

// First-fit over [begin, end) with `alignment`-aligned leases; freed neighbours coalesce.
// Thread-safe. `*arena` (used only to scrub) must outlive the table.
class LeaseTable {
 public:
  LeaseTable(gpu::Arena* arena, uint64_t begin, uint64_t end, uint64_t alignment);
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  // ResourceExhausted (naming the largest free block) when no free block fits.
  absl::StatusOr<Lease> Acquire(absl::string_view owner, uint64_t bytes);
  // NotFound for an unknown offset; PermissionDenied when `owner` does not hold it.
  absl::Status Release(uint64_t offset, absl::string_view owner);
  // Hands the lease to `new_owner`, zeroing it first when `scrub` (so no tenant reads another's
  // data). Same errors as Release.
  absl::StatusOr<Lease> Transfer(uint64_t offset, absl::string_view owner,
                                 absl::string_view new_owner, bool scrub);
  std::vector<Lease> List() const;
  // Blocks until exactly `count` leases are held (e.g. a dead worker's were reclaimed); false
  // on timeout.
  bool AwaitLeaseCount(size_t count, absl::Duration timeout) const;
  uint64_t capacity_bytes() const { return end_ - begin_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t largest_free_bytes() const;

 private:
  absl::Status CheckOwner(uint64_t offset, absl::string_view owner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  gpu::Arena* const arena_;
  const uint64_t begin_;
  const uint64_t end_;
  const uint64_t alignment_;

  mutable absl::Mutex mu_;
  FreeList free_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);  // offset -> lease
};

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_LEASE_TABLE_H_
