// Which models each worker slot has loaded or is still loading, and the registrations waiting
// for the live workers' answers. Pure bookkeeping, no processes: the scheduler sends the
// LoadModel commands and reports what happened. Not thread-safe (the scheduler loop owns it).
#ifndef PSWITCH_CONTROLLER_MODEL_LOADS_H_
#define PSWITCH_CONTROLLER_MODEL_LOADS_H_

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pswitch::controller {

// One worker's answer to a load, or a registration's summary of its workers' answers: the first
// error, and the slowest warm step each kind measured (worker/warm_up.h; zero: not measured).
struct LoadOutcome {
  absl::Status status;
  absl::Duration infer_step;
  absl::Duration train_step;

  // Sums `other` in: the first error stays, the slowest steps win.
  void Merge(const LoadOutcome& other) {
    if (!other.status.ok() && status.ok()) status = other.status;
    infer_step = std::max(infer_step, other.infer_step);
    train_step = std::max(train_step, other.train_step);
  }
};

class ModelLoads {
 public:
  using Done = std::function<void(const LoadOutcome&)>;

  explicit ModelLoads(size_t slots) : slots_(slots) {}

  // A fresh process in `slot`: nothing loaded or loading, not announced yet.
  void Reset(size_t slot) { slots_[slot] = Slot{}; }
  // The worker announced itself (it is about to be sent the whole catalog).
  void Announce(size_t slot) { slots_[slot].announced = true; }
  bool announced(size_t slot) const { return slots_[slot].announced; }

  // A LoadModel for `model` went to `slot`.
  void Sent(size_t slot, const std::string& model);
  // `slot` answered its load of `model`; registrations this completes get their `done` (the
  // first error among their answers, or OK, and the slowest measured steps).
  void Answered(size_t slot, const std::string& model, const LoadOutcome& outcome);
  // `slot`'s process died: loads it was sent will never be answered, and no longer count
  // towards any registration (loads it was not sent were never its to count). What it had
  // loaded stays known until Reset.
  void Died(size_t slot);

  // A newly registered model: `done` runs once each of `slots` has answered its load (or died).
  // No slots runs it at once with OK. Other slots' answers (a worker that announced later and
  // loaded the whole catalog) do not count.
  void Await(const std::string& model, std::set<size_t> slots, Done done);

  // An unload: no slot holds `model` any more (a later registration of the name loads afresh).
  // A load still in flight (a busy worker loads after its run) is answered into nothing.
  void Forget(const std::string& model) {
    for (Slot& s : slots_) {
      s.loaded.erase(model);
      if (s.loading.contains(model)) s.dropped.insert(model);
    }
  }
  // `slot` holds `model` or was sent a load of it: an unload must tell it to drop it.
  bool Holds(size_t slot, const std::string& model) const {
    return slots_[slot].loaded.contains(model) || slots_[slot].loading.contains(model);
  }
  // A load of `model` was forgotten while in flight: a new registration must send its own.
  bool Dropped(size_t slot, const std::string& model) const {
    return slots_[slot].dropped.contains(model);
  }
  // Some slot was sent a load of `model` and has not answered yet.
  bool AnyLoading(const std::string& model) const {
    for (const Slot& s : slots_) {
      if (s.loading.contains(model)) return true;
    }
    return false;
  }

  bool Loaded(size_t slot, const std::string& model) const {
    return slots_[slot].loaded.contains(model);
  }
  bool Loading(size_t slot, const std::string& model) const {
    return slots_[slot].loading.contains(model);
  }
  size_t pending(size_t slot) const { return slots_[slot].pending; }
  size_t loaded_count(size_t slot) const { return slots_[slot].loaded.size(); }

 private:
  struct Slot {
    bool announced = false;
    size_t pending = 0;             // loads sent and not yet answered
    std::set<std::string> loading;  // their models
    std::set<std::string> loaded;
    std::set<std::string> dropped;  // loading, but unloaded since: the answer is discarded
    std::set<std::string> resent;   // dropped, and loaded again since (its answer comes second)
  };
  struct Registration {
    std::set<size_t> remaining;  // slots still to answer
    LoadOutcome outcome;
    Done done;
  };
  // Counts one answer (or death) against `model`'s registration, completing it at zero.
  void CountDown(const std::string& model, const LoadOutcome& answer, size_t slot);

  std::vector<Slot> slots_;
  std::map<std::string, Registration> registrations_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_MODEL_LOADS_H_
