#include "gpu/event_timeline.h"

#include <algorithm>
#include <limits>

namespace pswitch::gpu {

int64_t AnchorStartNs(std::span<const EventObservation> observations) {
  int64_t anchor = std::numeric_limits<int64_t>::max();
  for (const EventObservation& o : observations) anchor = std::min(anchor, o.seen_ns - o.since_start_ns);
  return anchor;
}

std::vector<GroupTiming> GroupTimings(std::span<const EventObservation> observations,
                                      std::span<const uint64_t> group_bytes) {
  std::vector<GroupTiming> timings(observations.size());
  if (observations.empty()) return timings;
  const int64_t start = AnchorStartNs(observations);
  for (size_t g = 0; g < observations.size(); ++g) {
    timings[g].copy_start_ns = g == 0 ? start : start + observations[g - 1].since_start_ns;
    timings[g].ready_ns = start + observations[g].since_start_ns;
    timings[g].bytes = g < group_bytes.size() ? group_bytes[g] : 0;
  }
  return timings;
}

bool LookaheadWindow::MayEnqueue() const {
  if (enqueued_ >= group_bytes_.size()) return false;
  if (enqueued_ == completed_) return true;  // nothing in flight: always make progress
  return in_flight_ + group_bytes_[enqueued_] <= window_bytes_;
}

}  // namespace pswitch::gpu
