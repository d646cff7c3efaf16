#include "memdaemon/lease_table.h"

#include "absl/strings/str_cat.h"
#include "memdaemon/weight_layout.h"
#include "base/status.h"

namespace pswitch::memdaemon {

LeaseTable::LeaseTable(gpu::Arena* arena, uint64_t begin, uint64_t end, uint64_t alignment)
    : arena_(arena),
      begin_(begin),
      end_(end),
      alignment_(alignment),
      free_(begin, end > begin ? end - begin : 0) {}

absl::StatusOr<Lease> LeaseTable::Acquire(absl::string_view owner, uint64_t bytes) {
  if (owner.empty()) return absl::InvalidArgumentError("lease owner must be named");
  uint64_t rounded;
  if (bytes == 0 || !AlignUp(bytes, alignment_, &rounded)) {
    return absl::InvalidArgumentError(absl::StrCat("bad lease size ", bytes));
  }
  absl::MutexLock lock(&mu_);
  std::optional<uint64_t> offset = free_.Take(rounded);
  if (!offset.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no arena block of ", rounded, " bytes for '", owner,
        "' (largest free: ", free_.largest_bytes(), " of ", capacity_bytes(), " bytes)"));
  }
  Lease lease{*offset, rounded, std::string(owner)};
  leases_[lease.offset] = lease;
  return lease;
}

absl::Status LeaseTable::CheckOwner(uint64_t offset, absl::string_view owner) const {
  auto it = leases_.find(offset);
  if (it == leases_.end()) return absl::NotFoundError(absl::StrCat("no lease at ", offset));
  if (it->second.owner != owner) {
    return absl::PermissionDeniedError(absl::StrCat("lease at ", offset, " is held by '",
                                                    it->second.owner, "', not '", owner, "'"));
  }
  return absl::OkStatus();
}

absl::Status LeaseTable::Release(uint64_t offset, absl::string_view owner) {
  absl::MutexLock lock(&mu_);
  PSWITCH_RETURN_IF_ERROR(CheckOwner(offset, owner));
  uint64_t bytes = leases_[offset].bytes;
  leases_.erase(offset);
  free_.Give(offset, bytes);
  return absl::OkStatus();
}

absl::StatusOr<Lease> LeaseTable::Transfer(uint64_t offset, absl::string_view owner,
                                           absl::string_view new_owner, bool scrub) {
  if (new_owner.empty()) return absl::InvalidArgumentError("lease owner must be named");
  absl::MutexLock lock(&mu_);
  PSWITCH_RETURN_IF_ERROR(CheckOwner(offset, owner));
  Lease& lease = leases_[offset];
  if (scrub) PSWITCH_RETURN_IF_ERROR(arena_->Fill(lease.offset, lease.bytes, 0));
  lease.owner = std::string(new_owner);
  return lease;
}

std::vector<Lease> LeaseTable::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<Lease> out;
  for (const auto& [offset, lease] : leases_) out.push_back(lease);
  return out;
}

bool LeaseTable::AwaitLeaseCount(size_t count, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [this, count]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return leases_.size() == count; };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

uint64_t LeaseTable::largest_free_bytes() const {
  absl::MutexLock lock(&mu_);
  return free_.largest_bytes();
}

}  // namespace pswitch::memdaemon
