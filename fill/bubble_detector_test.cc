#include "fill/bubble_detector.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pswitch::fill {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kWindow = 2 * kMs;

// A main job whose every iteration of `period_ms` has idle stretches at `bubbles` (offset and
// length in ms, in order) and launches in every other window, fed window by window. Returns
// what the detector said, with the true bubbles for comparison.
struct Fed {
  std::vector<BubbleDetector::Began> began;
  std::vector<BubbleDetector::Ended> ended;
  std::vector<std::pair<int64_t, int64_t>> truth;  // each true bubble's start and end
};

class Job {
 public:
  Job(int64_t period_ms, std::vector<std::pair<int64_t, int64_t>> bubbles)
      : period_ns_(period_ms * kMs), bubbles_(std::move(bubbles)) {}
  // Iteration `skip_bubble_of` (if >= 0) has no bubble at index `skip_index`.
  void Run(BubbleDetector& detector, int iterations, Fed& fed, int skip_iteration = -1,
           size_t skip_index = 0) {
    for (int it = 0; it < iterations; ++it, start_ns_ += period_ns_) {
      for (int64_t t = 0; t < period_ns_; t += kWindow) {
        bool idle = false;
        for (size_t b = 0; b < bubbles_.size(); ++b) {
          if (it == skip_iteration && b == skip_index) continue;
          const auto [offset, length] = bubbles_[b];
          if (t >= offset * kMs && t < (offset + length) * kMs) idle = true;
        }
        // As the monitor does when asked to: a look a quarter window after a due bubble's
        // start splits its window (asked just before the window: one due at its very start
        // counts).
        int64_t from = start_ns_ + t;
        const std::optional<int64_t> due = detector.NextDueNs(from - 1);
        if (look_where_due && due && *due + kWindow / 4 < from + kWindow) {
          feed(detector, fed, {from, *due + kWindow / 4, idle ? 0u : 3u});
          from = *due + kWindow / 4;
        }
        feed(detector, fed, {from, start_ns_ + t + kWindow, idle ? 0u : 3u});
      }
      for (size_t b = 0; b < bubbles_.size(); ++b) {
        if (it == skip_iteration && b == skip_index) continue;
        const auto [offset, length] = bubbles_[b];
        fed.truth.emplace_back(start_ns_ + offset * kMs, start_ns_ + (offset + length) * kMs);
      }
    }
  }

 private:
  static void feed(BubbleDetector& detector, Fed& fed, const ActivityWindow& window) {
    BubbleDetector::Step step = detector.Observe(window);
    if (step.began) fed.began.push_back(*step.began);
    if (step.ended) fed.ended.push_back(*step.ended);
  }
  const int64_t period_ns_;

 public:
  std::vector<std::pair<int64_t, int64_t>> bubbles_;  // changed between runs to disturb it
  bool look_where_due = false;

 private:
  int64_t start_ns_ = 1'000 * kMs;
};

