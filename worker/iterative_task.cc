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
  for (uint32_t i = first; i < total; ++i) {
    if (fill != nullptr ? !fill->MayStart() : stop.load()) {
      progress->stopped_early = true;
      break;
    }
    absl::StatusOr<bool> ran = true;
    if (fill == nullptr) {
      absl::Status stepped = task.Step(i);
      if (!stepped.ok()) ran = stepped;
    } else {
      ran = fill->Run([&] { return task.Step(i); });
    }
    if (IsStepCut(ran.status())) {
      progress->stopped_early = true;
      progress->step_cut = true;
      break;
    }
    PSWITCH_RETURN_IF_ERROR(ran.status());
    if (!*ran) {  // waiting for the device used up the time the step needed
      progress->stopped_early = true;
      break;
    }
    progress->steps_done = i + 1;
    if (progress->live_steps != nullptr) progress->live_steps->store(i + 1);
  }
  return task.Finish();
}

}  // namespace pswitch::worker
