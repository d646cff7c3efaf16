#include "memdaemon/state_area.h"

#include <span>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::memdaemon {

absl::StatusOr<std::unique_ptr<StateArea>> StateArea::Acquire(
    MemDaemon& daemon, const std::string& owner, uint64_t bytes,
    std::unique_ptr<gpu::HostBuffer> checkpoint, const std::function<bool()>& make_room) {
  absl::StatusOr<Lease> lease = daemon.leases().Acquire(owner, bytes);
  while (!lease.ok() && absl::IsResourceExhausted(lease.status()) && make_room && make_room()) {
    lease = daemon.leases().Acquire(owner, bytes);
  }
  if (!lease.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(owner, " needs ", bytes,
                                                     " bytes of optimizer state in the arena: ",
                                                     lease.status().message()));
  }
  std::unique_ptr<StateArea> area(new StateArea(&daemon, *lease, bytes, std::move(checkpoint)));
  absl::Status filled;
  if (area->staging_ != nullptr && area->staging_->size_bytes() == bytes) {
    filled = daemon.arena().CopyFromHost(
        lease->offset, std::span<const std::byte>(area->staging_->data(), bytes));
  } else {
    filled = daemon.arena().Fill(lease->offset, bytes, 0);  // on the device, no host copy
  }
  // The lease's last page past the state: zeros, not whatever its memory held before (a worker is
  // given the whole page).
  if (filled.ok() && lease->bytes > bytes) {
    filled = daemon.arena().Fill(lease->offset + bytes, lease->bytes - bytes, 0);
  }
  if (!filled.ok()) return filled;  // the destructor releases the lease
  return area;
}

StateArea::~StateArea() { (void)Release(); }

absl::Status StateArea::Release() {
  if (released_) return absl::OkStatus();
  released_ = true;
  return daemon_->leases().Release(lease_.offset, lease_.owner);
}

absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> StateArea::SaveAndRelease() {
  if (released_) return absl::FailedPreconditionError("optimizer state already released");
  if (staging_ == nullptr || staging_->size_bytes() != bytes_) {
    absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> pinned =
        daemon_->device().AllocatePinned(bytes_);
    if (!pinned.ok()) {
      (void)Release();
      return pinned.status();
    }
    staging_ = std::move(*pinned);
  }
  absl::Status copied =
      daemon_->arena().CopyToHost(lease_.offset, std::span<std::byte>(staging_->data(), bytes_));
  PSWITCH_RETURN_IF_ERROR(Release());
  if (!copied.ok()) return copied;
  return std::move(staging_);
}

}  // namespace pswitch::memdaemon
