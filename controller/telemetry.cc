#include "controller/telemetry.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"

namespace pswitch::controller {
namespace {

using prometheus::Labels;

// Exponential bucket bounds from `start`, each `factor` times the last.
prometheus::Histogram::BucketBoundaries Exponential(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double b = start; count-- > 0; b *= factor) bounds.push_back(b);
  return bounds;
}

// A switch's phases: 50 us to ~13 s. Task times: 100 us to ~7 min.
const prometheus::Histogram::BucketBoundaries& SwitchBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries(Exponential(5e-5, 2, 19));
  return *b;
}
const prometheus::Histogram::BucketBoundaries& TaskBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries(Exponential(1e-4, 2, 22));
  return *b;
}

std::string Gpu(int gpu) { return std::to_string(gpu); }
const char* KindName(TaskKind kind) {
  return kind == TaskKind::kTraining ? "training" : "inference";
}

}  // namespace

struct Telemetry::Families {
  explicit Families(prometheus::Registry& r)
      : switches(prometheus::BuildCounter()
                     .Name("pswitch_switches_total")
                     .Help("Tasks whose model had to be transmitted to the GPU first")
                     .Register(r)),
        switch_phase(prometheus::BuildHistogram()
                         .Name("pswitch_switch_phase_seconds")
                         .Help("A switch's phases, each measured from the task's arrival "
                               "(stop_to_drain: stop sent to old tenant drained)")
                         .Register(r)),
        transmitted(prometheus::BuildCounter()
                        .Name("pswitch_transmitted_bytes_total")
                        .Help("Model bytes copied host to device by switches")
                        .Register(r)),
        latency(prometheus::BuildHistogram()
                    .Name("pswitch_task_latency_seconds")
                    .Help("Arrival to answer of tasks that succeeded")
                    .Register(r)),
        queue_wait(prometheus::BuildHistogram()
                       .Name("pswitch_task_queue_wait_seconds")
                       .Help("Arrival to start of tasks that succeeded")
                       .Register(r)),
        failures(prometheus::BuildCounter()
                     .Name("pswitch_task_failures_total")
                     .Help("Tasks that failed or were cancelled")
                     .Register(r)),
        preemptions(prometheus::BuildCounter()
                        .Name("pswitch_preemptions_total")
                        .Help("Running tasks stopped for a waiting one")
                        .Register(r)),
        worker_kills(prometheus::BuildCounter()
                         .Name("pswitch_worker_kills_total")
                         .Help("Worker processes SIGKILLed (silent, not draining, not pausing)")
                         .Register(r)),
        worker_restarts(prometheus::BuildCounter()
                            .Name("pswitch_worker_restarts_total")
                            .Help("Worker processes that died and were replaced")
                            .Register(r)),
        bandwidth(prometheus::BuildGauge()
                      .Name("pswitch_h2d_bandwidth_bytes_per_second")
                      .Help("Host-to-device bandwidth measured at start-up")
                      .Register(r)),
        bubble(prometheus::BuildCounter()
                   .Name("pswitch_bubble_seconds_total")
                   .Help("Pipeline bubble time the main job reported")
                   .Register(r)),
        detected(prometheus::BuildCounter()
                     .Name("pswitch_detected_bubbles_total")
                     .Help("Bubbles found from the main job's activity and given to fill work "
                           "(--detect-bubbles)")
                     .Register(r)),
        detected_time(prometheus::BuildCounter()
                          .Name("pswitch_detected_bubble_fill_seconds_total")
                          .Help("Time given to fill work in found bubbles: announcement to the "
                                "predicted end or the job's next launch, whichever came first")
                          .Register(r)),
        bubble_fill(prometheus::BuildCounter()
                        .Name("pswitch_bubble_fill_seconds_total")
                        .Help("Bubble time used by fill steps")
                        .Register(r)),
        fill_pause(prometheus::BuildHistogram()
                       .Name("pswitch_fill_pause_seconds")
                       .Help("Bubble end to the fill task paused")
                       .Register(r)),
        queue_depth(prometheus::BuildGauge()
                        .Name("pswitch_queue_depth")
                        .Help("Unfinished tasks (queued or running)")
                        .Register(r)),
        arena_used(prometheus::BuildGauge()
                       .Name("pswitch_arena_used_bytes")
                       .Help("Arena bytes leased (weights region, activations, fill leases)")
                       .Register(r)),
        arena_free(prometheus::BuildGauge()
                       .Name("pswitch_arena_free_bytes")
                       .Help("Arena bytes not leased")
                       .Register(r)),
        fill_jobs(prometheus::BuildGauge()
                      .Name("pswitch_fill_jobs")
                      .Help("Fill jobs by state")
                      .Register(r)),
        pinned_weights(prometheus::BuildGauge()
                           .Name("pswitch_pinned_weight_bytes")
                           .Help("Pinned host memory holding registered models' weights")
                           .Register(r)),
        models(prometheus::BuildGauge()
                   .Name("pswitch_models")
                   .Help("Registered models (fill jobs' own copies included)")
                   .Register(r)),
        cache_hits(prometheus::BuildCounter()
                       .Name("pswitch_weights_cache_hits_total")
                       .Help("Tasks placed on their model's resident weights (nothing copied)")
                       .Register(r)),
        cache_misses(prometheus::BuildCounter()
                         .Name("pswitch_weights_cache_misses_total")
                         .Help("Tasks whose model's weights had to be copied in")
                         .Register(r)),
        cache_evictions(prometheus::BuildCounter()
                            .Name("pswitch_weights_cache_evictions_total")
                            .Help("Resident models evicted to make room for another")
                            .Register(r)),
        resident_bytes(prometheus::BuildGauge()
                           .Name("pswitch_weights_resident_bytes")
                           .Help("Bytes of the weights pool holding resident models")
                           .Register(r)),
        resident_models(prometheus::BuildGauge()
                            .Name("pswitch_weights_resident_models")
                            .Help("Models whose weights are resident on the GPU")
                            .Register(r)),
        online_requests(prometheus::BuildCounter()
                            .Name("pswitch_online_fill_requests_total")
                            .Help("Online fill requests answered, by outcome: bubble (served "
                                  "in a bubble), overflow (run outside one, preempting the main "
                                  "job), no_main_job, refused (objective not met), failed")
                            .Register(r)),
        online_latency(prometheus::BuildHistogram()
                           .Name("pswitch_online_fill_latency_seconds")
                           .Help("Arrival to answer of online fill requests served, by outcome")
                           .Register(r)),
        online_queue(prometheus::BuildHistogram()
                         .Name("pswitch_online_fill_queue_seconds")
                         .Help("Arrival to the bubble (or overflow) that took an online fill "
                               "request, by outcome")
                         .Register(r)),
        online_missed(prometheus::BuildCounter()
                          .Name("pswitch_online_fill_missed_objectives_total")
                          .Help("Online fill requests answered after their latency objective")
                          .Register(r)),
        online_bubbles(prometheus::BuildCounter()
                           .Name("pswitch_online_fill_bubbles_total")
                           .Help("Bubbles that served at least one online fill request")
                           .Register(r)),
        online_overflow(prometheus::BuildCounter()
                            .Name("pswitch_online_fill_overflow_seconds_total")
                            .Help("Service time of online fill requests run outside bubbles "
                                  "(--online-fill-overflow=run): the main job's cost")
                            .Register(r)) {}

