#include "pipeline/simulator.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace pswitch::pipeline {

absl::Duration StageTimeline::IdleBefore(int index) const {
  for (const IdleInterval& interval : idle) {
    if (interval.before_op == index) return interval.duration;
  }
  return absl::ZeroDuration();
}

double UniformBubbleRatio(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1);
}

namespace {

// End times of finished ops, indexed [stage][microbatch]; nullopt until the op has run.
struct Finished {
  std::vector<std::vector<std::optional<absl::Duration>>> forward, backward;
};

// When op `op` on stage `s` may start as far as its input goes; nullopt while the producing op
// has not run. The stage's own forward precedes its backward by construction (validated).
std::optional<absl::Duration> InputReady(const Finished& done, int stages, int s, const Op& op) {
  if (op.kind == OpKind::kForward) {
    if (s == 0) return absl::ZeroDuration();
    return done.forward[s - 1][op.microbatch];
  }
  if (s == stages - 1) return done.forward[s][op.microbatch];
  return done.backward[s + 1][op.microbatch];
}

}  // namespace

absl::StatusOr<SimulatedIteration> Simulate(const Schedule& schedule,
                                            const std::vector<StageCost>& costs) {
  PSWITCH_RETURN_IF_ERROR(ValidateSchedule(schedule));
  const int S = schedule.stages, M = schedule.microbatches;
  if (static_cast<int>(costs.size()) != S) {
    return absl::InvalidArgumentError(
        absl::StrCat(costs.size(), " stage costs for ", S, " stages"));
  }
  for (int s = 0; s < S; ++s) {
    if (costs[s].forward < absl::ZeroDuration() || costs[s].backward < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", s, ": negative op cost"));
    }
  }
  Finished done{std::vector<std::vector<std::optional<absl::Duration>>>(
                    S, std::vector<std::optional<absl::Duration>>(M)),
                std::vector<std::vector<std::optional<absl::Duration>>>(
                    S, std::vector<std::optional<absl::Duration>>(M))};
  SimulatedIteration result;
  result.stages.resize(S);
  std::vector<size_t> next(S, 0);
  std::vector<absl::Duration> free_at(S, absl::ZeroDuration());
  // A fixed per-stage order makes this a list schedule: an op's start depends only on ops that
  // finished before it, so sweeping until no stage can advance computes exact times.
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (int s = 0; s < S; ++s) {
      while (next[s] < schedule.ops[s].size()) {
        const Op& op = schedule.ops[s][next[s]];
        std::optional<absl::Duration> ready = InputReady(done, S, s, op);
        if (!ready) break;
        const absl::Duration start = std::max(free_at[s], *ready);
        const absl::Duration end =
            start + (op.kind == OpKind::kForward ? costs[s].forward : costs[s].backward);
        (op.kind == OpKind::kForward ? done.forward : done.backward)[s][op.microbatch] = end;
        result.stages[s].ops.push_back({op, start, end});
        free_at[s] = end;
        ++next[s];
        progressed = true;
      }
    }
  }
  std::vector<std::string> stuck;
  for (int s = 0; s < S; ++s) {
    if (next[s] < schedule.ops[s].size()) {
      stuck.push_back(absl::StrCat("stage ", s, " at ", OpName(schedule.ops[s][next[s]])));
    }
  }
  if (!stuck.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("schedule deadlocks: ", absl::StrJoin(stuck, ", ")));
  }

  result.iteration = *std::max_element(free_at.begin(), free_at.end());
  absl::Duration idle_sum;
  for (int s = 0; s < S; ++s) {
    StageTimeline& stage = result.stages[s];
    absl::Duration cursor;
    for (size_t i = 0; i < stage.ops.size(); ++i) {
      const TimedOp& op = stage.ops[i];
      if (op.start > cursor) {
        stage.idle.push_back({static_cast<int>(i), cursor, op.start - cursor});
      }
      stage.busy += op.end - op.start;
      cursor = op.end;
    }
    if (result.iteration > cursor) {
      stage.idle.push_back({static_cast<int>(stage.ops.size()), cursor, result.iteration - cursor});
    }
    stage.idle_total = result.iteration - stage.busy;
    idle_sum += stage.idle_total;
  }
  if (result.iteration > absl::ZeroDuration()) {
    result.bubble_ratio = absl::FDivDuration(idle_sum, result.iteration) / S;
  }
  return result;
}

}  // namespace pswitch::pipeline
