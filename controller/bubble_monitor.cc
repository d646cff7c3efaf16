#include "controller/bubble_monitor.h"

#include <algorithm>

#include "base/clock.h"
#include "base/log.h"
#include "base/status.h"
#include "controller/fill_manager.h"
#include "controller/telemetry.h"

namespace pswitch::controller {
namespace {

constexpr int64_t kReopenNs = 1'000'000'000;  // an absent or broken page is tried again after
// Holds counted under way through a whole epoch this long are a job that died holding (or in a
// synchronisation): no longer busy.
constexpr int64_t kStaleBusyNs = 5'000'000'000;
// A changed cycle is registered at most this often (each registration places fill jobs again).
constexpr int64_t kRegisterEveryNs = 1'000'000'000;

class FillSink final : public BubbleSink {
 public:
  explicit FillSink(FillManager* fill) : fill_(fill) {}
  absl::Status RegisterCycle(int gpu, const fill::BubbleCycle& cycle) override {
    return fill_->RegisterCycle(gpu, cycle);
  }
  absl::Status BubbleBegin(int gpu, absl::Duration expected, uint64_t free_bytes,
                           int64_t began_ns) override {
    return fill_->BubbleBegin(gpu, expected, free_bytes, began_ns);
  }
  absl::Status BubbleEnd(int gpu) override { return fill_->BubbleEnd(gpu); }

 private:
  FillManager* const fill_;
};

}  // namespace

std::unique_ptr<BubbleSink> FillBubbleSink(FillManager* fill) {
  return std::make_unique<FillSink>(fill);
}

BubbleMonitor::BubbleMonitor(BubbleMonitorOptions options, BubbleSink* sink)
    : options_(std::move(options)), sink_(sink) {
  for (const auto& [index, path] : options_.pages) {
    Gpu g;
    g.index = index;
    g.path = path;
    g.detector = std::make_unique<fill::BubbleDetector>(options_.detector);
    gpus_.push_back(std::move(g));
  }
  published_.assign(gpus_.size(), 0);
}

absl::StatusOr<std::unique_ptr<BubbleMonitor>> BubbleMonitor::Manual(BubbleMonitorOptions options,
                                                                     BubbleSink* sink) {
  PSWITCH_RETURN_IF_ERROR(fill::ValidateBubbleDetectorOptions(options.detector));
  return std::unique_ptr<BubbleMonitor>(new BubbleMonitor(std::move(options), sink));
}

absl::StatusOr<std::unique_ptr<BubbleMonitor>> BubbleMonitor::Start(BubbleMonitorOptions options,
                                                                    BubbleSink* sink) {
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<BubbleMonitor> monitor,
                           Manual(std::move(options), sink));
  monitor->thread_ = std::thread([m = monitor.get()] { m->Run(); });
  return monitor;
}

BubbleMonitor::~BubbleMonitor() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void BubbleMonitor::Run() {
  const int64_t window_ns = absl::ToInt64Nanoseconds(options_.detector.window);
  int64_t next_ns = base::MonotonicNowNs() + window_ns;
  std::vector<Due> looks;  // where GPUs' bubbles are due, before the grid's next sample
  int64_t wake_ns = next_ns;
  while (!stop_.WaitForNotificationWithTimeout(
      absl::Nanoseconds(std::max<int64_t>(0, wake_ns - base::MonotonicNowNs())))) {
    const int64_t now_ns = base::MonotonicNowNs();
    if (now_ns < next_ns) {
      std::vector<int> sampled;
      for (const Due& look : looks) {
        if (look.at_ns > now_ns ||
            std::find(sampled.begin(), sampled.end(), look.gpu) != sampled.end()) {
          continue;
        }
        Sample(now_ns, look.gpu);
        sampled.push_back(look.gpu);
      }
    } else {
      Sample(now_ns);
      // Late (a descheduled thread): the next window starts now, one window long; the late
      // one is simply longer.
      next_ns = std::max(next_ns + window_ns, now_ns + window_ns / 2);
    }
    // Due times a quarter window back still have their second look ahead.
    looks = PlanLooks(Dues(now_ns - window_ns / 4), now_ns, next_ns, window_ns);
    wake_ns = next_ns;
    for (const Due& look : looks) wake_ns = std::min(wake_ns, look.at_ns);
  }
}

