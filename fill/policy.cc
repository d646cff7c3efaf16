#include "fill/policy.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pswitch::fill {

absl::StatusOr<FillPolicy> ParseFillPolicy(absl::string_view name) {
  if (name == "fifo") return FillPolicy::kFifo;
  if (name == "sjf") return FillPolicy::kSjf;
  if (name == "makespan") return FillPolicy::kMakespan;
  if (name == "deadline") return FillPolicy::kDeadline;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown fill policy '", name, "' (expected fifo, sjf, makespan or deadline)"));
}

absl::string_view FillPolicyName(FillPolicy policy) {
  switch (policy) {
    case FillPolicy::kFifo:
      return "fifo";
    case FillPolicy::kSjf:
      return "sjf";
    case FillPolicy::kMakespan:
      return "makespan";
    case FillPolicy::kDeadline:
      return "deadline";
  }
  return "unknown";
}

double FifoScore(const ScoreInput& in) {
  // Relative to now rather than absolute Unix seconds, which would lose sub-microsecond
  // differences in a double.
  return absl::ToDoubleSeconds(in.now - in.job.submitted);
}

double SjfScore(const ScoreInput& in) { return -absl::ToDoubleSeconds(in.processing_time); }

double MakespanScore(const ScoreInput& in) {
  return -absl::ToDoubleSeconds(std::max(in.processing_time, in.other_stages_busy));
}

double DeadlineScore(const ScoreInput& in) {
  if (!in.job.deadline.has_value()) return -std::numeric_limits<double>::infinity();
  const absl::Duration slack = *in.job.deadline - (in.now + in.processing_time);
  return -absl::ToDoubleSeconds(slack);
}

ScoreFunction ScoreFunctionFor(FillPolicy policy) {
  switch (policy) {
    case FillPolicy::kFifo:
      return FifoScore;
    case FillPolicy::kSjf:
      return SjfScore;
    case FillPolicy::kMakespan:
      return MakespanScore;
    case FillPolicy::kDeadline:
      return DeadlineScore;
  }
  return FifoScore;
}

}  // namespace pswitch::fill
