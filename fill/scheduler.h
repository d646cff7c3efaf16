// The fill-job scheduler: places submitted fill jobs on pipeline stages (GPUs) and picks the
// job each stage runs in its bubbles (PipeFill §4.4, FreeRide's side task manager).
//
// Placement happens once, at Submit: among the stages where the job can run at all (a bubble
// with enough free memory and time for one step, see partition.h), the one where it is
// predicted to finish first if queued behind everything already there; ties go to the stage
// with fewer jobs, then the lower index. Greedy earliest-finish placement spreads load the way
// list scheduling does for makespan; FreeRide's "fewest waiting tasks" ignores that stages'
// bubbles differ in size.
//
// Each stage runs one job at a time, to completion: Next() keeps returning a stage's current
// job until it finishes or is removed, as FreeRide's manager keeps its CurrentTask. A paused
// fill job keeps its GPU memory, so switching jobs between bubbles would need room for two.
// When a stage has no current job, Next() starts the waiting job with the highest policy score
// (policy.h).
//
// Estimates chain a stage's jobs in run order: the current job from `now`, then the waiting
// jobs in score order as of `now`, each starting in the first bubble that begins after its
// predecessor's last step. Later Next() calls may order differently (SJF and makespan scores
// move with time), so an estimate is a prediction, not a promise.
#ifndef PSWITCH_FILL_SCHEDULER_H_
#define PSWITCH_FILL_SCHEDULER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fill/bubble_cycle.h"
#include "fill/fill_job.h"
#include "fill/policy.h"

namespace pswitch::fill {

struct FillStage {
  std::string name;  // for messages; "stage <index>" when empty
  BubbleCycle cycle;
  absl::Time cycle_origin;         // the start of some iteration: time 0 of the cycle timeline
  absl::Duration switch_overhead;  // >= 0: paid by a fill job in every bubble it runs in
};

struct FillSchedulerOptions {
  FillPolicy policy = FillPolicy::kFifo;
  ScoreFunction custom_score;  // when set, used instead of `policy`'s score
  // When true, Submit refuses a job with a deadline it is predicted to miss, and a job whose
  // admission would make an admitted job miss a deadline it was predicted to meet.
  bool reject_missed_deadlines = false;
};

struct FillEstimate {
  int stage = 0;
  absl::Time completion;       // when its last step ends
  bool meets_deadline = true;  // false when it has a deadline before `completion`
};

// Not thread-safe: owned by one manager thread, which passes the current time to every call.
class FillScheduler {
 public:
  // InvalidArgument for no stages, an invalid cycle (naming the stage), a negative or infinite
  // switch overhead, or an infinite cycle origin.
  static absl::StatusOr<std::unique_ptr<FillScheduler>> Create(std::vector<FillStage> stages,
                                                               FillSchedulerOptions options = {});

  FillScheduler(const FillScheduler&) = delete;
  FillScheduler& operator=(const FillScheduler&) = delete;

  // Places `job` (see the file comment). InvalidArgument for an invalid job (ValidateFillJob)
  // or an infinite `now`, AlreadyExists for a known id, ResourceExhausted when no stage's
  // bubbles can ever hold it (the message gives each stage's reason), FailedPrecondition for a
  // deadline refusal.
  absl::Status Submit(const FillJob& job, absl::Time now);

  // The job to run in `stage`'s next bubble: its current job, else the best waiting one (which
  // becomes current), else nullopt. InvalidArgument for a stage out of range.
  absl::StatusOr<std::optional<uint64_t>> Next(int stage, absl::Time now);

  // Sets the job's completed steps. A job reaching steps_total is finished and forgotten, which
  // frees its stage for the next job. NotFound for an unknown job; InvalidArgument when
  // steps_done goes backwards or past steps_total.
  absl::Status ReportProgress(uint64_t job_id, int64_t steps_done);

  // Forgets a waiting or current job (a cancel). NotFound for an unknown job.
  absl::Status Remove(uint64_t job_id);

  // The job's stage and predicted completion (see the file comment). NotFound for an unknown job.
  absl::StatusOr<FillEstimate> Estimate(uint64_t job_id, absl::Time now) const;

  // What Submit(job, now) would predict (its stage, completion, deadline), without submitting:
  // the scheduler is left as it was. Submit's errors, deadline refusal included.
  absl::StatusOr<FillEstimate> EstimateNew(const FillJob& job, absl::Time now);

  // The stage's jobs in predicted run order: the current job first, then the waiting ones by
  // score. Empty for a stage out of range.
  std::vector<uint64_t> RunOrder(int stage, absl::Time now) const;

  // The stage a job was placed on; nullopt for an unknown job.
  std::optional<int> StageOf(uint64_t job_id) const;
  int num_stages() const { return static_cast<int>(stages_.size()); }
  size_t num_jobs() const { return jobs_.size(); }

 private:
  struct PlacedJob {
    FillJob job;
    int stage = 0;
    int64_t seq = 0;  // submission order, the tie-breaker between equal scores
  };
  struct StageQueue {
    std::optional<uint64_t> current;
    std::vector<uint64_t> waiting;  // unordered; ranked on demand because scores move with time
  };
  struct ChainEntry {
    uint64_t job_id = 0;
    absl::Time completion;
  };

  FillScheduler(std::vector<FillStage> stages, FillSchedulerOptions options);

  absl::StatusOr<absl::Time> PredictCompletion(int stage, const FillJob& job,
                                               absl::Time start) const;
  absl::Time CompletionOfPlaced(const PlacedJob& placed, absl::Time start) const;
  absl::Duration BusyTime(int stage, absl::Time now) const;
  std::vector<uint64_t> RankedWaiting(int stage, absl::Time now) const;
  std::vector<ChainEntry> Chain(int stage, absl::Time now) const;
  absl::StatusOr<int> Place(const FillJob& job, absl::Time now) const;
  absl::Status CheckDeadlines(int stage, const std::vector<ChainEntry>& before, uint64_t new_job,
                              absl::Time now) const;
  void Forget(uint64_t job_id);

  const std::vector<FillStage> stages_;
  const ScoreFunction score_;
  const bool reject_missed_deadlines_;
  int64_t next_seq_ = 0;
  absl::flat_hash_map<uint64_t, PlacedJob> jobs_;
  std::vector<StageQueue> queues_;  // one per stage
};

}  // namespace pswitch::fill

#endif  // PSWITCH_FILL_SCHEDULER_H_