TEST(BubbleDetectorTest, APeriodicJobsBubblesAreFoundAndGivenTheirLengthOnceStable) {
  BubbleDetector detector{BubbleDetectorOptions{}};
  Job job(50, {{0, 12}, {30, 8}});
  Fed fed;
  job.Run(detector, 2, fed);
  EXPECT_EQ(detector.phase(), DetectionPhase::kConservative);
  job.Run(detector, 1, fed);
  // Learning: announced from their first idle window, but nothing to fill yet.
  ASSERT_EQ(fed.began.size(), 6u);
  for (const BubbleDetector::Began& b : fed.began) EXPECT_EQ(b.expected, absl::ZeroDuration());
  for (size_t i = 0; i < fed.began.size(); ++i) {
    EXPECT_EQ(fed.began[i].began_ns, fed.truth[i].first);
    EXPECT_EQ(fed.ended[i].ended_ns, fed.truth[i].second);
  }
  // A few iterations more (enough stretches to tell a cycle from chance), and it has the period.
  int iterations = 3;
  while (detector.phase() == DetectionPhase::kConservative && iterations < 12) {
    job.Run(detector, 1, fed);
    ++iterations;
  }
  EXPECT_LE(iterations, 8);
  EXPECT_EQ(detector.period(), absl::Milliseconds(50));
  ASSERT_EQ(detector.phase(), DetectionPhase::kIncremental);
  // Half of what is left, then all of it.
  job.Run(detector, 1, fed);
  const BubbleDetector::Began& incremental = fed.began.back();
  EXPECT_EQ(incremental.phase, DetectionPhase::kIncremental);
  EXPECT_GT(incremental.expected, absl::ZeroDuration());
  EXPECT_LT(incremental.expected, absl::Milliseconds(8));
  job.Run(detector, 6, fed);
  ASSERT_EQ(detector.phase(), DetectionPhase::kStable);
  const size_t n = fed.began.size();
  ASSERT_EQ(n, fed.truth.size());
  for (size_t i = n - 4; i < n; ++i) {
    EXPECT_EQ(fed.began[i].phase, DetectionPhase::kStable);
    const absl::Duration length = absl::Nanoseconds(fed.truth[i].second - fed.truth[i].first);
    // Until the end its position had a period before (seen at the launch that ended it, so
    // never past the true end): here, where every end falls on a window's edge, all of it.
    EXPECT_EQ(fed.began[i].expected, length) << i;
    EXPECT_LE(fed.began[i].began_ns + absl::ToInt64Nanoseconds(fed.began[i].expected),
              fed.truth[i].second);
  }
  // The cycle an instrumented job would have registered.
  std::optional<BubbleCycle> cycle = detector.Cycle(1 << 30);
  ASSERT_TRUE(cycle.has_value());
  EXPECT_EQ(cycle->period, absl::Milliseconds(50));
  ASSERT_EQ(cycle->bubbles.size(), 2u);
  EXPECT_EQ(cycle->bubbles[0].duration, absl::Milliseconds(12));
  EXPECT_EQ(cycle->bubbles[1].offset - cycle->bubbles[0].offset, absl::Milliseconds(30));
  EXPECT_EQ(cycle->bubbles[1].duration, absl::Milliseconds(8));
  EXPECT_EQ(cycle->bubbles[1].free_bytes, 1 << 30);
}

// A job that stops for longer than forget_after (restarted, checkpointing) is learnt anew.
TEST(BubbleDetectorTest, AJobThatStopsForLongIsLearntAnew) {
  BubbleDetector detector{BubbleDetectorOptions{}};
  Job job(50, {{0, 12}, {30, 8}});
  Fed fed;
  job.Run(detector, 12, fed);
  ASSERT_EQ(detector.phase(), DetectionPhase::kStable);
  // 1.2 s idle, then the job again.
  int64_t t = fed.truth.back().first + 20 * kMs;  // the last iteration's end
  for (int w = 0; w < 600; ++w, t += kWindow) detector.Observe({t, t + kWindow, 0});
  detector.Observe({t, t + kWindow, 1});
  EXPECT_EQ(detector.phase(), DetectionPhase::kConservative);
  EXPECT_EQ(detector.period(), absl::ZeroDuration());
}

TEST(BubbleDetectorTest, GapsShorterThanMinBubbleAreNeverBubbles) {
  BubbleDetector detector{BubbleDetectorOptions{}};  // 4 ms
  Job job(20, {{4, 2}, {12, 2}});  // one idle window each
  Fed fed;
  job.Run(detector, 20, fed);
  EXPECT_TRUE(fed.began.empty());
  EXPECT_TRUE(fed.ended.empty());
  EXPECT_EQ(detector.phase(), DetectionPhase::kConservative);
}

