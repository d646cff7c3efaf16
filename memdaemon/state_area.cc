#include "memdaemon/state_area.h"

#include <span>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::memdaemon {

absl::Status StateArea::CheckRoom(MemDaemon& daemon, Room room, uint64_t bytes) {
  const uint64_t arena = daemon.arena().size_bytes();
  if (bytes == 0 || bytes > room.bytes || room.offset > arena || room.bytes > arena - room.offset) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer state of ", bytes,
                                                   " bytes does not fit the room of ", room.bytes,
                                                   " bytes at arena offset ", room.offset));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StateArea>> StateArea::Fill(
    MemDaemon& daemon, Room room, uint64_t bytes, std::unique_ptr<gpu::HostBuffer> checkpoint) {
  PSWITCH_RETURN_IF_ERROR(CheckRoom(daemon, room, bytes));
  std::unique_ptr<StateArea> area(new StateArea(&daemon, room, bytes, std::move(checkpoint)));
  if (area->staging_ != nullptr && area->staging_->size_bytes() == bytes) {
    PSWITCH_RETURN_IF_ERROR(daemon.arena().CopyFromHost(
        room.offset, std::span<const std::byte>(area->staging_->data(), bytes)));
  } else {
    PSWITCH_RETURN_IF_ERROR(daemon.arena().Fill(room.offset, bytes, 0));  // on the device
  }
  // The room past the state: zeros, not whatever model's bytes it held before.
  if (room.bytes > bytes) {
    PSWITCH_RETURN_IF_ERROR(daemon.arena().Fill(room.offset + bytes, room.bytes - bytes, 0));
  }
  return area;
}

absl::StatusOr<std::unique_ptr<StateArea>> StateArea::InPlace(MemDaemon& daemon, Room room,
                                                              uint64_t bytes) {
  PSWITCH_RETURN_IF_ERROR(CheckRoom(daemon, room, bytes));
  return std::unique_ptr<StateArea>(new StateArea(&daemon, room, bytes, nullptr));
}

absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> StateArea::Save() {
  if (staging_ == nullptr || staging_->size_bytes() != bytes_) {
    PSWITCH_ASSIGN_OR_RETURN(staging_, daemon_->device().AllocatePinned(bytes_));
  }
  PSWITCH_RETURN_IF_ERROR(
      daemon_->arena().CopyToHost(room_.offset, std::span<std::byte>(staging_->data(), bytes_)));
  return std::move(staging_);
}

}  // namespace pswitch::memdaemon
