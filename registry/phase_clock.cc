#include "registry/phase_clock.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "base/log.h"

namespace pswitch::registry {

PhaseClock::PhaseClock(std::string model) : model_(std::move(model)), since_(absl::Now()) {}

void PhaseClock::End(absl::string_view phase) {
  const absl::Time now = absl::Now();
  phases_.push_back(RegistrationPhase{std::string(phase), now - since_});
  since_ = now;
  base::Log(base::LogLevel::kInfo, "registration_phase")
      .Field("model", model_)
      .Field("phase", phase)
      .FieldMs("ms", phases_.back().took);
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
