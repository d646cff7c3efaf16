// Payloads of the coordinator <-> stage control messages (wire.h kinds kProfile .. kError): JSON
// text, durations as integer nanoseconds. Decoders validate every field and never throw.
#ifndef PSWITCH_PIPELINE_INTERNAL_CONTROL_H_
#define PSWITCH_PIPELINE_INTERNAL_CONTROL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "pipeline/report.h"
#include "pipeline/simulator.h"

namespace pswitch::pipeline::internal {

// kReady: one stage's costs.
std::string EncodeCost(const StageCost& cost);
absl::StatusOr<StageCost> DecodeCost(absl::string_view text);

// kPlan: every stage's costs; `stages` is how many the receiver expects.
std::string EncodePlan(const std::vector<StageCost>& costs);
absl::StatusOr<std::vector<StageCost>> DecodePlan(absl::string_view text, int stages);

// kStart: the iteration's start time, the origin of every offset the stages report.
std::string EncodeStart(absl::Time start);
absl::StatusOr<absl::Time> DecodeStart(absl::string_view text);

// kDone: the stage's measurements (tail excluded; the coordinator fills it in).
std::string EncodeStats(const StageIterationStats& stats);
absl::StatusOr<StageIterationStats> DecodeStats(absl::string_view text);

// kError: the status the stage failed with. DecodeError returns that status (Internal when the
// payload is unreadable); never OK.
std::string EncodeError(const absl::Status& status);
absl::Status DecodeError(absl::string_view text);

}  // namespace pswitch::pipeline::internal

#endif  // PSWITCH_PIPELINE_INTERNAL_CONTROL_H_
