// A training run's optimizer state (SGD momentum, Adam moments) in the arena, which the worker
// trains in place. Its room is one the scheduler's weights cache gave it in the GPU's weights
// pool (WeightsCache::ReserveState) and stays the cache's: this frees nothing. The state is
// filled from the run's host checkpoint (zeros the first time) when the run starts, or found as
// the task's last run left it there (InPlace); it is copied to a pinned host buffer when it must
// leave the GPU. The controller asks for these copies; it touches no arena bytes itself.
#ifndef PSWITCH_MEMDAEMON_STATE_AREA_H_
#define PSWITCH_MEMDAEMON_STATE_AREA_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "gpu/device.h"
#include "memdaemon/memdaemon.h"

namespace pswitch::memdaemon {

class StateArea {
 public:
  // The arena range the state lives in (at least its bytes: the cache's regions end on the
  // arena's access granularity).
  struct Room {
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };

  // `bytes` of state in `room`, filled from `checkpoint` when it has exactly that size, with
  // zeros otherwise (libtorch's first step from zero buffers equals its own lazily created
  // state); the room past the state is zeroed too (a worker is given all of it). InvalidArgument
  // when the room is outside the arena or smaller than the state.
  static absl::StatusOr<std::unique_ptr<StateArea>> Fill(
      MemDaemon& daemon, Room room, uint64_t bytes, std::unique_ptr<gpu::HostBuffer> checkpoint);
  // The state a preempted run left in `room`, as it is: nothing copied.
  static absl::StatusOr<std::unique_ptr<StateArea>> InPlace(MemDaemon& daemon, Room room,
                                                            uint64_t bytes);
  StateArea(const StateArea&) = delete;
  StateArea& operator=(const StateArea&) = delete;

  uint64_t offset() const { return room_.offset; }
  const MemDaemon* daemon() const { return daemon_; }
  // The state's own size.
  uint64_t bytes() const { return bytes_; }

  // Copies the state into a pinned host buffer (the one it was filled from, when it fits): the
  // task's next checkpoint. The room is the caller's to free afterwards.
  absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> Save();

 private:
  StateArea(MemDaemon* daemon, Room room, uint64_t bytes, std::unique_ptr<gpu::HostBuffer> staging)
      : daemon_(daemon), room_(room), bytes_(bytes), staging_(std::move(staging)) {}
  static absl::Status CheckRoom(MemDaemon& daemon, Room room, uint64_t bytes);

  MemDaemon* const daemon_;
  const Room room_;
  const uint64_t bytes_;
  std::unique_ptr<gpu::HostBuffer> staging_;  // reused for the save
};

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_STATE_AREA_H_
