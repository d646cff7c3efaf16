// The bubble hook: a pipeline stage announces each stretch of time it is about to spend idle, so
// pswitch can run other work on the stage's device until the stage needs it back.
//
// A stage calls BubbleBegin just before it blocks (waiting for a neighbour's activation or
// gradient, for the tied-embedding gradient, or at the iteration's end for the other stages) and
// BubbleEnd as soon as it has what it waited for, before it computes again. Calls alternate and
// come from the stage's compute thread. A reporter lives in one stage process (one per stage;
// a server connection must not be shared across the fork).
#ifndef PSWITCH_PIPELINE_BUBBLE_REPORTER_H_
#define PSWITCH_PIPELINE_BUBBLE_REPORTER_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pswitch::pipeline {

class BubbleReporter {
 public:
  static constexpr int kBarrierPosition = -1;

  virtual ~BubbleReporter() = default;
  // `position`: where in the stage's schedule it waits (the index of the op it waits to run;
  // kBarrierPosition at the iteration barrier), the same every iteration. `expected`: the
  // simulator's predicted idle time there (zero where it predicts none, e.g. a message that
  // arrives just in time). `free_bytes`: device memory the stage leaves free for other work
  // meanwhile. Must not block: the stage is on its critical path as soon as its input arrives.
  virtual void BubbleBegin(int stage, int position, absl::Duration expected,
                           uint64_t free_bytes) = 0;
  virtual void BubbleEnd(int stage) = 0;
  // The stage starts `iteration` (after the previous iteration's barrier bubble has ended).
  virtual void IterationStart(int /*stage*/, int /*iteration*/) {}
};

// Ignores every bubble.
class NullReporter final : public BubbleReporter {
 public:
  void BubbleBegin(int, int, absl::Duration, uint64_t) override {}
  void BubbleEnd(int) override {}
};

// One announced bubble, as a RecordingReporter saw it.
struct BubbleRecord {
  int stage = 0;
  absl::Duration expected;
  uint64_t free_bytes = 0;
  absl::Time begin;
  absl::Time end;  // InfinitePast while the bubble is open
};

// A thread-safe list of bubbles, shared by the RecordingReporters of stages that run as threads
// of one process (tests).
class BubbleLog {
 public:
  void Begin(int stage, absl::Duration expected, uint64_t free_bytes);
  // Closes `stage`'s open bubble; a BubbleEnd without a BubbleBegin is recorded as an error.
  void End(int stage);
  std::vector<BubbleRecord> Records() const;
  // Protocol violations seen (nested Begin, End without Begin); empty when calls alternated.
  std::vector<int> MisorderedStages() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<BubbleRecord> records_ ABSL_GUARDED_BY(mu_);
  std::vector<int> misordered_ ABSL_GUARDED_BY(mu_);
};

// Appends to a BubbleLog. `*log` must outlive the reporter.
class RecordingReporter final : public BubbleReporter {
 public:
  explicit RecordingReporter(BubbleLog* log) : log_(log) {}
  void BubbleBegin(int stage, int, absl::Duration expected, uint64_t free_bytes) override {
    log_->Begin(stage, expected, free_bytes);
  }
  void BubbleEnd(int stage) override { log_->End(stage); }

 private:
  BubbleLog* const log_;
};

}  // namespace pswitch::pipeline

#endif  // PSWITCH_PIPELINE_BUBBLE_REPORTER_H_
