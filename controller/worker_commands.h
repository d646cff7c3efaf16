// The commands a scheduler sends its workers, built in one place (proto/worker.fbs).
#ifndef PSWITCH_CONTROLLER_WORKER_COMMANDS_H_
#define PSWITCH_CONTROLLER_WORKER_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "controller/task_spec.h"
#include "dataplane/transfer_region.h"
#include "flatbuffers/flatbuffers.h"

namespace pswitch::controller {

// What a worker is told before a task of `model`: gate each layer on its group's ready flag
// (flag_base + group) under `epoch`, the copy's that brought the weights, which are at
// `weights_offset` in the arena.
struct PrepareSpec {
  std::string model;
  uint32_t epoch = 0;
  uint32_t flag_base = 0;
  uint64_t weights_offset = 0;
  std::vector<uint32_t> group_last_layer;
};
void BuildPrepare(flatbuffers::FlatBufferBuilder& b, const PrepareSpec& prepare);

// Where a Run's training state lives, when it has any.
struct RunState {
  uint32_t first_iteration = 0;  // iterations already done (a resumed task, a fill job)
  uint64_t optimizer_offset = 0;  // arena area of its optimizer state; 0 bytes = none
  uint64_t optimizer_bytes = 0;
};

// Runs task `task_id` of `spec` at `batch` samples. Descriptors only for placed tensors: a
// Region input is its slice (no bytes), and spec.outputs_to becomes Run.outputs_to.
void BuildRun(flatbuffers::FlatBufferBuilder& b, uint64_t task_id, const TaskSpec& spec,
              uint32_t batch, const RunState& state);

// Maps `region` for later Runs (its fd travels with the frame; none for CUDA IPC).
void BuildMapRegion(flatbuffers::FlatBufferBuilder& b, const dataplane::TransferRegion& region);
// Unmaps region `region_id`: nothing holds it any more.
void BuildUnmapRegion(flatbuffers::FlatBufferBuilder& b, uint64_t region_id);

// Checks, just before a Run is sent, that every Region slice of `spec` (inputs and outputs_to)
// names one of spec.regions and lies inside it as it is now (a shared-memory file may have
// shrunk since admission): OutOfRange from TransferRegion::CheckSlice, naming the tensor;
// Internal for a slice of a region the task does not hold, or a Payload slice (a port must
// stage a payload into a region before the task is queued).
absl::Status CheckRegionSlices(const TaskSpec& spec);

// Checks a finished Run's outputs: each Region output must lie inside `outputs_to` (the same
// region, inside its slice, without overflow); inline outputs are fine; anything else is a
// broken worker: Internal ("worker wrote outputs outside ...").
absl::Status CheckRunOutputs(const std::vector<proto::HostTensor>& outputs,
                             const std::optional<proto::ByteSlice>& outputs_to);

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_WORKER_COMMANDS_H_
