#include "worker/iterative_task.h"

#include "base/status.h"
#include "models/training.h"

namespace pswitch::worker {

absl::Status StepCutError() { return models::StepCutError(); }
bool IsStepCut(const absl::Status& status) { return models::IsStepCut(status); }

absl::Status RunSteps(IterativeTask& task, uint32_t first, uint32_t total,
                      const std::atomic<bool>& stop, FillSteps* fill, StepProgress* progress) {
  progress->steps_done = first;
  if (progress->live_steps != nullptr) progress->live_steps->store(first);
  PSWITCH_RETURN_IF_ERROR(task.Init());
  const bool resident = fill != nullptr && fill->resident();
  for (uint32_t i = first; i < total;) {
    // Full first: a full run hands its outputs back now rather than wait for a bubble.
    if (task.Full() || (fill != nullptr ? !fill->MayStart() : stop.load())) {
      progress->stopped_early = true;
      break;
    }
    absl::StatusOr<bool> ran = true;
    if (fill == nullptr) {
      absl::Status stepped = task.Step(i);
      if (!stepped.ok()) ran = stepped;
    } else {
      ran = fill->Run(i, [&] { return task.Step(i); });
    }
    if (IsStepCut(ran.status())) {
      // Cut at its bubble's end, a resident run's step runs again in a later bubble.
      if (resident && !fill->stopping()) continue;
      progress->stopped_early = true;
      progress->step_cut = true;
      break;
    }
    PSWITCH_RETURN_IF_ERROR(ran.status());
    if (!*ran) {  // waiting for the device used up the time the step needed
      if (resident) continue;
      progress->stopped_early = true;
      break;
    }
    ++i;
    progress->steps_done = i;
    if (progress->live_steps != nullptr) progress->live_steps->store(i);
  }
  return task.Finish();
}

}  // namespace pswitch::worker
