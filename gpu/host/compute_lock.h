// The host backend's model of a GPU's compute engine: without MPS, kernels of different
// processes on one GPU do not overlap; they time-slice. On the host, processes that "compute on
// GPU i" (pipetrain's simulated stages, fill steps) hold an exclusive lock on a per-device file
// while they compute, so an unmanaged co-located task delays the main job exactly as a
// time-sliced GPU would, and a well-behaved fill task (one that leaves at the bubble's end) does
// not.
#ifndef PSWITCH_GPU_HOST_COMPUTE_LOCK_H_
#define PSWITCH_GPU_HOST_COMPUTE_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "gpu/activity_page.h"

namespace pswitch::gpu {

class ComputeLock {
 public:
  // Opens (creating) the lock file; does not take the lock. `record_activity`: every hold is
  // counted in the device's activity page (`path` + ".activity", gpu/activity_page.h), as a
  // GPU shows a job's kernels: the main job's holds, which pswitchd's bubble detection reads,
  // not a fill task's.
  static absl::StatusOr<ComputeLock> Open(const std::string& path, bool record_activity = false);
  // The conventional lock file of host device `index` (shared by every process on the machine,
  // or by those given the same $PSWITCH_HOST_DEVICE_DIR).
  static std::string DefaultPath(int index);

  // Holds the lock for its lifetime.
  class Hold {
   public:
    Hold(int fd, ActivityWriter* activity);
    ~Hold();
    Hold(Hold&& other) noexcept : fd_(other.fd_), activity_(other.activity_) {
      other.fd_ = -1;
      other.activity_ = nullptr;
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    Hold& operator=(Hold&&) = delete;

   private:
    int fd_;
    ActivityWriter* activity_;  // null: not recorded
  };
  Hold Acquire() const { return Hold(fd_.get(), activity_.get()); }

 private:
  ComputeLock(UniqueFd fd, std::shared_ptr<ActivityWriter> activity)
      : fd_(std::move(fd)), activity_(std::move(activity)) {}
  UniqueFd fd_;
  std::shared_ptr<ActivityWriter> activity_;
};

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_HOST_COMPUTE_LOCK_H_
