// What pswitchd's parts report as they work, kept as Prometheus metrics (prometheus-cpp) for
// GET /metrics. The scheduler, switcher, worker pool and fill manager call the event methods;
// the HTTP port adds the gauges that are read at scrape time (queue depth, arena, fill jobs) and
// serializes. Names follow Prometheus conventions: base units, `_total`, `_seconds`, `_bytes`;
// labels `gpu`, `model`, `kind`.
//
// Thread-safe. Every event method is cheap (a few atomic adds) and never blocks on I/O, so it
// may be called from the scheduler's event loop.
#ifndef PSWITCH_CONTROLLER_TELEMETRY_H_
#define PSWITCH_CONTROLLER_TELEMETRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "controller/task_queue.h"
#include "controller/task_spec.h"
#include "controller/trace_recorder.h"
#include "controller/weights_cache.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace pswitch::controller {

// The state of one GPU at scrape time.
struct GpuGauges {
  int gpu = 0;
  size_t queue_depth = 0;  // queued and running tasks
  uint64_t arena_used_bytes = 0;
  uint64_t arena_free_bytes = 0;
};

// The node's state at scrape time.
struct NodeGauges {
  uint64_t pinned_weight_bytes = 0;  // registered models' weights in pinned host memory
  size_t models = 0;                 // registered models
};

class Telemetry {
 public:
  Telemetry();
  ~Telemetry();
  Telemetry(const Telemetry&) = delete;
  Telemetry& operator=(const Telemetry&) = delete;

  // A task ended. `queue_wait` is arrival to start (zero when it never started), `latency`
  // arrival to its answer; failed tasks count in failures, not in the latency histograms.
  void TaskFinished(int gpu, const std::string& model, TaskKind kind, absl::Duration queue_wait,
                    absl::Duration latency, bool ok);
  // A task whose model had to be transmitted: its switch as phases after its arrival, and the
  // bytes copied.
  void Switched(int gpu, const std::string& model, const SwitchTimeline& timeline,
                uint64_t bytes);
  // One run of a task on worker `slot` ended (a preempted training task has several): its
  // timeline goes to the trace.
  void TaskRan(int gpu, uint64_t task, const std::string& model, TaskKind kind, int slot,
               const SwitchTimeline& timeline, bool ok);
  void Preempted(int gpu);
  // `model`'s weights were evicted from `gpu`'s cache to make room for `for_model` (the trace).
  void Evicted(int gpu, const std::string& model, const std::string& for_model);
  void WorkerKilled(int gpu);
  void WorkerRestarted(int gpu);
  void LinkMeasured(int gpu, double bytes_per_s);
  // The GPU's weights cache as it stands (its counters only grow).
  void WeightsCache(int gpu, const WeightsCacheStats& stats);
  // Starts `gpu`'s counters at zero, so a scrape shows them before their first event (and
  // rate() sees the first one).
  void AddGpu(int gpu);
  // Fill: the main job's bubble time on a GPU, fill step time spent inside bubbles, one fill
  // run's pause latency (bubble end to paused). A bubble is on the trace's "bubbles" track, with
  // `used` where it is known at its end: what a resident fill run completed in it (its steps and
  // their time; a step suspended across bubbles counts whole in the one it ended in), so the
  // share used can be read per bubble (validate.sh's bubbles step does).
  struct BubbleUse {
    absl::Duration step_time;
    uint64_t steps = 0;
  };
  void BubbleTime(int gpu, absl::Duration bubble, std::optional<BubbleUse> used = std::nullopt);
  // A bubble found from the main job's activity (--detect-bubbles) and given to fill work:
  // idle from `began_ns` (its first empty window), announced at `announced_ns` with `expected`
  // from `began_ns` to fill, ended at `ended_ns` (CLOCK_MONOTONIC); `phase`: the detector's.
  // Counted, and on the trace's "detected" track, so found bubbles can be checked against the
  // job's own (bench-bubbles: precision, recall, detection delay).
  void BubbleDetected(int gpu, int64_t began_ns, int64_t announced_ns, int64_t ended_ns,
                      absl::Duration expected, const char* phase);
  void FillStepTime(int gpu, absl::Duration step_time);
  void FillPaused(int gpu, absl::Duration pause_latency);
  // Online fill (controller/online_fill.h): a request answered (`outcome`: bubble, overflow,
  // no_main_job, refused, failed) `latency` after its arrival, having waited `queued` for its
  // bubble (or its overflow), after its objective when `missed`; the trace shows it from arrival
  // to answer. A bubble that served requests; the service time of a run outside bubbles.
  void OnlineServed(int gpu, const char* outcome, int64_t arrival_ns, absl::Duration queued,
                    absl::Duration latency, bool missed);
  void OnlineBubbleUsed(int gpu);
  void OnlineOverflowTime(int gpu, absl::Duration service);

  // The exposition text (format 0.0.4) with `gpus` and `fill_jobs` (job count by state name) as
  // they are now.
  std::string Scrape(const std::vector<GpuGauges>& gpus,
                     const std::map<std::string, int>& fill_jobs, const NodeGauges& node) const;
  const TraceRecorder& trace() const { return trace_; }

 private:
  struct Families;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> f_;
  TraceRecorder trace_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_TELEMETRY_H_
