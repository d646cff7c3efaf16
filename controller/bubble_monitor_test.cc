#include "controller/bubble_monitor.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "controller/telemetry.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pswitch::controller {
namespace {

constexpr int64_t kMs = 1'000'000;

class RecordingSink final : public BubbleSink {
 public:
  absl::Status RegisterCycle(int gpu, const fill::BubbleCycle& cycle) override {
    cycles.emplace_back(gpu, cycle);
    return absl::OkStatus();
  }
  absl::Status BubbleBegin(int gpu, absl::Duration expected, uint64_t free_bytes,
                           int64_t began_ns) override {
    begins.push_back({gpu, expected, free_bytes, began_ns});
    return absl::OkStatus();
  }
  absl::Status BubbleEnd(int gpu) override {
    ends.push_back(gpu);
    return absl::OkStatus();
  }
  struct Begin {
    int gpu;
    absl::Duration expected;
    uint64_t free_bytes;
    int64_t began_ns;
  };
  std::vector<std::pair<int, fill::BubbleCycle>> cycles;
  std::vector<Begin> begins;
  std::vector<int> ends;
};

class BubbleMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/activity-", ::getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::remove(path_.c_str());
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::unique_ptr<BubbleMonitor> Monitor(Telemetry* telemetry = nullptr) {
    BubbleMonitorOptions options;
    options.pages = {{3, path_}};
    options.free_bytes = 1 << 20;
    options.telemetry = telemetry;
    auto monitor = BubbleMonitor::Manual(options, &sink_);
    EXPECT_TRUE(monitor.ok()) << monitor.status();
    return monitor.ok() ? std::move(*monitor) : nullptr;
  }
  // A main job of `iterations` iterations of 50 ms, idle from 0 to 12 ms and 30 to 38 ms of
  // each, holding the device the rest of the time (one hold per 2 ms window, or one long hold
  // over each busy stretch: `long_holds`), sampled every 2 ms from `t_ns_` on.
  void RunJob(BubbleMonitor& monitor, gpu::ActivityWriter& job, int iterations,
              bool long_holds = false) {
    for (int it = 0; it < iterations; ++it) {
      bool holding = false;
      for (int64_t w = 0; w < 25; ++w) {
        const int64_t at_ms = w * 2;
        const bool idle = (at_ms < 12) || (at_ms >= 30 && at_ms < 38);
        if (long_holds) {
          if (!idle && !holding) job.BeginBusy();
          if (idle && holding) job.EndBusy();
          holding = !idle;
        } else if (!idle) {
          job.BeginBusy();
          job.EndBusy();
        }
        t_ns_ += 2 * kMs;
        monitor.Sample(t_ns_);
      }
      if (holding) job.EndBusy();
    }
  }
  std::string path_;
  RecordingSink sink_;
  int64_t t_ns_ = 1'000 * kMs;
};

TEST_F(BubbleMonitorTest, AnUninstrumentedJobsBubblesReachTheFillSideWithItsCycle) {
  std::unique_ptr<BubbleMonitor> monitor = Monitor();
  ASSERT_NE(monitor, nullptr);
  auto job = gpu::ActivityWriter::Open(path_);
  ASSERT_TRUE(job.ok()) << job.status();
  RunJob(*monitor, **job, 20);
  ASSERT_FALSE(sink_.cycles.empty());
  EXPECT_EQ(sink_.cycles.front().first, 3);
  // The mean shift of the stretches it matched (the first one, cut by the first sample, a
  // little short).
  EXPECT_LE(absl::AbsDuration(sink_.cycles.back().second.period - absl::Milliseconds(50)),
            absl::Milliseconds(1));
  ASSERT_EQ(sink_.cycles.back().second.bubbles.size(), 2u);
  EXPECT_EQ(sink_.cycles.back().second.bubbles[0].free_bytes, 1 << 20);
  // Learnt first, then filled: every later bubble announced, and ended.
  ASSERT_GE(sink_.begins.size(), 10u);
  EXPECT_LE(sink_.begins.size(), 40u);
  for (const RecordingSink::Begin& b : sink_.begins) {
    EXPECT_EQ(b.gpu, 3);
    EXPECT_GT(b.expected, absl::ZeroDuration());
    EXPECT_LE(b.expected, absl::Milliseconds(12));
    EXPECT_EQ(b.free_bytes, 1u << 20);
  }
  EXPECT_GE(sink_.ends.size() + 1, sink_.begins.size());
  const auto stats = monitor->Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_TRUE(stats[0].reading);
  EXPECT_EQ(stats[0].phase, fill::DetectionPhase::kStable);
  EXPECT_EQ(stats[0].bubbles, sink_.begins.size());
}