  prometheus::Family<prometheus::Counter>& switches;
  prometheus::Family<prometheus::Histogram>& switch_phase;
  prometheus::Family<prometheus::Counter>& transmitted;
  prometheus::Family<prometheus::Histogram>& latency;
  prometheus::Family<prometheus::Histogram>& queue_wait;
  prometheus::Family<prometheus::Counter>& failures;
  prometheus::Family<prometheus::Counter>& preemptions;
  prometheus::Family<prometheus::Counter>& worker_kills;
  prometheus::Family<prometheus::Counter>& worker_restarts;
  prometheus::Family<prometheus::Gauge>& bandwidth;
  prometheus::Family<prometheus::Counter>& bubble;
  prometheus::Family<prometheus::Counter>& detected;
  prometheus::Family<prometheus::Counter>& detected_time;
  prometheus::Family<prometheus::Counter>& bubble_fill;
  prometheus::Family<prometheus::Histogram>& fill_pause;
  prometheus::Family<prometheus::Gauge>& queue_depth;
  prometheus::Family<prometheus::Gauge>& arena_used;
  prometheus::Family<prometheus::Gauge>& arena_free;
  prometheus::Family<prometheus::Gauge>& fill_jobs;
  prometheus::Family<prometheus::Gauge>& pinned_weights;
  prometheus::Family<prometheus::Gauge>& models;
  prometheus::Family<prometheus::Counter>& cache_hits;
  prometheus::Family<prometheus::Counter>& cache_misses;
  prometheus::Family<prometheus::Counter>& cache_evictions;
  prometheus::Family<prometheus::Gauge>& resident_bytes;
  prometheus::Family<prometheus::Gauge>& resident_models;
  prometheus::Family<prometheus::Counter>& online_requests;
  prometheus::Family<prometheus::Histogram>& online_latency;
  prometheus::Family<prometheus::Histogram>& online_queue;
  prometheus::Family<prometheus::Counter>& online_missed;
  prometheus::Family<prometheus::Counter>& online_bubbles;
  prometheus::Family<prometheus::Counter>& online_overflow;
};