// With min_bubble at one window: one idle window is too short to confirm a bubble nobody
// predicted (a kernel launched before it may still run), but a cycle of them is learnt, and once
// stable each is filled at its look.
TEST(BubbleDetectorTest, OneWindowBubblesAreFilledOnlyOnceStable) {
  BubbleDetectorOptions options;
  options.min_bubble = absl::Milliseconds(2);
  BubbleDetector detector{options};
  Job job(40, {{4, 2}, {12, 2}});
  job.look_where_due = true;
  Fed fed;
  job.Run(detector, 30, fed);
  EXPECT_EQ(detector.period(), absl::Milliseconds(40));
  EXPECT_EQ(detector.phase(), DetectionPhase::kStable);
  ASSERT_GT(fed.began.size(), 20u);
  for (const BubbleDetector::Began& b : fed.began) {
    EXPECT_EQ(b.phase, DetectionPhase::kStable);
    EXPECT_EQ(b.expected, absl::Milliseconds(2));  // from its start, announced half a window in
  }
}

TEST(BubbleDetectorTest, AMissedBubbleDropsTheConfidenceAndItComesBack) {
  BubbleDetector detector{BubbleDetectorOptions{}};
  Job job(40, {{0, 10}, {20, 6}, {30, 6}});
  Fed fed;
  job.Run(detector, 10, fed);
  ASSERT_EQ(detector.phase(), DetectionPhase::kStable);
  // One iteration's second bubble lasts three times as long: the prediction misses, and the next
  // bubbles are given half their time again until predictions hold once more.
  const auto usual = job.bubbles_;
  job.bubbles_ = {{0, 10}, {20, 18}};
  fed = {};
  job.Run(detector, 1, fed);
  job.bubbles_ = usual;
  EXPECT_EQ(detector.phase(), DetectionPhase::kIncremental);
  EXPECT_EQ(detector.period(), absl::Milliseconds(40)) << "one disturbed iteration keeps it";
  job.Run(detector, 1, fed);
  ASSERT_FALSE(fed.began.empty());
  EXPECT_EQ(fed.began.back().phase, DetectionPhase::kIncremental);
  job.Run(detector, 10, fed);
  EXPECT_EQ(detector.phase(), DetectionPhase::kStable);
}

// Also with other GPUs' periods as hints (other jobs' cycles on a shared node): a random job's
// gaps must not map onto one.
TEST(BubbleDetectorTest, AJobWithoutACycleIsNeverFilled) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(seed);
    BubbleDetector detector{BubbleDetectorOptions{}};
    if (seed % 2 == 0) detector.SetPeriodHints({40 * kMs, 50 * kMs, 80 * kMs});
    std::mt19937 random(seed);
    std::uniform_int_distribution<int> busy(1, 20), idle(2, 15);
    int64_t t = 0;
    int announced = 0;
    for (int stretch = 0; stretch < 200; ++stretch) {
      for (int w = busy(random); w > 0; --w, t += kWindow) detector.Observe({t, t + kWindow, 1});
      for (int w = idle(random); w > 0; --w, t += kWindow) {
        BubbleDetector::Step step = detector.Observe({t, t + kWindow, 0});
        if (step.began) {
          ++announced;
          EXPECT_EQ(step.began->expected, absl::ZeroDuration())
              << "at stretch " << stretch << ", period " << detector.period();
        }
      }
    }
    EXPECT_GT(announced, 100);
    EXPECT_EQ(detector.phase(), DetectionPhase::kConservative);
    EXPECT_FALSE(detector.Cycle(0).has_value());
  }
}

