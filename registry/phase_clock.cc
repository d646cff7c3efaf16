#include "registry/phase_clock.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/log.h"

namespace pswitch::registry {

PhaseClock::PhaseClock(std::string model) : model_(std::move(model)), since_(absl::Now()) {}

void PhaseClock::End(absl::string_view phase) {
  const absl::Time now = absl::Now();
  Record(phase, now - since_);
  since_ = now;
}

void PhaseClock::EndSplit(absl::string_view first, absl::string_view second,
                          absl::Duration second_took) {
  const absl::Time now = absl::Now();
  second_took = std::clamp(second_took, absl::ZeroDuration(), now - since_);
  Record(first, now - since_ - second_took);
  Record(second, second_took);
  since_ = now;
}

void PhaseClock::Record(absl::string_view phase, absl::Duration took) {
  phases_.push_back(RegistrationPhase{std::string(phase), took});
  base::Log(base::LogLevel::kInfo, "registration_phase")
      .Field("model", model_)
      .Field("phase", phase)
      .FieldMs("ms", took);
}

std::string FormatPhases(const std::vector<RegistrationPhase>& phases) {
  std::string out;
  for (const RegistrationPhase& p : phases) {
    absl::StrAppendFormat(&out, "%s%s %.2f s", out.empty() ? "" : ", ", p.name,
                          absl::ToDoubleSeconds(p.took));
  }
  return out;
}

}  // namespace pswitch::registry