// A hold over a whole busy stretch (a long kernel) shows in no launch count of the windows after
// its first: the busy counter keeps them busy.
TEST_F(BubbleMonitorTest, ALongHoldKeepsItsWindowsBusy) {
  std::unique_ptr<BubbleMonitor> monitor = Monitor();
  ASSERT_NE(monitor, nullptr);
  auto job = gpu::ActivityWriter::Open(path_);
  ASSERT_TRUE(job.ok()) << job.status();
  RunJob(*monitor, **job, 20, /*long_holds=*/true);
  ASSERT_FALSE(sink_.cycles.empty());
  EXPECT_EQ(sink_.cycles.back().second.bubbles.size(), 2u);
  for (const RecordingSink::Begin& b : sink_.begins) EXPECT_LE(b.expected, absl::Milliseconds(12));
}

// No job yet: nothing, quietly; a job that starts later is found; a page that stops being one
// (scribbled over) ends the bubble under way and starts afresh.
TEST_F(BubbleMonitorTest, AbsentOrBrokenPagesAreReadAgainAndEndWhatTheyStarted) {
  std::unique_ptr<BubbleMonitor> monitor = Monitor();
  ASSERT_NE(monitor, nullptr);
  for (int i = 0; i < 10; ++i) monitor->Sample(t_ns_ += 2 * kMs);
  EXPECT_FALSE(monitor->Stats()[0].reading);
  auto job = gpu::ActivityWriter::Open(path_);
  ASSERT_TRUE(job.ok()) << job.status();
  t_ns_ += 1'000 * kMs;  // its next try
  RunJob(*monitor, **job, 20);
  EXPECT_TRUE(monitor->Stats()[0].reading);
  ASSERT_FALSE(sink_.begins.empty());
  // Scribbled over mid-bubble: the bubble ends, the detector starts afresh.
  const size_t begins = sink_.begins.size();
  for (int i = 0; i < 3; ++i) monitor->Sample(t_ns_ += 2 * kMs);  // idle: a bubble begins
  ASSERT_EQ(sink_.begins.size(), begins + 1);
  const size_t ends = sink_.ends.size();
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.write("garbage!", 8);
  }
  monitor->Sample(t_ns_ += 2 * kMs);
  EXPECT_FALSE(monitor->Stats()[0].reading);
  EXPECT_EQ(monitor->Stats()[0].phase, fill::DetectionPhase::kConservative);
  EXPECT_EQ(sink_.ends.size(), ends + 1) << "the bubble under way was ended";
}

