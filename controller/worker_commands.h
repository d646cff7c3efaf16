// The commands a scheduler sends its workers, built in one place (proto/worker.fbs).
#ifndef PSWITCH_CONTROLLER_WORKER_COMMANDS_H_
#define PSWITCH_CONTROLLER_WORKER_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "controller/task_spec.h"
#include "flatbuffers/flatbuffers.h"

namespace pswitch::controller {

// Wires `model`'s layers to its groups' ready flags under `epoch` (the switch's).
void BuildPrepare(flatbuffers::FlatBufferBuilder& b, const std::string& model, uint32_t epoch,
                  const std::vector<uint32_t>& group_last_layer);

// Where a Run's training state lives, when it has any.
struct RunState {
  uint32_t first_iteration = 0;  // iterations already done (a resumed task, a fill job)
  uint64_t optimizer_offset = 0;  // arena area of its optimizer state; 0 bytes = none
  uint64_t optimizer_bytes = 0;
};

// Runs task `task_id` of `spec` at `batch` samples.
void BuildRun(flatbuffers::FlatBufferBuilder& b, uint64_t task_id, const TaskSpec& spec,
              uint32_t batch, const RunState& state);

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_WORKER_COMMANDS_H_
