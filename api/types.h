// The task and fill types that clients and pswitchd both speak, defined once. The client
// library exposes them (client::TaskStatus is api::TaskStatus), the controller fills them in, and
// api/client_codec.h is the one place they meet the wire.
#ifndef PSWITCH_API_TYPES_H_
#define PSWITCH_API_TYPES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pswitch::api {

enum class TaskState { kQueued, kSwitching, kRunning, kSucceeded, kFailed, kCancelled };
// "queued", "switching", ...
absl::string_view TaskStateName(TaskState state);

struct TaskStatus {
  uint64_t task_id = 0;
  std::string model;
  TaskState state = TaskState::kQueued;
  uint32_t iterations_done = 0;
  uint32_t preemptions = 0;  // training: times stopped for another task and resumed
  int worker_pid = 0;        // the worker process running it (0 when not running)
  absl::Status error;        // for kFailed and kCancelled
  // The worker's cleaning after the task's last run, and whether it ran after the drain (so it
  // overlapped the next switch); zero until that worker has drained.
  absl::Duration clean_time;
  bool cleaned_after_drain = false;
};

// A training task's optimizer and its hyperparameters (models::Trainer runs it).
enum class OptimizerKind { kSgd, kAdam };
struct TrainerOptions {
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double learning_rate = 0.01;
  double momentum = 0.9;  // SGD only
};

// Optimizer state slots per parameter: SGD with momentum keeps one buffer, Adam two (first and
// second moments), plain SGD none.
inline int OptimizerStateSlots(const TrainerOptions& options) {
  if (options.optimizer == OptimizerKind::kAdam) return 2;
  return options.momentum != 0 ? 1 : 0;
}

// Fill jobs: work that runs only inside the main job's pipeline bubbles.
enum class FillKind { kInference, kTraining, kSynthetic };

// FreeRide's side-task states.
enum class FillState { kSubmitted, kCreated, kPaused, kRunning, kStopped };
// "SUBMITTED", "CREATED", ... (the paper's names).
absl::string_view FillStateName(FillState state);

struct FillJobStatus {
  uint64_t job_id = 0;
  FillState state = FillState::kSubmitted;
  uint32_t gpu = 0;
  uint64_t steps_done = 0;
  uint64_t steps_total = 0;
  uint32_t bubbles = 0;                // bubbles it ran in
  absl::Duration predicted_remaining;  // by the partition plan; zero once stopped
  bool meets_deadline = true;
  absl::Status error;  // a stopped job that failed or was killed
};

struct FillStats {
  uint64_t bubbles = 0;
  absl::Duration bubble_time;     // reported by the main job
  absl::Duration fill_step_time;  // fill steps inside bubbles
  uint64_t steps = 0;
  absl::Duration pause_p50, pause_p99;  // bubble end -> fill task paused
  uint64_t killed = 0;                  // fill tasks SIGKILLed for not pausing or stopping
  uint64_t runs = 0;                    // fill runs started (a Run message each)
  uint64_t bell_wakes = 0;  // bubbles opened for a resident run by its bell (no message)
};

}  // namespace pswitch::api

#endif  // PSWITCH_API_TYPES_H_