// Once a GPU's cycle is stable the monitor knows where its next bubble is due, and a look there
// announces it at once, with all of its time, instead of at the end of the window it starts in.
TEST_F(BubbleMonitorTest, ALookWhereABubbleIsDueAnnouncesItThere) {
  std::unique_ptr<BubbleMonitor> monitor = Monitor();
  ASSERT_NE(monitor, nullptr);
  EXPECT_TRUE(monitor->Dues(t_ns_).empty()) << "no page read yet";
  auto job = gpu::ActivityWriter::Open(path_);
  ASSERT_TRUE(job.ok()) << job.status();
  RunJob(*monitor, **job, 20);
  ASSERT_EQ(monitor->Stats()[0].phase, fill::DetectionPhase::kStable);
  // The job's next iteration begins idle at t_ns_.
  const std::vector<BubbleMonitor::Due> dues = monitor->Dues(t_ns_ - kMs);
  ASSERT_EQ(dues.size(), 1u);
  EXPECT_EQ(dues[0].gpu, 3);
  EXPECT_LE(std::llabs(dues[0].at_ns - t_ns_), kMs) << (dues[0].at_ns - t_ns_);
  const size_t begins = sink_.begins.size();
  const int64_t due = std::max(dues[0].at_ns, t_ns_);
  // The looks the thread plans: at the due time and a quarter window after it.
  const std::vector<BubbleMonitor::Due> looks =
      BubbleMonitor::PlanLooks(dues, t_ns_ - kMs, t_ns_ + 2 * kMs, 2 * kMs);
  ASSERT_EQ(looks.size(), 2u);
  EXPECT_EQ(looks[0].at_ns, dues[0].at_ns);
  EXPECT_EQ(looks[1].at_ns, dues[0].at_ns + kMs / 2);
  // The look at the due time closes the window the job's last work fell in; one a few
  // microseconds after it proves nothing (a GPU may still run what was queued)...
  monitor->Sample(due, 3);
  monitor->Sample(due + 10'000, 3);
  EXPECT_EQ(sink_.begins.size(), begins);
  // ...one a quarter window in announces it, with all of its time.
  monitor->Sample(due + kMs / 2, 3);
  ASSERT_EQ(sink_.begins.size(), begins + 1);
  EXPECT_EQ(sink_.begins.back().began_ns, due);
  EXPECT_GE(sink_.begins.back().expected, absl::Milliseconds(11));
  EXPECT_LE(sink_.begins.back().expected, absl::Milliseconds(12));
  // A look for another GPU reads nothing of this one.
  const uint64_t windows = monitor->Stats()[0].windows;
  monitor->Sample(due + kMs, 0);
  EXPECT_EQ(monitor->Stats()[0].windows, windows);
  // No look where the grid looks anyway, nor one in the past.
  EXPECT_TRUE(BubbleMonitor::PlanLooks(dues, t_ns_ + 5 * kMs, t_ns_ + 6 * kMs, 2 * kMs).empty());
  EXPECT_TRUE(
      BubbleMonitor::PlanLooks(dues, t_ns_ - 3 * kMs, dues[0].at_ns + kMs / 4, 2 * kMs).empty());
}

// Two stages of one pipeline on two GPUs: the one with a bubble a cycle learns its period from
// the other's, in fewer cycles than it would alone.
TEST_F(BubbleMonitorTest, AGpuLearnsItsPeriodFromAnotherGpusSooner) {
  const std::string other = path_ + "-other";
  std::remove(other.c_str());
  BubbleMonitorOptions options;
  options.pages = {{3, path_}, {4, other}};
  auto monitor = BubbleMonitor::Manual(options, &sink_);
  ASSERT_TRUE(monitor.ok()) << monitor.status();
  auto busy_stage = gpu::ActivityWriter::Open(path_);
  auto one_bubble_stage = gpu::ActivityWriter::Open(other);
  ASSERT_TRUE(busy_stage.ok() && one_bubble_stage.ok());
  // 50 ms cycles: GPU 3 idle at 0-12 and 30-38 ms, GPU 4 at 20-40 ms only.
  int learnt_at = 0;
  for (int it = 1; it <= 12 && learnt_at == 0; ++it) {
    for (int64_t w = 0; w < 25; ++w) {
      const int64_t at_ms = w * 2;
      if (!((at_ms < 12) || (at_ms >= 30 && at_ms < 38)))
        (*busy_stage)->BeginBusy(), (*busy_stage)->EndBusy();
      if (!(at_ms >= 20 && at_ms < 40))
        (*one_bubble_stage)->BeginBusy(), (*one_bubble_stage)->EndBusy();
      (*monitor)->Sample(t_ns_ += 2 * kMs);
    }
    if ((*monitor)->Stats()[1].period > absl::ZeroDuration()) learnt_at = it;
  }
  std::remove(other.c_str());
  EXPECT_GT(learnt_at, 0);
  EXPECT_LE(learnt_at, 6) << "alone it takes eight cycles";
  EXPECT_LE(absl::AbsDuration((*monitor)->Stats()[1].period - absl::Milliseconds(50)),
            absl::Milliseconds(1));
}

// A job killed in a hold (or, on CUDA, in a synchronisation) leaves the page's busy count raised
// for good; the job restarted on the same page must not look busy for ever: a level held through
// a whole epoch (5 s) is taken as stale, and the job's bubbles are found again after it.
TEST_F(BubbleMonitorTest, AHoldLeftByAKilledJobIsDiscountedAfterAnEpoch) {
  std::unique_ptr<BubbleMonitor> monitor = Monitor();
  ASSERT_NE(monitor, nullptr);
  auto killed = gpu::ActivityWriter::Open(path_);
  ASSERT_TRUE(killed.ok()) << killed.status();
  (*killed)->BeginBusy();  // never ended
  auto job = gpu::ActivityWriter::Open(path_);
  ASSERT_TRUE(job.ok()) << job.status();
  const int64_t start_ns = t_ns_;
  RunJob(*monitor, **job, 300);  // 15 s
  ASSERT_FALSE(sink_.begins.empty()) << "the stale hold hid every bubble";
  // Nothing while the hold still counted (the first epoch), bubbles after.
  EXPECT_GE(sink_.begins.front().began_ns, start_ns + 5'000 * kMs);
  EXPECT_EQ(monitor->Stats()[0].phase, fill::DetectionPhase::kStable);
  EXPECT_GE(sink_.begins.size(), 100u);
}

// Each bubble given to fill work shows on the trace's "detected" track when it ends, with its
// announcement and the time it was given, and the trace says where its clock's zero lies.
TEST_F(BubbleMonitorTest, FoundBubblesAreTracedWithTheirAnnouncement) {
  Telemetry telemetry;
  std::unique_ptr<BubbleMonitor> monitor = Monitor(&telemetry);
  ASSERT_NE(monitor, nullptr);
  auto job = gpu::ActivityWriter::Open(path_);
  ASSERT_TRUE(job.ok()) << job.status();
  RunJob(*monitor, **job, 20);
  ASSERT_FALSE(sink_.ends.empty());
  const nlohmann::json trace =
      nlohmann::json::parse(telemetry.trace().ChromeJson(absl::Seconds(10), t_ns_));
  ASSERT_EQ(trace["otherData"]["clock"], "CLOCK_MONOTONIC");
  const int64_t origin_ns = trace["otherData"]["origin_ns"].get<int64_t>();
  EXPECT_EQ(origin_ns, t_ns_ - 10'000 * kMs);
  size_t found = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["cat"] != "detected") continue;
    EXPECT_EQ(e["pid"], 3);
    const int64_t began_ns = origin_ns + std::llround(e["ts"].get<double>() * 1e3);
    ASSERT_LT(found, sink_.begins.size());
    // The event starts where the sink was told the idle stretch began.
    EXPECT_LE(std::llabs(began_ns - sink_.begins[found].began_ns), 1000);
    double announced_ms = 0, expected_ms = 0;
    ASSERT_TRUE(absl::SimpleAtod(e["args"]["announced_ms"].get<std::string>(), &announced_ms));
    ASSERT_TRUE(absl::SimpleAtod(e["args"]["expected_ms"].get<std::string>(), &expected_ms));
    // Announced after one empty window at least (two before the cycle is stable).
    EXPECT_GE(announced_ms, 2.0);
    EXPECT_NEAR(expected_ms, absl::ToDoubleMilliseconds(sink_.begins[found].expected), 1e-6);
    EXPECT_LE(announced_ms, e["dur"].get<double>() / 1e3);
    ++found;
  }
  EXPECT_EQ(found, sink_.ends.size());
}

TEST_F(BubbleMonitorTest, BadDetectorOptionsAreRefused) {
  BubbleMonitorOptions options;
  options.detector.confirm_windows = 0;
  EXPECT_EQ(BubbleMonitor::Manual(options, &sink_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::controller
