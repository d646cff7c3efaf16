// A bounded record of what happened on each GPU, for GET /v1/trace: a Chrome trace-event JSON
// timeline (opens in Perfetto and chrome://tracing). One process per GPU, one thread (track)
// per kind of activity: the copy stream's group copies, each worker's tasks, the queue, the
// switch's drain, the main job's bubbles and the fill runs in them, preemptions.
//
// Thread-safe. The ring keeps the newest `capacity` events; older ones are dropped, so memory
// stays bounded however long pswitchd runs.
#ifndef PSWITCH_CONTROLLER_TRACE_RECORDER_H_
#define PSWITCH_CONTROLLER_TRACE_RECORDER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pswitch::controller {

struct TraceEvent {
  int gpu = 0;
  std::string track;  // "copy", "worker 1", "queue", "bubbles", "fill", "scheduler"
  std::string name;
  std::string category;
  int64_t start_ns = 0;     // CLOCK_MONOTONIC
  int64_t duration_ns = 0;  // 0 with `instant`
  bool instant = false;
  std::vector<std::pair<std::string, std::string>> args;
};

class TraceRecorder {
 public:
  explicit TraceRecorder(size_t capacity = 200'000) : capacity_(capacity) {}

  void Record(TraceEvent event);
  // The events that ended within `window` before `now_ns`, as a Chrome trace-event JSON object
  // ({"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"clock": "CLOCK_MONOTONIC",
  // "origin_ns": N}}): metadata naming each GPU and track, then the events in time order, in
  // microseconds since the window's start, which lies at origin_ns.
  std::string ChromeJson(absl::Duration window, int64_t now_ns) const;
  size_t size() const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<TraceEvent> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_TRACE_RECORDER_H_
