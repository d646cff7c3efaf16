// Host copies of training tasks' optimizer state while they are preempted, shared by every GPU's
// scheduler: a fill job may run on another GPU in its next bubble. Thread-safe.
#ifndef PSWITCH_CONTROLLER_STATE_CHECKPOINTS_H_
#define PSWITCH_CONTROLLER_STATE_CHECKPOINTS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace pswitch::controller {

class StateCheckpoints {
 public:
  void Put(uint64_t key, std::vector<std::byte> bytes) {
    absl::MutexLock lock(&mu_);
    saved_[key] = std::move(bytes);
  }
  // Removes and returns the checkpoint; nullopt when there is none.
  std::optional<std::vector<std::byte>> Take(uint64_t key) {
    absl::MutexLock lock(&mu_);
    auto it = saved_.find(key);
    if (it == saved_.end()) return std::nullopt;
    std::vector<std::byte> bytes = std::move(it->second);
    saved_.erase(it);
    return bytes;
  }
  void Drop(uint64_t key) {
    absl::MutexLock lock(&mu_);
    saved_.erase(key);
  }

 private:
  absl::Mutex mu_;
  std::map<uint64_t, std::vector<std::byte>> saved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_STATE_CHECKPOINTS_H_
