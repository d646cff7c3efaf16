#include "controller/worker_commands.h"

#include "proto/framing.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {

void BuildPrepare(flatbuffers::FlatBufferBuilder& b, const std::string& model, uint32_t epoch,
                  const std::vector<uint32_t>& group_last_layer) {
  auto last = b.CreateVector(group_last_layer);
  auto body = proto::CreatePrepare(b, b.CreateString(model), epoch, /*flag_base=*/0, last);
  proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::Prepare, body.Union()));
}

void BuildRun(flatbuffers::FlatBufferBuilder& b, uint64_t task_id, const TaskSpec& spec,
              uint32_t batch, const RunState& state) {
  auto inputs = proto::CreateWireTensors(b, spec.inputs);
  flatbuffers::Offset<proto::FillRun> fill = 0;
  if (spec.fill) {
    const FillRunSpec& f = *spec.fill;
    const proto::FillRunKind kind =
        f.synthetic ? proto::FillRunKind::Synthetic : proto::FillRunKind::Model;
    fill = proto::CreateFillRun(b, f.bubble_end_ns, absl::ToInt64Nanoseconds(f.margin),
                                absl::ToInt64Nanoseconds(f.step), f.memory_cap, kind,
                                b.CreateString(f.dataset_path),
                                absl::ToInt64Nanoseconds(f.synthetic_step), f.synthetic_alloc_bytes,
                                f.ignore_pause, b.CreateString(f.device_lock_path));
  }
  auto run = proto::CreateRun(
      b, task_id, b.CreateString(spec.model), inputs, spec.kind == TaskKind::kTraining,
      state.first_iteration, spec.iterations, batch, spec.seed,
      spec.trainer.optimizer == models::OptimizerKind::kAdam ? proto::Optimizer::Adam
                                                             : proto::Optimizer::Sgd,
      spec.trainer.learning_rate, spec.trainer.momentum, state.optimizer_offset,
      state.optimizer_bytes, fill, spec.principal.empty() ? 0 : b.CreateString(spec.principal));
  proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::Run, run.Union()));
}

}  // namespace pswitch::controller
