#include "pipeline/schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pswitch::pipeline {

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view text) {
  if (text == "gpipe") return ScheduleKind::kGpipe;
  if (text == "1f1b") return ScheduleKind::kOneFOneB;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule '", text, "' (expected gpipe or 1f1b)"));
}

absl::string_view ScheduleKindName(ScheduleKind kind) {
  return kind == ScheduleKind::kGpipe ? "gpipe" : "1f1b";
}

std::string OpName(const Op& op) {
  return absl::StrCat(op.kind == OpKind::kForward ? "F" : "B", op.microbatch);
}

absl::StatusOr<Schedule> BuildSchedule(ScheduleKind kind, int stages, int microbatches) {
  if (stages < 1 || stages > kMaxStages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages must be in [1, ", kMaxStages, "], got ", stages));
  }
  if (microbatches < 1 || microbatches > kMaxMicrobatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batches must be in [1, ", kMaxMicrobatches, "], got ", microbatches));
  }
  Schedule schedule{kind, stages, microbatches, std::vector<std::vector<Op>>(stages)};
  for (int s = 0; s < stages; ++s) {
    std::vector<Op>& ops = schedule.ops[s];
    ops.reserve(2 * microbatches);
    // GPipe is 1F1B with every forward counted as warm-up.
    const int warmup =
        kind == ScheduleKind::kGpipe ? microbatches : std::min(stages - s - 1, microbatches);
    for (int m = 0; m < warmup; ++m) ops.push_back({OpKind::kForward, m});
    const int steady = microbatches - warmup;
    for (int i = 0; i < steady; ++i) {
      ops.push_back({OpKind::kForward, warmup + i});
      ops.push_back({OpKind::kBackward, i});
    }
    for (int m = steady; m < microbatches; ++m) ops.push_back({OpKind::kBackward, m});
  }
  return schedule;
}

absl::Status ValidateSchedule(const Schedule& schedule) {
  if (static_cast<int>(schedule.ops.size()) != schedule.stages) {
    return absl::InvalidArgumentError(absl::StrCat("schedule has ", schedule.ops.size(),
                                                   " op lists for ", schedule.stages, " stages"));
  }
  for (int s = 0; s < schedule.stages; ++s) {
    std::vector<int> forwards(schedule.microbatches, 0), backwards(schedule.microbatches, 0);
    for (const Op& op : schedule.ops[s]) {
      if (op.microbatch < 0 || op.microbatch >= schedule.microbatches) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", s, ": ", OpName(op), " names no micro-batch"));
      }
      if (op.kind == OpKind::kForward) {
        ++forwards[op.microbatch];
      } else {
        if (forwards[op.microbatch] == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("stage ", s, ": ", OpName(op), " runs before its forward"));
        }
        ++backwards[op.microbatch];
      }
    }
    for (int m = 0; m < schedule.microbatches; ++m) {
      if (forwards[m] != 1 || backwards[m] != 1) {
        return absl::InvalidArgumentError(absl::StrCat("stage ", s, ": micro-batch ", m, " has ",
                                                       forwards[m], " forwards and ", backwards[m],
                                                       " backwards (expected 1 each)"));
      }
    }
  }
  return absl::OkStatus();
}

int PeakInFlight(const std::vector<Op>& ops) {
  int in_flight = 0, peak = 0;
  for (const Op& op : ops) {
    in_flight += op.kind == OpKind::kForward ? 1 : -1;
    peak = std::max(peak, in_flight);
  }
  return peak;
}

}  // namespace pswitch::pipeline
