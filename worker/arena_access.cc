#include "worker/arena_access.h"

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"

namespace pswitch::worker {

ArenaAccess::~ArenaAccess() {
  absl::Status ended = EndTask();
  if (absl::Status model = EndModel(); ended.ok()) ended = model;
  if (!ended.ok()) {
    base::Log(base::LogLevel::kWarn, "arena_access_not_revoked").Field("error", ended);
  }
}

absl::Status ArenaAccess::GrantForever(uint64_t offset, uint64_t bytes) {
  if (!enforced_) return absl::OkStatus();
  // Leases and regions start and end on pages, so taking a task's grant back never touches it.
  return arena_->SetAccess(offset, bytes, gpu::Arena::Access::kReadWrite);
}

absl::StatusOr<uint64_t> ArenaAccess::OffsetOf(const std::byte* at, uint64_t bytes) const {
  const std::byte* base = arena_->base();
  if (at < base || static_cast<uint64_t>(at - base) > arena_->size_bytes() ||
      bytes > arena_->size_bytes() - static_cast<uint64_t>(at - base)) {
    return absl::OutOfRangeError("an arena grant outside the arena");
  }
  return static_cast<uint64_t>(at - base);
}

absl::Status ArenaAccess::GrantModel(const std::byte* at, uint64_t bytes,
                                     gpu::Arena::Access access) {
  if (!enforced_) return absl::OkStatus();
  PSWITCH_ASSIGN_OR_RETURN(uint64_t offset, OffsetOf(at, bytes));
  if (model_.offset == offset && model_.bytes == bytes && model_.access == access) {
    return absl::OkStatus();
  }
  if (model_.access != gpu::Arena::Access::kNone &&
      (model_.offset != offset || model_.bytes != bytes)) {
    PSWITCH_RETURN_IF_ERROR(EndModel());
  }
  // Recorded first: should the grant fail part way, EndModel still takes back all of it.
  model_ = Range{offset, bytes, access};
  return arena_->SetAccess(offset, bytes, access);
}

absl::Status ArenaAccess::EndModel() {
  if (!enforced_ || model_.access == gpu::Arena::Access::kNone) return absl::OkStatus();
  PSWITCH_RETURN_IF_ERROR(
      arena_->SetAccess(model_.offset, model_.bytes, gpu::Arena::Access::kNone));
  model_ = Range{};
  return absl::OkStatus();
}

absl::Status ArenaAccess::GrantForTask(const std::byte* at, uint64_t bytes,
                                       gpu::Arena::Access access) {
  if (!enforced_) return absl::OkStatus();
  PSWITCH_ASSIGN_OR_RETURN(uint64_t offset, OffsetOf(at, bytes));
  PSWITCH_RETURN_IF_ERROR(arena_->SetAccess(offset, bytes, access));
  task_.push_back({offset, bytes, access});
  return absl::OkStatus();
}

absl::Status ArenaAccess::EndTask() {
  absl::Status first;
  for (const Range& r : task_) {
    absl::Status revoked = arena_->SetAccess(r.offset, r.bytes, gpu::Arena::Access::kNone);
    if (first.ok()) first = revoked;
  }
  task_.clear();
  // A training run's write access to its model ends with it.
  if (model_.access == gpu::Arena::Access::kReadWrite) {
    absl::Status read_only =
        arena_->SetAccess(model_.offset, model_.bytes, gpu::Arena::Access::kRead);
    if (read_only.ok()) model_.access = gpu::Arena::Access::kRead;
    if (first.ok()) first = read_only;
  }
  return first;
}

}  // namespace pswitch::worker
