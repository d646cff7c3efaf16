// The host backend's model of a GPU's compute engine: without MPS, kernels of different
// processes on one GPU do not overlap; they time-slice. On the host, processes that "compute on
// GPU i" (pipetrain's simulated stages, fill steps) hold an exclusive lock on a per-device file
// while they compute, so an unmanaged co-located task delays the main job exactly as a
// time-sliced GPU would, and a well-behaved fill task (one that leaves at the bubble's end) does
// not.
#ifndef PSWITCH_GPU_HOST_COMPUTE_LOCK_H_
#define PSWITCH_GPU_HOST_COMPUTE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace pswitch::gpu {

class ComputeLock {
 public:
  // Opens (creating) the lock file; does not take the lock.
  static absl::StatusOr<ComputeLock> Open(const std::string& path);
  // The conventional lock file of host device `index` (shared by every process on the machine).
  static std::string DefaultPath(int index);

  // Holds the lock for its lifetime.
  class Hold {
   public:
    explicit Hold(int fd);
    ~Hold();
    Hold(Hold&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    Hold& operator=(Hold&&) = delete;

   private:
    int fd_;
  };
  Hold Acquire() const { return Hold(fd_.get()); }

 private:
  explicit ComputeLock(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_HOST_COMPUTE_LOCK_H_