std::vector<BubbleMonitor::Due> BubbleMonitor::PlanLooks(const std::vector<Due>& dues,
                                                         int64_t now_ns, int64_t next_grid_ns,
                                                         int64_t window_ns) {
  std::vector<Due> looks;
  for (const Due& due : dues) {
    for (const int64_t at_ns : {due.at_ns, due.at_ns + window_ns / 4}) {
      if (at_ns > now_ns && at_ns < next_grid_ns - window_ns / 4) looks.push_back({at_ns, due.gpu});
    }
  }
  return looks;
}

std::vector<BubbleMonitor::Due> BubbleMonitor::Dues(int64_t after_ns) const {
  absl::MutexLock lock(&mu_);
  std::vector<Due> dues;
  for (const Gpu& g : gpus_) {
    if (!g.reader) continue;
    const std::optional<int64_t> at = g.detector->NextDueNs(after_ns);
    if (at && *at > after_ns) dues.push_back({*at, g.index});
  }
  return dues;
}

void BubbleMonitor::Sample(int64_t now_ns, std::optional<int> only_gpu) {
  absl::MutexLock lock(&mu_);
  for (Gpu& g : gpus_) {
    if (!only_gpu || g.index == *only_gpu) SampleGpu(g, now_ns);
  }
  // A pipeline's stages share their period: each GPU's own found one is a hint to the others
  // (fill::BubbleDetector::SetPeriodHints), given again only when one of them changed (a
  // period changes when a stretch ends, not at every sample).
  bool changed = false;
  for (size_t i = 0; i < gpus_.size(); ++i) {
    const Gpu& g = gpus_[i];
    const int64_t own = g.reader && !g.detector->period_hinted()
                            ? absl::ToInt64Nanoseconds(g.detector->period())
                            : 0;
    changed |= published_[i] != own;
    published_[i] = own;
  }
  if (!changed) return;
  for (size_t i = 0; i < gpus_.size(); ++i) {
    std::vector<int64_t> others;
    for (size_t j = 0; j < gpus_.size(); ++j) {
      if (j != i && published_[j] > 0) others.push_back(published_[j]);
    }
    gpus_[i].detector->SetPeriodHints(std::move(others));
  }
}

void BubbleMonitor::Reset(Gpu& g, int64_t now_ns, const absl::Status& why) {
  base::Log(base::LogLevel::kWarn, "bubble_monitor_page")
      .Field("gpu", g.index)
      .Field("path", g.path)
      .Field("detail", why);
  EndBubble(g, now_ns);
  g.reader.reset();
  g.last.reset();
  g.detector = std::make_unique<fill::BubbleDetector>(options_.detector);
  // Its new detector has no hints yet: the next Sample gives them.
  std::fill(published_.begin(), published_.end(), -1);
  g.next_open_ns = now_ns + kReopenNs;
}

uint64_t BubbleMonitor::LiveBusy(Gpu& g, uint64_t busy, int64_t now_ns) {
  if (g.busy_epoch_ns == 0) {  // a page just read: nothing on it is known to be stale
    g.busy_epoch_ns = now_ns;
    g.busy_floor_previous = 0;
    g.busy_floor_current = busy;
  } else if (now_ns - g.busy_epoch_ns >= kStaleBusyNs) {
    g.busy_epoch_ns = now_ns;
    g.busy_floor_previous = g.busy_floor_current;
    g.busy_floor_current = busy;
  }
  g.busy_floor_current = std::min(g.busy_floor_current, busy);
  const uint64_t floor = std::min(g.busy_floor_previous, g.busy_floor_current);
  return busy > floor ? busy - floor : 0;
}

