#include "controller/model_loads.h"

#include "absl/strings/str_cat.h"

namespace pswitch::controller {

void ModelLoads::Sent(size_t slot, const std::string& model) {
  Slot& s = slots_[slot];
  ++s.pending;
  // A load sent after an unload dropped an earlier one still in flight: two answers will come,
  // and only the second is this load's.
  if (s.dropped.contains(model)) s.resent.insert(model);
  s.loading.insert(model);
}

void ModelLoads::Answered(size_t slot, const std::string& model, const LoadOutcome& outcome) {
  Slot& s = slots_[slot];
  if (s.pending > 0) --s.pending;
  s.loading.erase(model);
  // The answer to a load made before an unload: the worker drops the model right after. A
  // registration of the name made since awaits the newer load's answer, not this one.
  if (s.dropped.erase(model) > 0) {
    if (s.resent.erase(model) > 0) {
      s.loading.insert(model);
      return;
    }
    CountDown(model, outcome, slot);
    return;
  }
  if (outcome.status.ok()) s.loaded.insert(model);
  CountDown(model, outcome, slot);
}

void ModelLoads::Died(size_t slot) {
  // What it had loaded stays known until a fresh process takes the slot (Reset).
  const std::set<std::string> unanswered = std::move(slots_[slot].loading);
  slots_[slot].loading.clear();
  slots_[slot].dropped.clear();
  slots_[slot].resent.clear();
  slots_[slot].pending = 0;
  for (const std::string& model : unanswered) CountDown(model, LoadOutcome{}, slot);
}

void ModelLoads::Await(const std::string& model, std::set<size_t> slots, Done done) {
  if (slots.empty()) {
    done(LoadOutcome{});
    return;
  }
  registrations_[model] = Registration{std::move(slots), LoadOutcome{}, std::move(done)};
}

void ModelLoads::CountDown(const std::string& model, const LoadOutcome& answer, size_t slot) {
  auto it = registrations_.find(model);
  if (it == registrations_.end()) return;
  Registration& r = it->second;
  if (r.remaining.erase(slot) == 0) return;  // not a slot this registration counted
  LoadOutcome named = answer;
  if (!answer.status.ok()) {
    named.status = absl::Status(
        answer.status.code(),
        absl::StrCat("worker ", slot, " could not load '", model, "': ", answer.status.message()));
  }
  r.outcome.Merge(named);
  if (!r.remaining.empty()) return;
  Done done = std::move(r.done);
  LoadOutcome result = std::move(r.outcome);
  registrations_.erase(it);
  done(result);
}

}  // namespace pswitch::controller
