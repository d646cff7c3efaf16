// The step budget of one fill task's run (FreeRide's program-directed limit): a step starts only
// while the run is not stopped and the bubble's remaining time exceeds the step's predicted
// duration plus a margin; each step holds the device's compute lock (host backend) and is timed
// to refine the prediction. A task marked ignore_pause is the misbehaving kind the framework must
// kill: it keeps stepping regardless.
//
// A run of one bubble takes its bubble's end from its Run. A resident run (issue 30 item 1) has
// a bell (fill/bell_layout.h): it reads each bubble's end there, waits on it between bubbles
// rather than ending, and writes back what it did, so pswitchd opens the next bubble without a
// message and reads the run's progress without one.
#ifndef PSWITCH_WORKER_FILL_STEPS_H_
#define PSWITCH_WORKER_FILL_STEPS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "fill/bell_layout.h"
#include "fill/step_gate.h"
#include "gpu/host/compute_lock.h"
#include "proto/worker_generated.h"

namespace pswitch::worker {

// When a fill run's step still under way is cut (issue 30 item 2): at its bubble's end less half
// the margin (half for the step's overrun, half for the cut to unwind and the device to drain);
// 0 (never) for a test task that ignores pauses.
int64_t FillCutAtNs(const proto::FillRun& fill);

class FillSteps {
 public:
  // The prediction starts at the larger of the run's step time and `measured` (this worker's own
  // measurement of the step, taken when it loaded the model; zero: none). `bell`: the page of a
  // resident run (fill.bell mapped; it must outlive this), null for a run of one bubble.
  static absl::StatusOr<std::unique_ptr<FillSteps>> Create(
      const proto::FillRun& fill, const std::atomic<bool>* stop,
      absl::Duration measured = absl::ZeroDuration(), fill::BellLayout* bell = nullptr);
  // Whether the next step may start. A run of one bubble answers at once; a resident run waits
  // (on its bell, between bubbles) until a bubble has room for the step, and says false only
  // once it is stopped.
  bool MayStart();
  // Runs step `index` of the job under the compute lock and records its duration; false (the
  // step did not run) when waiting for the device used up the time the step needed.
  absl::StatusOr<bool> Run(uint32_t index, const std::function<absl::Status()>& step);

  bool resident() const { return bell_ != nullptr; }
  // The run's steps may run in parts of `rows_per_step` rows each (dataset inference in a
  // resident run, issue 30 item 2): a step may start once one row fits, runs the rows that fit
  // (RowsThatFit), and goes on in the next bubble with the rest; a step's time is that of its
  // parts together.
  void SetSplittable(int64_t rows_per_step);
  // Of a splittable step's rows, how many fit what is left of the bubble now (0: none).
  int64_t RowsThatFit() const;
  // A part of a split step was done: progress pswitchd sees though no whole step ended.
  void PartDone();
  // A resident run's steps may be suspended (issue 30): a step still under way at its bubble's
  // end waits at that point (a layer boundary) for the run's next bubble and goes on there,
  // rather than being cut and lost, so a step longer than every bubble still ends. A step may
  // then start with room for a fill::kSuspendParts-th of it. `drain` waits for the step's queued
  // device work (its stream) before the device is left to the main job. The step's activations
  // stay in the run's activation lease meanwhile: memory of pswitch's arena, set apart from the
  // main job's. How late after its bubble's close a step pauses is pswitchd's pause latency, and
  // bounded by its kill, as for a cut step.
  void SetSuspendable(std::function<void()> drain);
  // For models::StepCutOptions::suspend and the layer gate: null unless SetSuspendable. Called
  // at a point past the bubble's cut (in the step, on the thread that reached the point): drains
  // the device, releases it (the host's compute lock), shows the run paused, and waits for a
  // bubble with room; true once the step may go on, false when the run is stopping.
  const std::function<bool()>* suspend() const { return suspend_ ? &suspend_ : nullptr; }
  // A Stop came, or (resident) the bell's stop word is set: the run is to end.
  bool stopping() const;
  // Where a step under way reads its cut time (CLOCK_MONOTONIC ns): the bell's for a resident
  // run, which changes with each bubble; null for a test task that ignores pauses.
  const std::atomic<int64_t>* cut_at() const;

  int64_t steps() const { return steps_; }
  // A step was cut at the bubble's end (FillCutAtNs): it would have overrun the bubble. Its time
  // so far, a lower bound of the step's, went into the prediction.
  bool overran() const { return overran_; }
  int64_t step_ns() const { return step_ns_; }
  int64_t predicted_ns() const { return absl::ToInt64Nanoseconds(profile_.Predicted()); }

 private:
  FillSteps(fill::StepProfile profile, const proto::FillRun& fill, const std::atomic<bool>* stop,
            fill::BellLayout* bell)
      : profile_(std::move(profile)),
        bubble_end_ns_(fill.bubble_end_ns()),
        margin_(absl::Nanoseconds(fill.margin_ns())),
        ignore_pause_(fill.test_only_ignore_pause()),
        own_cut_at_ns_(FillCutAtNs(fill)),
        stop_(stop),
        bell_(bell) {}
  // Whether a step may start now: room in the bubble (the bell's, for a resident run).
  bool HasRoom() const;
  // Resident: what the run did so far, for pswitchd to read.
  void Publish(bool stepping, int64_t now_ns);
  bool Suspend();

  fill::StepProfile profile_;
  const int64_t bubble_end_ns_;
  const absl::Duration margin_;
  const bool ignore_pause_;
  const std::atomic<int64_t> own_cut_at_ns_;
  const std::atomic<bool>* const stop_;
  fill::BellLayout* const bell_;
  uint64_t overruns_ = 0;
  int64_t overrun_ns_ = 0;
  int64_t split_rows_ = 0;    // > 0: SetSplittable
  uint64_t late_starts_ = 0;  // steps begun with no bubble open (ignore_pause)
  uint64_t parts_ = 0;
  int64_t partial_ns_ = 0;    // the parts so far of a split step not yet done
  std::optional<gpu::ComputeLock> lock_;
  std::optional<gpu::ComputeLock::Hold> hold_;  // the device, while a step runs (host backend)
  std::function<void()> drain_;
  std::function<bool()> suspend_;  // set by SetSuspendable
  // The step under way: its computing time before its latest part, and when that part began
  // (-1: it is not computing, its suspension ended the run).
  int64_t active_ns_ = 0;
  int64_t part_start_ns_ = -1;
  bool suspended_in_step_ = false;
  int64_t steps_ = 0;
  int64_t step_ns_ = 0;
  bool overran_ = false;
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_FILL_STEPS_H_