Telemetry::Telemetry()
    : registry_(std::make_shared<prometheus::Registry>()),
      f_(std::make_unique<Families>(*registry_)) {}

Telemetry::~Telemetry() = default;

void Telemetry::TaskFinished(int gpu, const std::string& model, TaskKind kind,
                             absl::Duration queue_wait, absl::Duration latency, bool ok) {
  const Labels labels{{"gpu", Gpu(gpu)}, {"model", model}, {"kind", KindName(kind)}};
  if (!ok) {
    f_->failures.Add(labels).Increment();
    return;
  }
  f_->latency.Add(labels, TaskBuckets()).Observe(absl::ToDoubleSeconds(latency));
  f_->queue_wait.Add(labels, TaskBuckets()).Observe(absl::ToDoubleSeconds(queue_wait));
}

void Telemetry::Switched(int gpu, const std::string& model, const SwitchTimeline& t,
                         uint64_t bytes) {
  f_->switches.Add({{"gpu", Gpu(gpu)}, {"model", model}}).Increment();
  f_->transmitted.Add({{"gpu", Gpu(gpu)}}).Increment(static_cast<double>(bytes));
  // Each phase only when both its ends happened (0: did not).
  auto observe = [&](const char* phase, int64_t from_ns, int64_t to_ns) {
    if (from_ns == 0 || to_ns == 0 || to_ns < from_ns) return;
    f_->switch_phase.Add({{"gpu", Gpu(gpu)}, {"model", model}, {"phase", phase}}, SwitchBuckets())
        .Observe(static_cast<double>(to_ns - from_ns) / 1e9);
  };
  observe("stop_to_drain", t.stop_sent_ns, t.drained_ns);
  observe("old_tenant_stop", t.stop_sent_ns, t.old_stopped_ns);
  observe("inputs", t.arrival_ns, t.inputs_ns);  // a raw payload's receipt, overlapping the rest
  observe("first_group_ready", t.arrival_ns, t.first_group_ready_ns);
  observe("first_layer_start", t.arrival_ns, t.first_layer_start_ns);
  observe("last_group_ready", t.arrival_ns, t.last_group_ready_ns);
  observe("result", t.arrival_ns, t.result_ns);
}

void Telemetry::AddGpu(int gpu) {
  const Labels labels{{"gpu", Gpu(gpu)}};
  for (auto* family :
       {&f_->transmitted, &f_->preemptions, &f_->worker_kills, &f_->worker_restarts, &f_->bubble,
        &f_->bubble_fill, &f_->online_bubbles, &f_->online_overflow, &f_->online_missed}) {
    family->Add(labels);
  }
}

