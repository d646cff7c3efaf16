#include "fill/step_gate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pswitch::fill {
namespace {

bool IsFiniteNonNegative(absl::Duration d) {
  return d >= absl::ZeroDuration() && d != absl::InfiniteDuration();
}

}  // namespace

bool MayStartStep(absl::Duration bubble_remaining, absl::Duration predicted_step,
                  absl::Duration safety_margin) {
  if (predicted_step == absl::InfiniteDuration()) return false;
  const absl::Duration margin = std::max(safety_margin, absl::ZeroDuration());
  return bubble_remaining > predicted_step + margin;
}

bool MayStartStep(absl::Time now, absl::Time bubble_end, absl::Duration predicted_step,
                  absl::Duration safety_margin) {
  return MayStartStep(bubble_end - now, predicted_step, safety_margin);
}

absl::StatusOr<StepProfile> StepProfile::Create(absl::Duration profiled_step,
                                                StepProfileOptions options) {
  if (profiled_step <= absl::ZeroDuration() || profiled_step == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step profile: profiled step must be positive and finite, got ",
                     absl::FormatDuration(profiled_step)));
  }
  if (options.window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step profile: window must be >= 1, got ", options.window));
  }
  if (!(options.mean_gain > 0.0 && options.mean_gain <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step profile: mean_gain must be in (0, 1], got ", options.mean_gain));
  }
  if (!(options.deviation_gain > 0.0 && options.deviation_gain <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step profile: deviation_gain must be in (0, 1], got ", options.deviation_gain));
  }
  // Written as a negated >= so that NaN is rejected too.
  if (!(options.deviation_multiplier >= 0.0 && options.deviation_multiplier < 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step profile: deviation_multiplier must be in [0, 1e6), got ",
                     options.deviation_multiplier));
  }
  return StepProfile(profiled_step, options);
}

StepProfile::StepProfile(absl::Duration profiled_step, StepProfileOptions options)
    : options_(options), recent_{profiled_step}, mean_(profiled_step) {}

absl::Status StepProfile::Record(absl::Duration measured_step) {
  if (!IsFiniteNonNegative(measured_step)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step profile: measured step must be finite and >= 0, got ",
                     absl::FormatDuration(measured_step)));
  }
  // RFC 6298 order: the deviation uses the mean from before this sample.
  deviation_ += (absl::AbsDuration(measured_step - mean_) - deviation_) * options_.deviation_gain;
  mean_ += (measured_step - mean_) * options_.mean_gain;
  recent_.push_back(measured_step);
  while (static_cast<int>(recent_.size()) > options_.window) recent_.pop_front();
  ++samples_;
  return absl::OkStatus();
}

absl::Duration StepProfile::Predicted() const {
  const absl::Duration recent_max = *std::max_element(recent_.begin(), recent_.end());
  return std::max(recent_max, mean_ + deviation_ * options_.deviation_multiplier);
}

}  // namespace pswitch::fill
