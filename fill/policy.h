// Fill-job scheduling policies as score functions (PipeFill §4.4): when a stage needs a job for
// its next bubble, the scheduler scores each job waiting for that stage and runs the highest
// score; equal scores go to the earlier submission. Scores are doubles in seconds.
//
//   fifo      waited = now - submitted. Oldest first.
//   sjf       -processing_time. Shortest predicted remaining time first (the paper's
//             1 / min(proc_times), restricted to the stage the job is placed on).
//   makespan  -max(processing_time, other_stages_busy), the paper's 1 / max(proc_times[i],
//             s.rem_times): jobs that finish before the busiest other stage frees up tie (and
//             run in submission order); longer ones run shortest first, so the stage extends
//             the overall makespan as late and as little as it can.
//   deadline  -slack, slack = deadline - (now + processing_time): least slack first. Jobs
//             without a deadline score -infinity, so they run after every job with one, in
//             submission order (the paper's "default to FIFO when there are no deadlines").
//             Slack order does not depend on `now`, so a queue's order is stable over time.
#ifndef PSWITCH_FILL_POLICY_H_
#define PSWITCH_FILL_POLICY_H_

#include <functional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fill/fill_job.h"

namespace pswitch::fill {

enum class FillPolicy { kFifo, kSjf, kMakespan, kDeadline };

// "fifo", "sjf", "makespan" or "deadline"; InvalidArgument otherwise.
absl::StatusOr<FillPolicy> ParseFillPolicy(absl::string_view name);
absl::string_view FillPolicyName(FillPolicy policy);

// What a score function knows when ranking `job` for stage `stage` at `now`. Borrowed: valid
// only during the call.
struct ScoreInput {
  const FillJob& job;
  int stage = 0;
  absl::Time now;
  // From now until the job's last step ends on this stage if it runs next: the partition
  // plan's prediction (partition.h), switch overheads and bubble gaps included.
  absl::Duration processing_time;
  // The longest time any other stage stays busy with its current job (0 if all are idle).
  absl::Duration other_stages_busy;
};

// Higher runs first.
using ScoreFunction = std::function<double(const ScoreInput&)>;

double FifoScore(const ScoreInput& in);
double SjfScore(const ScoreInput& in);
double MakespanScore(const ScoreInput& in);
double DeadlineScore(const ScoreInput& in);

ScoreFunction ScoreFunctionFor(FillPolicy policy);

}  // namespace pswitch::fill

#endif  // PSWITCH_FILL_POLICY_H_