// A real job's iterations jitter: each bubble starts and ends a window early or late.
TEST(BubbleDetectorTest, AJitteringCycleIsStillFoundAndFilledWithinItsBubbles) {
  BubbleDetector detector{BubbleDetectorOptions{}};
  std::mt19937 random(3);
  std::uniform_int_distribution<int> shift(-1, 1);
  int64_t t = 0, overruns = 0, filled = 0;
  std::optional<BubbleDetector::Began> open;
  for (int it = 0; it < 60; ++it) {
    // Period 80 ms: bubbles near 0 (20 ms) and near 50 ms (10 ms), in windows.
    const int a_start = 1 + shift(random), a_end = 11 + shift(random);
    const int b_start = 25 + shift(random), b_end = 30 + shift(random);
    for (int w = 0; w < 40; ++w, t += kWindow) {
      const bool idle = (w >= a_start && w < a_end) || (w >= b_start && w < b_end);
      BubbleDetector::Step step = detector.Observe({t, t + kWindow, idle ? 0u : 2u});
      if (step.began) open = step.began;
      if (step.ended && open) {
        if (open->expected > absl::ZeroDuration()) {
          ++filled;
          if (open->began_ns + absl::ToInt64Nanoseconds(open->expected) > step.ended->ended_ns) {
            ++overruns;
          }
        }
        open.reset();
      }
    }
  }
  EXPECT_LE(absl::AbsDuration(detector.period() - absl::Milliseconds(80)), absl::Milliseconds(2));
  EXPECT_NE(detector.phase(), DetectionPhase::kConservative);
  // Most bubbles after the first iterations (100 seeds: 52 to 90 of 120, 72 on average).
  EXPECT_GT(filled, 45) << "of 120";
  // The shortest of its position's last lengths less a window: overruns are rare (100 seeds:
  // 0.5 of 72 on average).
  EXPECT_LT(overruns * 10, filled) << overruns << " of " << filled;
}

