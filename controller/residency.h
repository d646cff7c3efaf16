// Which model the GPU's weights region holds, and which worker slot is its active tenant. The
// region counts as holding a model only while nothing went wrong on the switch that brought it:
// a transmission that did not complete, a task that failed on that switch, or the active
// tenant's death (a half-finished training step may have touched the weights) make the next
// task for the model transmit again (defect 4 of the GPU switch issue). Not thread-safe (the
// scheduler loop owns it).
#ifndef PSWITCH_CONTROLLER_RESIDENCY_H_
#define PSWITCH_CONTROLLER_RESIDENCY_H_

#include <cstdint>
#include <string>
#include <utility>

namespace pswitch::controller {

class Residency {
 public:
  // `model`'s transmission under `epoch` started into the region; `slot` is its tenant.
  void Switched(int slot, std::string model, uint32_t epoch) {
    active_slot_ = slot;
    model_ = std::move(model);
    epoch_ = epoch;
  }
  // The switch under `epoch` did not complete (its transmission, or a task on it, failed). An
  // older switch's failure says nothing about a newer one.
  void Failed(uint32_t epoch) {
    if (epoch_ == epoch) model_.clear();
  }
  void SlotDied(int slot) {
    if (active_slot_ != slot) return;
    active_slot_ = -1;
    model_.clear();
  }

  // `model` was unloaded: whatever the region holds is no registered model's any more.
  void Dropped(const std::string& model) {
    if (model_ == model) model_.clear();
  }

  bool Holds(const std::string& model) const {
    return active_slot_ >= 0 && !model_.empty() && model_ == model;
  }
  int active_slot() const { return active_slot_; }  // -1: none
  // The model whose weights the region holds (trusted); empty when none.
  std::string model() const { return active_slot_ >= 0 ? model_ : std::string(); }
  uint32_t epoch() const { return epoch_; }          // of the latest switch

 private:
  int active_slot_ = -1;
  std::string model_;
  uint32_t epoch_ = 0;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_RESIDENCY_H_
