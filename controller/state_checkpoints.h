// Host copies of training tasks' optimizer state while they are preempted, shared by every GPU's
// scheduler: a fill job may run on another GPU in its next bubble. The copies are pinned
// (portable) buffers, so saving and restoring them are DMA copies, not pageable ones. Thread-safe.
#ifndef PSWITCH_CONTROLLER_STATE_CHECKPOINTS_H_
#define PSWITCH_CONTROLLER_STATE_CHECKPOINTS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include <memory>

#include "absl/synchronization/mutex.h"
#include "gpu/device.h"

namespace pswitch::controller {

class StateCheckpoints {
 public:
  void Put(uint64_t key, std::unique_ptr<gpu::HostBuffer> bytes) {
    absl::MutexLock lock(&mu_);
    saved_[key] = std::move(bytes);
  }
  // Removes and returns the checkpoint; null when there is none.
  std::unique_ptr<gpu::HostBuffer> Take(uint64_t key) {
    absl::MutexLock lock(&mu_);
    auto it = saved_.find(key);
    if (it == saved_.end()) return nullptr;
    std::unique_ptr<gpu::HostBuffer> bytes = std::move(it->second);
    saved_.erase(it);
    return bytes;
  }
  void Drop(uint64_t key) {
    absl::MutexLock lock(&mu_);
    saved_.erase(key);
  }

 private:
  absl::Mutex mu_;
  std::map<uint64_t, std::unique_ptr<gpu::HostBuffer>> saved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_STATE_CHECKPOINTS_H_
