// Bubbles of main jobs that call nothing of pswitch (issue 30 item 3): every window (2 ms by
// default) one thread reads each monitored GPU's activity page (gpu/activity_page.h: the job's
// kernel launches, or its holds of the host device), turns what changed into an
// fill::ActivityWindow, and feeds that GPU's fill::BubbleDetector. What it finds goes where an
// instrumented job's bubble calls go (a BubbleSink: the FillManager in pswitchd): the cycle once
// the detector knows it (registered again when it changes), then each bubble's begin, with the
// time the detector gives it, and its end. A GPU whose page is absent or broken is read again
// every second, with its detector started afresh: the job may start, stop or restart at any
// time, and so may pswitchd.
#ifndef PSWITCH_CONTROLLER_BUBBLE_MONITOR_H_
#define PSWITCH_CONTROLLER_BUBBLE_MONITOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "fill/bubble_cycle.h"
#include "fill/bubble_detector.h"
#include "gpu/activity_page.h"

namespace pswitch::controller {

// Where found bubbles go (FillManager's bubble calls).
class BubbleSink {
 public:
  virtual ~BubbleSink() = default;
  virtual absl::Status RegisterCycle(int gpu, const fill::BubbleCycle& cycle) = 0;
  virtual absl::Status BubbleBegin(int gpu, absl::Duration expected, uint64_t free_bytes,
                                   int64_t began_ns) = 0;
  virtual absl::Status BubbleEnd(int gpu) = 0;
};

class FillManager;
class Telemetry;
// The fill manager's bubble calls, as an instrumented job makes them. `fill` must outlive it.
std::unique_ptr<BubbleSink> FillBubbleSink(FillManager* fill);

struct BubbleMonitorOptions {
  // The activity page of each monitored GPU, by GPU index.
  std::vector<std::pair<int, std::string>> pages;
  fill::BubbleDetectorOptions detector;
  // What a found bubble announces as free on the device (the job's memory is not seen).
  uint64_t free_bytes = 0;
  // Where each bubble given to the sink is counted and traced when it ends (null: nowhere).
  Telemetry* telemetry = nullptr;
};

class BubbleMonitor {
 public:
  // `sink` must outlive the monitor. InvalidArgument for bad detector options.
  static absl::StatusOr<std::unique_ptr<BubbleMonitor>> Start(BubbleMonitorOptions options,
                                                              BubbleSink* sink);
  // Builds one without its thread: the caller drives Sample (tests).
  static absl::StatusOr<std::unique_ptr<BubbleMonitor>> Manual(BubbleMonitorOptions options,
                                                               BubbleSink* sink);
  ~BubbleMonitor();
  BubbleMonitor(const BubbleMonitor&) = delete;
  BubbleMonitor& operator=(const BubbleMonitor&) = delete;

  // Reads every page once (`only_gpu`: that GPU's), for the window that ends at `now_ns`
  // (CLOCK_MONOTONIC).
  void Sample(int64_t now_ns, std::optional<int> only_gpu = std::nullopt);
  // Each GPU's next bubble due after `after_ns`, and when (fill::BubbleDetector::NextDueNs).
  struct Due {
    int64_t at_ns = 0;
    int gpu = 0;
  };
  std::vector<Due> Dues(int64_t after_ns) const;
  // Where the thread looks at a GPU between two grid samples: at its due time (closing the
  // window the job's last work fell in) and a quarter window later (a stretch idle that long
  // where a bubble is due is that bubble), so a due bubble is announced then, not at the end of
  // the window it begins in. Only looks after `now_ns` and more than a quarter window before
  // the grid's next sample (which sees the bubble as well).
  static std::vector<Due> PlanLooks(const std::vector<Due>& dues, int64_t now_ns,
                                    int64_t next_grid_ns, int64_t window_ns);

  struct GpuStats {
    int gpu = 0;
    bool reading = false;  // its page is open and valid
    uint64_t windows = 0;
    uint64_t bubbles = 0;  // announced with time to fill
    fill::DetectionPhase phase = fill::DetectionPhase::kConservative;
    absl::Duration period;
  };
  std::vector<GpuStats> Stats() const;

 private:
  struct Gpu {
    int index = 0;
    std::string path;
    std::optional<gpu::ActivityReader> reader;
    int64_t next_open_ns = 0;
    int64_t next_check_ns = 0;     // when to look whether the path still names its page
    bool told_unreadable = false;  // its page's refusal was logged (once until it opens)
    int64_t registered_ns = 0;     // when its cycle was last registered
    std::optional<gpu::ActivityCounts> last;
    uint64_t last_live_busy = 0;  // LiveBusy at the last sample
    int64_t last_ns = 0;
    std::unique_ptr<fill::BubbleDetector> detector;
    std::optional<fill::BubbleCycle> registered;
    bool in_bubble = false;  // announced to the sink, not yet ended
    // The bubble in_bubble names: its idle start, announcement and time given from its start.
    int64_t bubble_began_ns = 0;
    int64_t bubble_announced_ns = 0;
    absl::Duration bubble_expected;
    fill::DetectionPhase bubble_phase = fill::DetectionPhase::kConservative;
    // Holds the page counts as under way that are not (a job killed in a hold or a
    // synchronisation leaves the count raised for good): the least count seen over the last
    // epoch and the one before, so a level held for a whole epoch is taken as stale.
    uint64_t busy_floor_previous = 0;
    uint64_t busy_floor_current = UINT64_MAX;
    int64_t busy_epoch_ns = 0;
    uint64_t windows = 0;
    uint64_t bubbles = 0;
  };
  BubbleMonitor(BubbleMonitorOptions options, BubbleSink* sink);
  void SampleGpu(Gpu& g, int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reset(Gpu& g, int64_t now_ns, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the bubble announced to the sink (the job's next launch, or its page lost, at `now_ns`).
  void EndBubble(Gpu& g, int64_t ended_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The holds under way on the page that are live, less a stale floor (see Gpu).
  static uint64_t LiveBusy(Gpu& g, uint64_t busy, int64_t now_ns);
  void Run();

  const BubbleMonitorOptions options_;
  BubbleSink* const sink_;
  mutable absl::Mutex mu_;  // gpus_ between Sample and Stats
  std::vector<Gpu> gpus_ ABSL_GUARDED_BY(mu_);
  // Each GPU's own found period as last given to the others as a hint (0: none; -1: to be
  // given again).
  std::vector<int64_t> published_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_BUBBLE_MONITOR_H_
