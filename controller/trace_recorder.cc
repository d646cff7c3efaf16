#include "controller/trace_recorder.h"

#include <algorithm>
#include <map>
#include <set>

#include "nlohmann/json.hpp"

namespace pswitch::controller {

using nlohmann::json;

void TraceRecorder::Record(TraceEvent event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
  while (events_.size() > capacity_) events_.pop_front();
}

size_t TraceRecorder::size() const {
  absl::MutexLock lock(&mu_);
  return events_.size();
}

std::string TraceRecorder::ChromeJson(absl::Duration window, int64_t now_ns) const {
  const int64_t from_ns = now_ns - absl::ToInt64Nanoseconds(window);
  std::vector<TraceEvent> picked;
  {
    absl::MutexLock lock(&mu_);
    for (const TraceEvent& e : events_) {
      if (e.start_ns + e.duration_ns >= from_ns && e.start_ns <= now_ns) picked.push_back(e);
    }
  }
  std::stable_sort(picked.begin(), picked.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_ns < b.start_ns;
  });
  // Tracks get stable thread ids per GPU, in order of first appearance.
  std::map<std::pair<int, std::string>, int> tids;
  std::set<int> gpus;
  json events = json::array();
  for (const TraceEvent& e : picked) {
    gpus.insert(e.gpu);
    auto [it, added] = tids.try_emplace({e.gpu, e.track}, static_cast<int>(tids.size()) + 1);
    if (added) {
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", e.gpu}, {"tid", it->second},
                        {"args", {{"name", e.track}}}});
    }
  }
  for (int gpu : gpus) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", gpu}, {"tid", 0},
                      {"args", {{"name", "GPU " + std::to_string(gpu)}}}});
  }
  for (const TraceEvent& e : picked) {
    json args = json::object();
    for (const auto& [k, v] : e.args) args[k] = v;
    json event{{"name", e.name},
               {"cat", e.category},
               {"ph", e.instant ? "i" : "X"},
               {"ts", static_cast<double>(e.start_ns - from_ns) / 1e3},
               {"pid", e.gpu},
               {"tid", tids.at({e.gpu, e.track})},
               {"args", std::move(args)}};
    if (e.instant) {
      event["s"] = "t";
    } else {
      event["dur"] = static_cast<double>(e.duration_ns) / 1e3;
    }
    events.push_back(std::move(event));
  }
  // Where ts 0 lies on this node's CLOCK_MONOTONIC, so events can be matched with other
  // processes' times (a main job's own bubbles, bench-bubbles).
  return json{{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"clock", "CLOCK_MONOTONIC"}, {"origin_ns", from_ns}}}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace pswitch::controller
