#include "controller/respawn_backoff.h"

#include <algorithm>
#include <cstdint>

namespace pswitch::controller {

absl::Duration RespawnBackoff::Failed(size_t slot, bool was_ready, absl::string_view why,
                                      absl::Time now) {
  Slot& s = slots_[slot];
  if (was_ready) {
    s = Slot{};
    return absl::ZeroDuration();
  }
  ++s.start_failures;
  s.last_error = std::string(why);
  const absl::Duration delay =
      std::min(absl::Milliseconds(100) * (int64_t{1} << std::min(s.start_failures - 1, 6)),
               absl::Seconds(5));
  s.respawn_at = now + delay;
  return delay;
}

std::vector<size_t> RespawnBackoff::Due(absl::Time now) {
  std::vector<size_t> due;
  for (size_t slot = 0; slot < slots_.size(); ++slot) {
    if (slots_[slot].respawn_at > now) continue;
    slots_[slot].respawn_at = absl::InfiniteFuture();
    due.push_back(slot);
  }
  return due;
}

absl::Time RespawnBackoff::Next() const {
  absl::Time next = absl::InfiniteFuture();
  for (const Slot& s : slots_) next = std::min(next, s.respawn_at);
  return next;
}

}  // namespace pswitch::controller
