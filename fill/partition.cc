#include "fill/partition.h"

#include <algorithm>
#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::fill {
namespace {

bool IsFinite(absl::Duration d) {
  return d != absl::InfiniteDuration() && d != -absl::InfiniteDuration();
}

// ResourceExhausted saying why no bubble holds a step: memory everywhere, or time in the
// bubbles whose memory would do.
absl::Status NeverFits(const BubbleCycle& cycle, const FillWork& work) {
  const std::string what = absl::StrCat(
      "fill work (step ", absl::FormatDuration(work.step_duration), ", ", work.memory_bytes,
      " bytes, switch overhead ", absl::FormatDuration(work.switch_overhead), ")");
  absl::Duration longest = absl::ZeroDuration();
  int64_t most_free = -1;
  bool memory_fits = false;
  for (const Bubble& bubble : cycle.bubbles) {
    most_free = std::max(most_free, bubble.free_bytes);
    if (bubble.free_bytes < work.memory_bytes) continue;
    memory_fits = true;
    longest = std::max(longest, bubble.duration);
  }
  if (cycle.bubbles.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " never runs: the cycle has no bubbles"));
  }
  if (!memory_fits) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " never runs: no bubble has enough free memory (most free: ", most_free, " bytes)"));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " never runs: the bubbles with enough memory last at most ",
                   absl::FormatDuration(longest), ", not more than switch overhead plus one step"));
}

// Walks the cycle timeline from `start`, packing steps greedily. With `list_chunks` false it
// skips whole cycles arithmetically, so its cost does not grow with the number of steps.
absl::StatusOr<PartitionPlan> Walk(const BubbleCycle& cycle, const FillWork& work,
                                   absl::Duration start, bool list_chunks) {
  PSWITCH_RETURN_IF_ERROR(ValidateBubbleCycle(cycle));
  PSWITCH_RETURN_IF_ERROR(ValidateFillWork(work));
  if (!IsFinite(start) || start < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("partition: start must be finite and >= 0, got ",
                                                   absl::FormatDuration(start)));
  }
  PartitionPlan plan;
  plan.completion = start;
  if (work.steps == 0) return plan;

  std::vector<int64_t> capacity;  // per bubble, capped at the job's steps
  int64_t per_cycle = 0;          // saturates at work.steps: only "enough or not" matters then
  int64_t bubbles_used = 0;
  for (const Bubble& bubble : cycle.bubbles) {
    capacity.push_back(std::min(StepsPerBubble(bubble, work), work.steps));
    // Saturating: capacity and per_cycle are both <= work.steps, so compare before adding.
    per_cycle =
        capacity.back() >= work.steps - per_cycle ? work.steps : per_cycle + capacity.back();
    if (capacity.back() > 0) ++bubbles_used;
  }
  if (per_cycle == 0) return NeverFits(cycle, work);

  absl::Duration within;
  int64_t cycle_index = absl::IDivDuration(start, cycle.period, &within);
  int64_t remaining = work.steps;
  // Runs bubble `b` of cycle `cycle_index`; true once the job is done.
  auto run_bubble = [&](size_t b) {
    const int64_t steps = std::min(capacity[b], remaining);
    if (steps == 0) return false;
    remaining -= steps;
    if (list_chunks) plan.chunks.push_back({cycle_index, static_cast<int>(b), steps});
    if (remaining > 0) return false;
    plan.completion = cycle.period * cycle_index + cycle.bubbles[b].offset + work.switch_overhead +
                      work.step_duration * steps;
    return true;
  };

  for (size_t b = 0; b < cycle.bubbles.size(); ++b) {
    if (cycle.bubbles[b].offset >= within && run_bubble(b)) return plan;
  }
  ++cycle_index;
  // Every cycle from here on is whole, so all but the last one the job needs run per_cycle.
  // (per_cycle is exact here: it saturated only if one cycle could finish the job.)
  const int64_t full_cycles = (remaining - 1) / per_cycle;
  if (list_chunks) {
    const int64_t room = kMaxPlanChunks - static_cast<int64_t>(plan.chunks.size());
    if (full_cycles >= kMaxPlanChunks || (full_cycles + 1) * bubbles_used > room) {
      return absl::OutOfRangeError(absl::StrCat(
          "partition: the plan for ", work.steps, " steps would have more than ", kMaxPlanChunks,
          " chunks; use PredictFillCompletion for its completion time"));
    }
  } else {
    cycle_index += full_cycles;
    remaining -= full_cycles * per_cycle;
  }
  for (;; ++cycle_index) {
    for (size_t b = 0; b < cycle.bubbles.size(); ++b) {
      if (run_bubble(b)) return plan;
    }
  }
}

}  // namespace

int64_t StepsPerBubble(const Bubble& bubble, const FillWork& work) {
  if (bubble.free_bytes < work.memory_bytes) return 0;
  const absl::Duration usable = bubble.duration - work.switch_overhead;
  if (usable <= absl::ZeroDuration() || work.step_duration <= absl::ZeroDuration()) return 0;
  absl::Duration rest;
  const int64_t whole = absl::IDivDuration(usable, work.step_duration, &rest);
  // Strict fit: k steps need k * d < usable, so an exact multiple loses its last step.
  return rest == absl::ZeroDuration() ? whole - 1 : whole;
}

absl::Status ValidateFillWork(const FillWork& work) {
  if (work.steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fill work: steps must be >= 0, got ", work.steps));
  }
  if (!IsFinite(work.step_duration) || work.step_duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fill work: step_duration must be finite and > 0, got ",
                     absl::FormatDuration(work.step_duration)));
  }
  if (work.memory_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fill work: memory_bytes must be >= 0, got ", work.memory_bytes));
  }
  if (!IsFinite(work.switch_overhead) || work.switch_overhead < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fill work: switch_overhead must be finite and >= 0, got ",
                     absl::FormatDuration(work.switch_overhead)));
  }
  return absl::OkStatus();
}

absl::StatusOr<PartitionPlan> PartitionFillJob(const BubbleCycle& cycle, const FillWork& work,
                                               absl::Duration start) {
  return Walk(cycle, work, start, /*list_chunks=*/true);
}

absl::StatusOr<absl::Duration> PredictFillCompletion(const BubbleCycle& cycle, const FillWork& work,
                                                     absl::Duration start) {
  PSWITCH_ASSIGN_OR_RETURN(PartitionPlan plan, Walk(cycle, work, start, /*list_chunks=*/false));
  return plan.completion;
}

}  // namespace pswitch::fill
