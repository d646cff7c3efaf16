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

// Whose checkpoint: a training task's (by task id) or a fill job's (by job id, kept across the
// job's bubble runs). Two key spaces, never mixed.
struct CheckpointKey {
  enum class Owner { kTask, kFillJob };
  Owner owner = Owner::kTask;
  uint64_t id = 0;
  static CheckpointKey Task(uint64_t id) { return {Owner::kTask, id}; }
  static CheckpointKey FillJob(uint64_t id) { return {Owner::kFillJob, id}; }
  auto operator<=>(const CheckpointKey&) const = default;
};

class StateCheckpoints {
 public:
  void Put(CheckpointKey key, std::unique_ptr<gpu::HostBuffer> bytes) {
    absl::MutexLock lock(&mu_);
    saved_[key] = std::move(bytes);
  }
  // Removes and returns the checkpoint; null when there is none.
  std::unique_ptr<gpu::HostBuffer> Take(CheckpointKey key) {
    absl::MutexLock lock(&mu_);
    auto it = saved_.find(key);
    if (it == saved_.end()) return nullptr;
    std::unique_ptr<gpu::HostBuffer> bytes = std::move(it->second);
    saved_.erase(it);
    return bytes;
  }
  void Drop(CheckpointKey key) {
    absl::MutexLock lock(&mu_);
    saved_.erase(key);
  }

 private:
  absl::Mutex mu_;
  std::map<CheckpointKey, std::unique_ptr<gpu::HostBuffer>> saved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_STATE_CHECKPOINTS_H_
