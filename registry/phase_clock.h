// Times the phases of one registration as they end, and logs each one (event=registration_phase),
// so an operator watching the log sees a long registration advance and where its time goes.
#ifndef PSWITCH_REGISTRY_PHASE_CLOCK_H_
#define PSWITCH_REGISTRY_PHASE_CLOCK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "registry/model_entry.h"

namespace pswitch::registry {

// Not thread-safe: one registration's, on the thread running it.
// Told each phase as it ends (a client's progress line, the repository index's reason), and
// while a long one runs, how far it has come (RegistrationPhase::running()).
using PhaseObserver = std::function<void(const RegistrationPhase&)>;

class PhaseClock {
 public:
  explicit PhaseClock(std::string model, PhaseObserver observer = nullptr);

  // Ends the phase that ran since the previous End (or construction) as `phase`.
  void End(absl::string_view phase);
  // Tells the observer how far the phase running now, `phase`, has come (`detail`, non-empty).
  // Nothing is recorded or logged: the phase's end is.
  void Progress(absl::string_view phase, std::string detail);
  // Ends it as two phases, `first` then `second`, where `second` took `second_took` of it (as
  // another process measured it: the inspection child's profile).
  void EndSplit(absl::string_view first, absl::string_view second, absl::Duration second_took);
  const std::vector<RegistrationPhase>& phases() const { return phases_; }

 private:
  void Record(absl::string_view phase, absl::Duration took);

  const std::string model_;
  const PhaseObserver observer_;
  int64_t since_ns_;  // CLOCK_MONOTONIC: a wall-clock step never makes a phase negative
  std::vector<RegistrationPhase> phases_;
};

// "read 0.01 s, inspect 1.20 s, ...": the phases for a one-line summary.
std::string FormatPhases(const std::vector<RegistrationPhase>& phases);

}  // namespace pswitch::registry

#endif  // PSWITCH_REGISTRY_PHASE_CLOCK_H_