// Once stable, the detector says where the next bubble is due; the monitor's look there makes a
// short window, and an idle one is the bubble at once, from that window's start.
TEST(BubbleDetectorTest, ADueBubbleIsAnnouncedAtTheLookWhereItIsDue) {
  BubbleDetector detector{BubbleDetectorOptions{}};
  Job job(50, {{0, 12}, {30, 8}});
  Fed fed;
  job.Run(detector, 14, fed);
  ASSERT_EQ(detector.phase(), DetectionPhase::kStable);
  // The job's next iteration starts at its first bubble (offset 0).
  const int64_t next_iteration = fed.truth.back().second + 12 * kMs;
  EXPECT_EQ(detector.NextDueNs(next_iteration - 5 * kMs), next_iteration);
  EXPECT_EQ(detector.NextDueNs(next_iteration + 1), next_iteration + 30 * kMs);
  // Windows up to the iteration's end, busy; a look 0.1 ms into the bubble proves nothing yet
  // (a GPU may still run what was queued); one at 0.6 ms, idle, announces it with all of its
  // time, though under a window has passed.
  EXPECT_FALSE(detector.Observe({next_iteration - 2 * kMs, next_iteration, 1}).began);
  EXPECT_FALSE(detector.Observe({next_iteration, next_iteration + 100'000, 0}).began);
  BubbleDetector::Step step =
      detector.Observe({next_iteration + 100'000, next_iteration + 600'000, 0});
  ASSERT_TRUE(step.began.has_value());
  EXPECT_EQ(step.began->began_ns, next_iteration);
  EXPECT_EQ(step.began->expected, absl::Milliseconds(12));
  EXPECT_EQ(detector.NextDueNs(next_iteration + 600'000), std::nullopt) << "inside a stretch";
  // Before stable, a short idle window confirms nothing: the stretch must last two windows.
  BubbleDetector fresh{BubbleDetectorOptions{}};
  EXPECT_EQ(fresh.NextDueNs(0), std::nullopt);
  EXPECT_FALSE(fresh.Observe({0, 300'000, 0}).began);
  EXPECT_FALSE(fresh.Observe({300'000, 2 * kMs, 0}).began);
  EXPECT_TRUE(fresh.Observe({2 * kMs, 4 * kMs, 0}).began);
}

// A pipeline's stage with one bubble a cycle: alone, its detector needs seven mapped stretches;
// with the period another device found as a hint, three. A hint that does not map this job's
// stretches changes nothing.
TEST(BubbleDetectorTest, AnotherDevicesPeriodIsTakenOnLessEvidence) {
  auto cycles_to_period = [](std::vector<int64_t> hints) {
    BubbleDetector detector{BubbleDetectorOptions{}};
    detector.SetPeriodHints(std::move(hints));
    Job job(50, {{0, 20}});
    Fed fed;
    for (int it = 1; it <= 20; ++it) {
      job.Run(detector, 1, fed);
      if (detector.period() != absl::ZeroDuration()) {
        EXPECT_EQ(detector.period(), absl::Milliseconds(50));
        return it;
      }
    }
    return 0;
  };
  const int alone = cycles_to_period({});
  const int hinted = cycles_to_period({50 * kMs});
  const int wrong = cycles_to_period({37 * kMs});
  EXPECT_GE(alone, 8);
  EXPECT_GT(hinted, 0);
  EXPECT_LE(hinted, 5);
  EXPECT_EQ(wrong, alone);
}

// Two stretches closer together than the tolerance (2 % of a 400 ms period: 8 ms): a bubble's
// past ones are the nearest a period back each, not the first found within the tolerance, or
// the short one would be given the long one's end.
TEST(BubbleDetectorTest, NeighboursWithinTheToleranceAreNotTakenForEachOther) {
  BubbleDetector detector{BubbleDetectorOptions{}};
  Job job(400, {{0, 4}, {8, 6}});
  Fed fed;
  job.Run(detector, 16, fed);
  ASSERT_EQ(detector.phase(), DetectionPhase::kStable);
  EXPECT_EQ(detector.period(), absl::Milliseconds(400)) << "a shift from one to the other";
  int given = 0;
  for (const BubbleDetector::Began& b : fed.began) {
    if (b.phase != DetectionPhase::kStable) continue;
    ++given;
    const int64_t offset = (b.began_ns - 1'000 * kMs) % (400 * kMs);
    EXPECT_EQ(b.expected, absl::Milliseconds(offset == 0 ? 4 : 6)) << "at " << offset / kMs;
  }
  EXPECT_GT(given, 6);
}

TEST(BubbleDetectorTest, AWindowOutOfOrderIsIgnored) {
  BubbleDetector detector{BubbleDetectorOptions{}};
  detector.Observe({10 * kMs, 12 * kMs, 0});
  EXPECT_FALSE(detector.Observe({8 * kMs, 10 * kMs, 0}).began.has_value());
  EXPECT_FALSE(detector.Observe({12 * kMs, 12 * kMs, 0}).began.has_value());  // empty
  EXPECT_TRUE(detector.Observe({12 * kMs, 14 * kMs, 0}).began.has_value());
}

TEST(BubbleDetectorTest, BadOptionsAreRefused) {
  EXPECT_TRUE(ValidateBubbleDetectorOptions({}).ok());
  BubbleDetectorOptions o;
  o.window = absl::ZeroDuration();
  EXPECT_FALSE(ValidateBubbleDetectorOptions(o).ok());
  o = {};
  o.confirm_windows = 0;
  EXPECT_FALSE(ValidateBubbleDetectorOptions(o).ok());
  o = {};
  o.min_bubble = absl::Milliseconds(1);
  EXPECT_FALSE(ValidateBubbleDetectorOptions(o).ok());
  o = {};
  o.tolerance = 0.5;
  EXPECT_FALSE(ValidateBubbleDetectorOptions(o).ok());
  o = {};
  o.history = 3;
  EXPECT_FALSE(ValidateBubbleDetectorOptions(o).ok());
  o = {};
  o.forget_after = o.min_bubble;
  EXPECT_FALSE(ValidateBubbleDetectorOptions(o).ok());
  EXPECT_STREQ(DetectionPhaseName(DetectionPhase::kStable), "stable");
}

}  // namespace
}  // namespace pswitch::fill
