// When to start a worker slot's process again. A worker that had been serving and died is
// replaced at once; one that failed before it was ready is retried after 100 ms, doubling to
// 5 s, so a worker that cannot start never spins the daemon. After kMaxStartFailures failures in
// a row a slot counts as given up: tasks stop waiting for it (it is still retried). Pure logic,
// time passed in; not thread-safe (the scheduler loop owns it).
#ifndef PSWITCH_CONTROLLER_RESPAWN_BACKOFF_H_
#define PSWITCH_CONTROLLER_RESPAWN_BACKOFF_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pswitch::controller {

class RespawnBackoff {
 public:
  static constexpr int kMaxStartFailures = 3;

  explicit RespawnBackoff(size_t slots) : slots_(slots) {}

  // The slot's worker died or failed to spawn at `now`. Returns the delay before it is started
  // again: zero for a worker that had been serving (`was_ready`), else the growing back-off.
  absl::Duration Failed(size_t slot, bool was_ready, absl::string_view why, absl::Time now);
  // Slots whose delay has passed at `now`, each returned once; the caller starts them.
  std::vector<size_t> Due(absl::Time now);
  // The earliest pending restart (InfiniteFuture when none), for the loop's wait.
  absl::Time Next() const;
  bool GaveUp(size_t slot) const { return slots_[slot].start_failures >= kMaxStartFailures; }
  int start_failures(size_t slot) const { return slots_[slot].start_failures; }
  const std::string& last_error(size_t slot) const { return slots_[slot].last_error; }

 private:
  struct Slot {
    int start_failures = 0;  // in a row, each before the worker was ready
    absl::Time respawn_at = absl::InfiniteFuture();
    std::string last_error;
  };
  std::vector<Slot> slots_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_RESPAWN_BACKOFF_H_