void Telemetry::TaskRan(int gpu, uint64_t task, const std::string& model, TaskKind kind,
                        int slot, const SwitchTimeline& t, bool ok) {
  const std::string label = absl::StrCat(model, " (task ", task, ")");
  auto span = [&](std::string track, std::string name, const char* category, int64_t from_ns,
                  int64_t to_ns, std::vector<std::pair<std::string, std::string>> args = {}) {
    if (from_ns == 0 || to_ns < from_ns) return;
    trace_.Record({gpu, std::move(track), std::move(name), category, from_ns, to_ns - from_ns,
                   false, std::move(args)});
  };
  if (t.placed_ns > t.arrival_ns) span("queue", label, "queue", t.arrival_ns, t.placed_ns);
  if (t.inputs_ns != 0) span("inputs", label, "inputs", t.arrival_ns, t.inputs_ns);
  span("switch", "stop to drain", "switch", t.stop_sent_ns, t.drained_ns);
  span("switch", "old tenant stopping", "switch", t.stop_sent_ns, t.old_stopped_ns);
  for (size_t i = 0; i < t.group_copies.size(); ++i) {
    span("copy", absl::StrCat("group ", i), "copy", t.group_copies[i].first,
         t.group_copies[i].second, {{"task", std::to_string(task)}, {"model", model}});
  }
  const std::string worker = absl::StrCat("worker ", slot);
  span(worker, label, KindName(kind), t.placed_ns, t.result_ns,
       {{"kind", KindName(kind)}, {"ok", ok ? "true" : "false"}});
  span(worker, "first layer", "compute", t.first_layer_start_ns, t.first_layer_done_ns);
  // Each group's compute, from its gate's release to the next group's (the last one's to the
  // answer): where the task waited for weights shows as a group starting late.
  if (t.first_layer_start_ns != 0) {
    std::vector<int64_t> gates = {t.first_layer_start_ns};
    gates.insert(gates.end(), t.group_gates_ns.begin(), t.group_gates_ns.end());
    for (size_t g = 0; g < gates.size(); ++g) {
      const int64_t end = g + 1 < gates.size() ? gates[g + 1] : t.result_ns;
      span(worker, absl::StrCat("group ", g), "compute", gates[g], end,
           {{"task", std::to_string(task)}});
    }
  }
}

void Telemetry::Preempted(int gpu) {
  f_->preemptions.Add({{"gpu", Gpu(gpu)}}).Increment();
  trace_.Record({gpu, "scheduler", "preempt", "scheduler", base::MonotonicNowNs(), 0, true, {}});
}
void Telemetry::Evicted(int gpu, const std::string& model, const std::string& for_model) {
  trace_.Record({gpu,
                 "copy",
                 absl::StrCat("evict ", model),
                 "eviction",
                 base::MonotonicNowNs(),
                 0,
                 true,
                 {{"model", model}, {"for", for_model}}});
}
void Telemetry::WorkerKilled(int gpu) {
  f_->worker_kills.Add({{"gpu", Gpu(gpu)}}).Increment();
  trace_.Record({gpu, "scheduler", "worker killed", "scheduler", base::MonotonicNowNs(), 0, true, {}});
}
void Telemetry::WorkerRestarted(int gpu) {
  f_->worker_restarts.Add({{"gpu", Gpu(gpu)}}).Increment();
}
void Telemetry::LinkMeasured(int gpu, double bytes_per_s) {
  f_->bandwidth.Add({{"gpu", Gpu(gpu)}}).Set(bytes_per_s);
}
void Telemetry::WeightsCache(int gpu, const WeightsCacheStats& stats) {
  const Labels labels{{"gpu", Gpu(gpu)}};
  auto catch_up = [&labels](prometheus::Family<prometheus::Counter>& family, uint64_t total) {
    prometheus::Counter& counter = family.Add(labels);
    const double delta = static_cast<double>(total) - counter.Value();
    if (delta > 0) counter.Increment(delta);
  };
  catch_up(f_->cache_hits, stats.hits);
  catch_up(f_->cache_misses, stats.misses);
  catch_up(f_->cache_evictions, stats.evictions);
  f_->resident_bytes.Add(labels).Set(static_cast<double>(stats.resident_bytes));
  f_->resident_models.Add(labels).Set(static_cast<double>(stats.resident_models));
}

