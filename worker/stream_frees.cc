#include "worker/stream_frees.h"

namespace pswitch::worker {

void StreamFrees::Freed(void* block, Stream stream) {
  absl::MutexLock lock(&mu_);
  for (Frees& frees : streams_) {
    if (frees.stream == stream) {
      frees.unfenced.push_back(block);
      return;
    }
  }
  streams_.push_back(Frees{stream, {block}, {}});
}

std::vector<void*> StreamFrees::Reusable(Stream stream, bool fence) {
  std::vector<void*> reusable;
  absl::MutexLock lock(&mu_);
  for (Frees& frees : streams_) {
    if (frees.stream == stream) {
      // Stream order covers every use.
      reusable.insert(reusable.end(), frees.unfenced.begin(), frees.unfenced.end());
      frees.unfenced.clear();
      for (auto& [event, blocks] : frees.fenced) {
        reusable.insert(reusable.end(), blocks.begin(), blocks.end());
        ops_.recycle(event);
      }
      frees.fenced.clear();
      continue;
    }
    if (fence && !frees.unfenced.empty()) {
      if (Event event = ops_.record(frees.stream); event != nullptr) {
        frees.fenced.emplace_back(event, std::move(frees.unfenced));
        frees.unfenced.clear();
      }
    }
    while (!frees.fenced.empty() && ops_.completed(frees.fenced.front().first)) {
      std::vector<void*>& blocks = frees.fenced.front().second;
      reusable.insert(reusable.end(), blocks.begin(), blocks.end());
      ops_.recycle(frees.fenced.front().first);
      frees.fenced.pop_front();
    }
  }
  return reusable;
}

bool StreamFrees::waiting() const {
  absl::MutexLock lock(&mu_);
  for (const Frees& frees : streams_) {
    if (!frees.fenced.empty()) return true;
  }
  return false;
}

}  // namespace pswitch::worker
