// The iterative task interface (FreeRide's iterative fill tasks; pswitch's own training tasks
// use it too): a task is a class with Init, Step and Finish. The framework owns *when*: RunSteps
// starts a step only while the task is not stopped and, for a fill task, only when the step fits
// in what is left of its bubble (FillSteps); the task owns *what* a step does. A new fill-task
// kind is one more IterativeTask in the worker.
#ifndef PSWITCH_WORKER_ITERATIVE_TASK_H_
#define PSWITCH_WORKER_ITERATIVE_TASK_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/fill_steps.h"

namespace pswitch::worker {

class IterativeTask {
 public:
  virtual ~IterativeTask() = default;
  // Once per run, before its first step (binds state kept between runs, loads data).
  virtual absl::Status Init() { return absl::OkStatus(); }
  // Step `index` of the whole task (a resumed task continues from where it stopped).
  // StepCutError(): the step was cut short by a stop and left no trace; it is not done.
  virtual absl::Status Step(uint32_t index) = 0;
  // Once per run, after its last step, also when it stopped early (collects outputs).
  virtual absl::Status Finish() { return absl::OkStatus(); }
  // Whether the run should end now to hand back what it holds (a resident run's outputs at
  // their bound), though steps remain.
  virtual bool Full() const { return false; }
};

// What a step cut short by a stop returns (models::StepCutError for a training step).
absl::Status StepCutError();
bool IsStepCut(const absl::Status& status);

struct StepProgress {
  uint32_t steps_done = 0;     // steps of the whole task completed
  bool stopped_early = false;  // the run ended before the task's last step
  bool step_cut = false;       // ...because a step under way was cut short, not between steps
  // Set: steps_done is also published here as it grows, for another thread (the heartbeat's).
  std::atomic<uint32_t>* live_steps = nullptr;
};

// Runs steps [first, total) of `task`: Init, the steps the framework lets start, Finish. A step
// is skipped, and the run stops early, once `stop` is set (a plain task) or, with `fill`, once
// the fill gate says the next step does not fit its bubble. A resident fill run instead waits
// for a later bubble (a step cut at a bubble's end runs again there) and stops early only when
// stopped, or when the task is Full.
absl::Status RunSteps(IterativeTask& task, uint32_t first, uint32_t total,
                      const std::atomic<bool>& stop, FillSteps* fill, StepProgress* progress);

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_ITERATIVE_TASK_H_
