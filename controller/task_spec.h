// What a GPU scheduler is asked to run (TaskSpec, with a fill task's bubble run) and what it
// answers (TaskOutcome, with the switch's timeline).
#ifndef PSWITCH_CONTROLLER_TASK_SPEC_H_
#define PSWITCH_CONTROLLER_TASK_SPEC_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "api/types.h"
#include "controller/inputs_arrival.h"
#include "controller/state_checkpoints.h"
#include "controller/task_queue.h"
#include "dataplane/transfer_region.h"
#include "proto/host_tensor.h"

namespace pswitch::controller {

class BubbleBell;  // controller/bubble_bell.h

// One bubble's run of a fill task (see fill/ and worker/fill_steps.h).
struct FillRunSpec {
  int64_t bubble_end_ns = 0;  // CLOCK_MONOTONIC
  absl::Duration margin = absl::Microseconds(200);
  absl::Duration step;      // the step's predicted duration so far
  uint64_t memory_cap = 0;  // bytes; 0 = the worker's activation lease
  bool synthetic = false;
  // Dataset inference: the dataset's "input" rows, a Place::Region slice of a region the
  // TaskSpec holds (controller/fill_dataset.h).
  std::optional<proto::HostTensor> dataset;
  absl::Duration synthetic_step;
  uint64_t synthetic_alloc_bytes = 0;
  bool ignore_pause = false;
  std::string device_lock_path;  // host backend: the device's compute lock
  uint32_t first_iteration = 0;  // steps already done
  CheckpointKey state_key;       // keys the optimizer-state checkpoint across bubbles
  // Set: a run that lives across bubbles, woken by this bell (its region is one of the
  // TaskSpec's); null: a run of one bubble.
  std::shared_ptr<BubbleBell> bell;
  // With a bell: a training step still under way at a bubble's end waits for the next one.
  bool suspend_steps = false;
};

// The longest latency objective an online fill request may carry (TaskSpec::online_slo).
inline constexpr absl::Duration kMaxOnlineObjective = absl::Hours(1);

struct TaskSpec {
  std::string model;
  TaskKind kind = TaskKind::kInference;
  // Inline, or (Place::Region) slices of `regions` by region id: docs/dataplane.md.
  std::vector<proto::HostTensor> inputs;
  // The transfer regions its tensors lie in, held until the task ends so none is unmapped under
  // it; each was checked at admission to be the submitter's.
  std::vector<std::shared_ptr<const dataplane::TransferRegion>> regions;
  // Where the outputs go: a slice of one of `regions` (written there by the worker); nullopt:
  // inline in the outcome.
  std::optional<proto::ByteSlice> outputs_to;
  // Set when the inputs' bytes were still arriving at submission (a raw TCP payload): the task
  // is queued and may be placed and switched in meanwhile, but its Run waits for the arrival's
  // end, and an arrival that fails fails the task. Null: the inputs are all there.
  std::shared_ptr<InputsArrival> inputs_arrival;
  uint32_t iterations = 1;  // training
  uint32_t batch = 0;       // training: samples per iteration; 0 = the model's registered batch
  uint64_t seed = 0;
  api::TrainerOptions trainer;      // training: optimizer and its hyperparameters
  std::optional<FillRunSpec> fill;  // a fill task's bubble run (SubmitFill)
  int priority = 0;
  // Who submitted it (the authenticated principal; empty: unknown). Workers clear their
  // activation lease between tasks of different (model, principal) pairs, and before every task
  // whose principal is unknown.
  std::string principal;
  absl::Time deadline = absl::InfiniteFuture();  // the client's: EDF orders by it
  // When the task fails if unfinished: the client's deadline capped by the server's maximum
  // task time (Controller::Submit). Kept apart so the cap does not reorder EDF.
  absl::Time expires = absl::InfiniteFuture();
  // Host backend, inference: the simulated device's compute lock, held while the task computes
  // (Controller sets it when ControllerOptions::inference_holds_device_lock). Empty: none.
  std::string device_lock_path;
  // An online fill request (issue 30): served in one of the main job's bubbles within this
  // latency objective, from its arrival (FillManager::SubmitOnline, controller/online_fill.h).
  std::optional<absl::Duration> online_slo;
  int64_t arrival_ns = 0;  // set by Submit/SubmitFill (CLOCK_MONOTONIC)
  int64_t started_ns = 0;  // first placed on a worker (set by the scheduler; 0: never)
};

// Where a task's time went, on one clock (CLOCK_MONOTONIC ns; 0 = did not happen). The switch is
// reported as these parts; "switch overhead" is only ever client latency minus a ready model's
// latency measured in the same run (bench-switch), never one of these parts alone.
struct SwitchTimeline {
  int64_t arrival_ns = 0;           // the request's first byte (else: the scheduler accepted it)
  int64_t inputs_ns = 0;            // its inputs' last byte arrived (a raw payload; 0: with it)
  int64_t placed_ns = 0;            // this run was placed on a worker
  int64_t stop_sent_ns = 0;         // the old tenant was told to stop (0: it was idle)
  // The old tenant's run answered its Stop (a training step under way was cut at its next
  // layer); 0: no stop, or the task was placed before it answered.
  int64_t old_stopped_ns = 0;
  int64_t drained_ns = 0;           // the copy could start: the old tenant had drained
  int64_t first_group_ready_ns = 0;
  int64_t first_layer_start_ns = 0;  // the first layer's compute started on the device
  int64_t first_layer_done_ns = 0;
  int64_t last_group_ready_ns = 0;
  int64_t result_ns = 0;  // the worker's answer reached the scheduler
  // Each group's copy (copy start, ready), for the trace; empty when nothing was copied.
  std::vector<std::pair<int64_t, int64_t>> group_copies;
  // When each later group's gate released the task's compute (groups 1, 2, ...; group 0's is
  // first_layer_start_ns), for the trace.
  std::vector<int64_t> group_gates_ns;
};

struct TaskOutcome {
  uint64_t task_id = 0;
  // Inline, or (the spec had outputs_to) Place::Region slices inside it.
  std::vector<proto::HostTensor> outputs;
  uint32_t iterations_done = 0;
  double loss = 0;
  absl::Duration latency;      // submission to completion
  // The copy of the task's model (first group's copy start to last group ready), zero when it
  // was resident. Not the switch's cost: see SwitchTimeline.
  absl::Duration switch_time;
  SwitchTimeline timeline;
  // Fill runs: whether it paused before finishing, when it paused, and its steps.
  bool stopped_early = false;
  absl::Time paused_at;
  absl::Duration fill_step_time;
  uint32_t fill_steps = 0;
  absl::Duration fill_predicted_step;
  // A fill step was cut at its bubble's end, having overrun its prediction:
  // fill_predicted_step then counts the time it ran (a lower bound of the step's).
  bool fill_step_overran = false;
};
using TaskCallback = std::function<void(const absl::StatusOr<TaskOutcome>&)>;

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_TASK_SPEC_H_
