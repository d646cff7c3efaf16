#include "pipeline/bubble_reporter.h"

namespace pswitch::pipeline {

void BubbleLog::Begin(int stage, absl::Duration expected, uint64_t free_bytes) {
  absl::MutexLock lock(&mu_);
  for (const BubbleRecord& r : records_) {
    if (r.stage == stage && r.end == absl::InfinitePast()) misordered_.push_back(stage);
  }
  records_.push_back({stage, expected, free_bytes, absl::Now(), absl::InfinitePast()});
}

void BubbleLog::End(int stage) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    if (it->stage != stage) continue;
    if (it->end != absl::InfinitePast()) break;
    it->end = now;
    return;
  }
  misordered_.push_back(stage);
}

std::vector<BubbleRecord> BubbleLog::Records() const {
  absl::MutexLock lock(&mu_);
  return records_;
}

std::vector<int> BubbleLog::MisorderedStages() const {
  absl::MutexLock lock(&mu_);
  return misordered_;
}

}  // namespace pswitch::pipeline
