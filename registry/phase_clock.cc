#include "registry/phase_clock.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "base/log.h"

namespace pswitch::registry {

PhaseClock::PhaseClock(std::string model, PhaseObserver observer)
    : model_(std::move(model)), observer_(std::move(observer)), since_ns_(base::MonotonicNowNs()) {}

void PhaseClock::End(absl::string_view phase) {
  const int64_t now = base::MonotonicNowNs();
  Record(phase, absl::Nanoseconds(now - since_ns_));
  since_ns_ = now;
}

void PhaseClock::Progress(absl::string_view phase, std::string detail) {
  if (!observer_ || detail.empty()) return;
  observer_(RegistrationPhase{std::string(phase),
                              absl::Nanoseconds(base::MonotonicNowNs() - since_ns_),
                              std::move(detail)});
}

void PhaseClock::EndSplit(absl::string_view first, absl::string_view second,
                          absl::Duration second_took) {
  const int64_t now = base::MonotonicNowNs();
  const absl::Duration took = absl::Nanoseconds(now - since_ns_);
  second_took = std::clamp(second_took, absl::ZeroDuration(), took);
  Record(first, took - second_took);
  Record(second, second_took);
  since_ns_ = now;
}

void PhaseClock::Record(absl::string_view phase, absl::Duration took) {
  phases_.push_back(RegistrationPhase{std::string(phase), took});
  base::Log(base::LogLevel::kInfo, "registration_phase")
      .Field("model", model_)
      .Field("phase", phase)
      .FieldMs("ms", took);
  if (observer_) observer_(phases_.back());
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