void Telemetry::BubbleTime(int gpu, absl::Duration bubble, std::optional<BubbleUse> used) {
  if (bubble > absl::ZeroDuration()) {
    f_->bubble.Add({{"gpu", Gpu(gpu)}}).Increment(absl::ToDoubleSeconds(bubble));
    const int64_t end_ns = base::MonotonicNowNs();
    const int64_t dur_ns = absl::ToInt64Nanoseconds(bubble);
    std::vector<std::pair<std::string, std::string>> args;
    if (used) {
      args = {{"fill_ms", absl::StrFormat("%.6f", absl::ToDoubleMilliseconds(used->step_time))},
              {"fill_steps", absl::StrCat(used->steps)}};
    }
    trace_.Record(
        {gpu, "bubbles", "bubble", "bubble", end_ns - dur_ns, dur_ns, false, std::move(args)});
  }
}
void Telemetry::BubbleDetected(int gpu, int64_t began_ns, int64_t announced_ns, int64_t ended_ns,
                               absl::Duration expected, const char* phase) {
  if (ended_ns < began_ns) return;
  const int64_t given_end_ns = std::min(ended_ns, began_ns + absl::ToInt64Nanoseconds(expected));
  f_->detected.Add({{"gpu", Gpu(gpu)}}).Increment();
  if (given_end_ns > announced_ns) {
    f_->detected_time.Add({{"gpu", Gpu(gpu)}})
        .Increment(static_cast<double>(given_end_ns - announced_ns) / 1e9);
  }
  // Times as offsets from the idle stretch's start (the event's), in ms to the nanosecond.
  auto ms = [](int64_t ns) { return absl::StrFormat("%.6f", static_cast<double>(ns) / 1e6); };
  trace_.Record({gpu,
                 "detected",
                 "bubble",
                 "detected",
                 began_ns,
                 ended_ns - began_ns,
                 false,
                 {{"announced_ms", ms(announced_ns - began_ns)},
                  {"expected_ms", ms(absl::ToInt64Nanoseconds(expected))},
                  {"phase", phase}}});
}
void Telemetry::FillStepTime(int gpu, absl::Duration step_time) {
  if (step_time > absl::ZeroDuration()) {
    f_->bubble_fill.Add({{"gpu", Gpu(gpu)}}).Increment(absl::ToDoubleSeconds(step_time));
  }
}
void Telemetry::FillPaused(int gpu, absl::Duration pause_latency) {
  f_->fill_pause.Add({{"gpu", Gpu(gpu)}}, SwitchBuckets())
      .Observe(absl::ToDoubleSeconds(pause_latency));
  trace_.Record({gpu, "fill", "paused", "fill", base::MonotonicNowNs(), 0, true,
                 {{"pause_latency_ms", absl::StrCat(absl::ToDoubleMilliseconds(pause_latency))}}});
}

void Telemetry::OnlineServed(int gpu, const char* outcome, int64_t arrival_ns,
                             absl::Duration queued, absl::Duration latency, bool missed) {
  const Labels labels{{"gpu", Gpu(gpu)}, {"outcome", outcome}};
  f_->online_requests.Add(labels).Increment();
  f_->online_queue.Add(labels, TaskBuckets()).Observe(absl::ToDoubleSeconds(queued));
  const std::string_view o(outcome);
  if (o != "refused" && o != "failed") {
    f_->online_latency.Add(labels, TaskBuckets()).Observe(absl::ToDoubleSeconds(latency));
  }
  if (missed) f_->online_missed.Add({{"gpu", Gpu(gpu)}}).Increment();
  trace_.Record({gpu,
                 "online",
                 std::string(outcome),
                 "online",
                 arrival_ns,
                 absl::ToInt64Nanoseconds(latency),
                 false,
                 {{"queued_ms", absl::StrCat(absl::ToDoubleMilliseconds(queued))},
                  {"missed_objective", missed ? "yes" : "no"}}});
}
void Telemetry::OnlineBubbleUsed(int gpu) {
  f_->online_bubbles.Add({{"gpu", Gpu(gpu)}}).Increment();
}
void Telemetry::OnlineOverflowTime(int gpu, absl::Duration service) {
  f_->online_overflow.Add({{"gpu", Gpu(gpu)}}).Increment(absl::ToDoubleSeconds(service));
}

std::string Telemetry::Scrape(const std::vector<GpuGauges>& gpus,
                              const std::map<std::string, int>& fill_jobs,
                              const NodeGauges& node) const {
  f_->pinned_weights.Add({}).Set(static_cast<double>(node.pinned_weight_bytes));
  f_->models.Add({}).Set(static_cast<double>(node.models));
  for (const GpuGauges& g : gpus) {
    const Labels labels{{"gpu", Gpu(g.gpu)}};
    f_->queue_depth.Add(labels).Set(static_cast<double>(g.queue_depth));
    f_->arena_used.Add(labels).Set(static_cast<double>(g.arena_used_bytes));
    f_->arena_free.Add(labels).Set(static_cast<double>(g.arena_free_bytes));
  }
  for (const auto& [state, count] : fill_jobs) {
    f_->fill_jobs.Add({{"state", state}}).Set(count);
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace pswitch::controller
