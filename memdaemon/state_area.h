// A training task's optimizer state (SGD momentum, Adam moments) while it runs: an arena lease
// the worker trains in place, filled from the task's host checkpoint (zeros the first time) when
// it starts, and copied back to a pinned host buffer when it is preempted, so the preempting
// model gets the memory. The controller asks for these copies; it touches no arena bytes itself.
#ifndef PSWITCH_MEMDAEMON_STATE_AREA_H_
#define PSWITCH_MEMDAEMON_STATE_AREA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/device.h"
#include "memdaemon/memdaemon.h"

namespace pswitch::memdaemon {

class StateArea {
 public:
  // Leases `bytes` as `owner` and fills them from `checkpoint` when it has exactly that size,
  // with zeros otherwise (libtorch's first step from zero buffers equals its own lazily created
  // state). While no lease fits, `make_room` (when set) may free one and returns whether it did
  // (it blocks: an optimizer state kept resident is saved). ResourceExhausted naming the task
  // when the arena cannot hold it.
  static absl::StatusOr<std::unique_ptr<StateArea>> Acquire(
      MemDaemon& daemon, const std::string& owner, uint64_t bytes,
      std::unique_ptr<gpu::HostBuffer> checkpoint,
      const std::function<bool()>& make_room = nullptr);
  // Releases the lease (the state is dropped) unless SaveAndRelease did.
  ~StateArea();
  StateArea(const StateArea&) = delete;
  StateArea& operator=(const StateArea&) = delete;

  uint64_t offset() const { return lease_.offset; }
  const MemDaemon* daemon() const { return daemon_; }
  // The state's own size (its lease may be a little larger: leases end on a page).
  uint64_t bytes() const { return bytes_; }

  // Copies the state into a pinned host buffer (the one it was filled from, when it fits) and
  // releases the lease. The buffer is the task's next checkpoint.
  absl::StatusOr<std::unique_ptr<gpu::HostBuffer>> SaveAndRelease();

 private:
  StateArea(MemDaemon* daemon, Lease lease, uint64_t bytes,
            std::unique_ptr<gpu::HostBuffer> staging)
      : daemon_(daemon), lease_(std::move(lease)), bytes_(bytes), staging_(std::move(staging)) {}
  absl::Status Release();

  MemDaemon* const daemon_;
  const Lease lease_;
  const uint64_t bytes_;
  std::unique_ptr<gpu::HostBuffer> staging_;  // reused for the save
  bool released_ = false;
};

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_STATE_AREA_H_