void BubbleMonitor::SampleGpu(Gpu& g, int64_t now_ns) {
  if (!g.reader) {
    if (now_ns < g.next_open_ns) return;
    absl::StatusOr<gpu::ActivityReader> reader = gpu::ActivityReader::Open(g.path);
    if (!reader.ok()) {
      g.next_open_ns = now_ns + kReopenNs;
      // No job yet is the common case, said nothing of; a page that cannot be read is said once.
      if (!absl::IsNotFound(reader.status()) && !g.told_unreadable) {
        g.told_unreadable = true;
        base::Log(base::LogLevel::kWarn, "bubble_monitor_page")
            .Field("gpu", g.index)
            .Field("path", g.path)
            .Field("detail", reader.status());
      }
      return;
    }
    g.told_unreadable = false;
    g.reader = std::move(*reader);
    g.next_check_ns = now_ns + kReopenNs;
  } else if (now_ns >= g.next_check_ns) {
    // A job that deleted or replaced its page (a restart) is read from its new one.
    g.next_check_ns = now_ns + kReopenNs;
    if (!g.reader->StillAt(g.path)) {
      Reset(g, now_ns, absl::NotFoundError("the page was deleted or replaced"));
      g.next_open_ns = now_ns;
      return;
    }
  }
  absl::StatusOr<gpu::ActivityCounts> counts = g.reader->Read();
  if (!counts.ok()) {
    Reset(g, now_ns, counts.status());
    return;
  }
  if (!g.last) {  // a page just opened: its first counts
    g.last = *counts;
    g.last_ns = now_ns;
    g.busy_epoch_ns = 0;
    g.last_live_busy = LiveBusy(g, counts->busy, now_ns);
    return;
  }
  if (now_ns <= g.last_ns) return;  // no time has passed: no window
  // A window is busy when anything was launched in it, or a hold was under way at its start or
  // end (one long kernel, a synchronisation waiting for the device, or a hold across the
  // window). Counters that went back (a new page) count as activity.
  uint64_t launches =
      counts->launches >= g.last->launches ? counts->launches - g.last->launches : 1;
  const uint64_t live_busy = LiveBusy(g, counts->busy, now_ns);
  if (live_busy > 0 || g.last_live_busy > 0) launches = std::max<uint64_t>(launches, 1);
  g.last_live_busy = live_busy;
  const fill::ActivityWindow window{g.last_ns, now_ns, launches};
  g.last = *counts;
  g.last_ns = now_ns;
  ++g.windows;
  const fill::BubbleDetector::Step step = g.detector->Observe(window);
  // The cycle for placement (never one of no bubble), registered again only when it changed in
  // kind (its period past two windows, or its number of bubbles), not at every stretch's
  // median, and at most once a second: each registration places the fill jobs again.
  if (std::optional<fill::BubbleCycle> cycle = g.detector->Cycle(
          static_cast<int64_t>(std::min<uint64_t>(options_.free_bytes, INT64_MAX)))) {
    const int64_t window_ns = absl::ToInt64Nanoseconds(options_.detector.window);
    const bool changed =
        !g.registered || cycle->bubbles.size() != g.registered->bubbles.size() ||
        absl::AbsDuration(g.registered->period - cycle->period) > absl::Nanoseconds(2 * window_ns);
    if (changed && (g.registered_ns == 0 || now_ns - g.registered_ns >= kRegisterEveryNs)) {
      g.registered_ns = now_ns;
      absl::Status registered = sink_->RegisterCycle(g.index, *cycle);
      base::Log(registered.ok() ? base::LogLevel::kInfo : base::LogLevel::kWarn,
                "bubble_cycle_detected")
          .Field("gpu", g.index)
          .FieldMs("period_ms", cycle->period)
          .Field("bubbles", cycle->bubbles.size())
          .Field("phase", fill::DetectionPhaseName(g.detector->phase()))
          .Field("error", registered);
      if (registered.ok()) g.registered = *cycle;
    }
  }
  if (step.ended) EndBubble(g, step.ended->ended_ns);
  if (step.began && step.began->expected > absl::ZeroDuration() && g.registered) {
    if (sink_->BubbleBegin(g.index, step.began->expected, options_.free_bytes, step.began->began_ns)
            .ok()) {
      g.in_bubble = true;
      g.bubble_began_ns = step.began->began_ns;
      g.bubble_announced_ns = now_ns;
      g.bubble_expected = step.began->expected;
      g.bubble_phase = step.began->phase;
      ++g.bubbles;
    }
  }
}

void BubbleMonitor::EndBubble(Gpu& g, int64_t ended_ns) {
  if (!g.in_bubble) return;
  (void)sink_->BubbleEnd(g.index);
  g.in_bubble = false;
  if (options_.telemetry != nullptr) {
    options_.telemetry->BubbleDetected(g.index, g.bubble_began_ns, g.bubble_announced_ns,
                                       std::max(ended_ns, g.bubble_began_ns), g.bubble_expected,
                                       fill::DetectionPhaseName(g.bubble_phase));
  }
}

std::vector<BubbleMonitor::GpuStats> BubbleMonitor::Stats() const {
  absl::MutexLock lock(&mu_);
  std::vector<GpuStats> out;
  for (const Gpu& g : gpus_) {
    out.push_back({g.index, g.reader.has_value(), g.windows, g.bubbles, g.detector->phase(),
                   g.detector->period()});
  }
  return out;
}

}  // namespace pswitch::controller
