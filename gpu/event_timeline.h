// Turning device events into host times, and pacing how far a copy stream runs ahead of what
// the CPU has seen. Pure logic, shared by the CUDA copy engine and its host-run tests.
#ifndef PSWITCH_GPU_EVENT_TIMELINE_H_
#define PSWITCH_GPU_EVENT_TIMELINE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gpu/copy_engine.h"

namespace pswitch::gpu {

// One group's end event: when the CPU saw it complete (CLOCK_MONOTONIC ns) and its time after
// the job's start event on the device clock (cudaEventElapsedTime).
struct EventObservation {
  int64_t seen_ns = 0;
  int64_t since_start_ns = 0;
};

// Host time of the job's start event. Each observation is late by its polling lag (>= 0), so
// seen - since_start bounds the start from above; the tightest bound is the smallest. Anchoring
// on when group 0 was *seen* instead would shift every time by group 0's copy plus the lag.
// Requires at least one observation.
int64_t AnchorStartNs(std::span<const EventObservation> observations);

// Per-group timings: group g's copy starts when group g-1's end event fired (group 0: at the
// start event; one stream runs them back to back) and its flag is ready at its own end event.
std::vector<GroupTiming> GroupTimings(std::span<const EventObservation> observations,
                                      std::span<const uint64_t> group_bytes);

// Which groups may be on the copy stream: the CPU keeps enqueueing while the bytes enqueued but
// not yet seen complete stay under `window_bytes` (always at least one group), so the stream
// never runs dry behind a slow CPU and a cancel still takes effect within about one window.
class LookaheadWindow {
 public:
  LookaheadWindow(std::span<const uint64_t> group_bytes, uint64_t window_bytes)
      : group_bytes_(group_bytes), window_bytes_(window_bytes) {}
  // True when group `enqueued()` may be enqueued now.
  bool MayEnqueue() const;
  void Enqueued() { in_flight_ += group_bytes_[enqueued_++]; }
  // The oldest enqueued group was seen complete.
  void Completed() { in_flight_ -= group_bytes_[completed_++]; }
  size_t enqueued() const { return enqueued_; }
  size_t completed() const { return completed_; }
  bool done() const { return completed_ == group_bytes_.size(); }

 private:
  const std::span<const uint64_t> group_bytes_;
  const uint64_t window_bytes_;
  size_t enqueued_ = 0;
  size_t completed_ = 0;
  uint64_t in_flight_ = 0;
};

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_EVENT_TIMELINE_H_
