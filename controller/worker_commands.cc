#include "controller/worker_commands.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "controller/bubble_bell.h"
#include "proto/framing.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {

void BuildPrepare(flatbuffers::FlatBufferBuilder& b, const PrepareSpec& prepare) {
  auto last = b.CreateVector(prepare.group_last_layer);
  auto body = proto::CreatePrepare(b, b.CreateString(prepare.model), prepare.epoch,
                                   prepare.flag_base, last, prepare.weights_offset);
  proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::Prepare, body.Union()));
}

void BuildRun(flatbuffers::FlatBufferBuilder& b, uint64_t task_id, const TaskSpec& spec,
              uint32_t batch, const RunState& state) {
  // Placed inputs go as their slices (CreateWireTensor writes no bytes for them).
  auto inputs = proto::CreateWireTensors(b, spec.inputs);
  std::optional<proto::Slice> outputs_to;
  if (spec.outputs_to) {
    outputs_to.emplace(spec.outputs_to->region, spec.outputs_to->offset, spec.outputs_to->length);
  }
  flatbuffers::Offset<proto::FillRun> fill = 0;
  if (spec.fill) {
    const FillRunSpec& f = *spec.fill;
    const proto::FillRunKind kind =
        f.synthetic ? proto::FillRunKind::Synthetic : proto::FillRunKind::Model;
    // The dataset as its slice only: its bytes reach the worker through the region's memfd.
    auto dataset = f.dataset ? proto::CreateWireTensor(b, *f.dataset) : 0;
    std::optional<proto::Slice> bell;
    if (f.bell != nullptr) {
      const proto::ByteSlice at = f.bell->slice();
      bell.emplace(at.region, at.offset, at.length);
    }
    fill = proto::CreateFillRun(b, f.bubble_end_ns, absl::ToInt64Nanoseconds(f.margin),
                                absl::ToInt64Nanoseconds(f.step), f.memory_cap, kind,
                                absl::ToInt64Nanoseconds(f.synthetic_step), f.synthetic_alloc_bytes,
                                f.ignore_pause, b.CreateString(f.device_lock_path), dataset,
                                bell ? &*bell : nullptr, f.bell != nullptr && f.suspend_steps);
  }
  auto run = proto::CreateRun(
      b, task_id, b.CreateString(spec.model), inputs, spec.kind == TaskKind::kTraining,
      state.first_iteration, spec.iterations, batch, spec.seed,
      spec.trainer.optimizer == api::OptimizerKind::kAdam ? proto::Optimizer::Adam
                                                          : proto::Optimizer::Sgd,
      spec.trainer.learning_rate, spec.trainer.momentum, state.optimizer_offset,
      state.optimizer_bytes, fill, spec.principal.empty() ? 0 : b.CreateString(spec.principal),
      outputs_to ? &*outputs_to : nullptr,
      spec.device_lock_path.empty() || spec.fill ? 0 : b.CreateString(spec.device_lock_path));
  proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::Run, run.Union()));
}

void BuildMapRegion(flatbuffers::FlatBufferBuilder& b, const dataplane::TransferRegion& region) {
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> handle = 0;
  if (!region.cuda_ipc_handle().empty()) {
    handle = b.CreateVector(reinterpret_cast<const uint8_t*>(region.cuda_ipc_handle().data()),
                            region.cuda_ipc_handle().size());
  }
  auto map = proto::CreateMapRegion(b, region.id(), region.bytes(), region.file_offset(), handle,
                                    region.device());
  proto::Finish(b,
                proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::MapRegion, map.Union()));
}

void BuildUnmapRegion(flatbuffers::FlatBufferBuilder& b, uint64_t region_id) {
  auto unmap = proto::CreateUnmapRegion(b, region_id);
  proto::Finish(
      b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::UnmapRegion, unmap.Union()));
}

namespace {

absl::Status CheckSlice(const TaskSpec& spec, const proto::ByteSlice& slice,
                        absl::string_view what) {
  for (const auto& region : spec.regions) {
    if (region == nullptr || region->id() != slice.region) continue;
    absl::Status inside = region->CheckSlice(slice.offset, slice.length);
    if (!inside.ok()) {
      return absl::Status(inside.code(), absl::StrCat(what, ": ", inside.message()));
    }
    return absl::OkStatus();
  }
  return absl::InternalError(
      absl::StrCat(what, " names region ", slice.region, ", which the task does not hold"));
}

}  // namespace

absl::Status CheckRegionSlices(const TaskSpec& spec) {
  for (const proto::HostTensor& input : spec.inputs) {
    const std::string what = absl::StrCat("input '", input.name, "'");
    if (input.place == proto::Place::Payload) {
      return absl::InternalError(absl::StrCat(what, " is still in a frame's payload"));
    }
    if (input.place == proto::Place::Region) {
      PSWITCH_RETURN_IF_ERROR(CheckSlice(spec, input.slice, what));
    }
  }
  if (spec.outputs_to) {
    PSWITCH_RETURN_IF_ERROR(CheckSlice(spec, *spec.outputs_to, "the output space"));
  }
  if (spec.fill && spec.fill->dataset) {
    PSWITCH_RETURN_IF_ERROR(CheckSlice(spec, spec.fill->dataset->slice, "the fill dataset"));
  }
  if (spec.fill && spec.fill->bell != nullptr) {
    PSWITCH_RETURN_IF_ERROR(CheckSlice(spec, spec.fill->bell->slice(), "the fill run's bell"));
  }
  return absl::OkStatus();
}

absl::Status CheckRunOutputs(const std::vector<proto::HostTensor>& outputs,
                             const std::optional<proto::ByteSlice>& outputs_to) {
  for (const proto::HostTensor& output : outputs) {
    if (output.place == proto::Place::Inline) continue;
    const proto::ByteSlice& s = output.slice;
    const bool inside =
        output.place == proto::Place::Region && outputs_to.has_value() &&
        s.region == outputs_to->region && s.offset >= outputs_to->offset &&
        s.length <= outputs_to->length &&
        s.offset - outputs_to->offset <= outputs_to->length - s.length;  // no overflow
    if (!inside) {
      return absl::InternalError(absl::StrCat(
          "worker wrote outputs outside the task's output space: output '", output.name,
          "' at region ", s.region, " offset ", s.offset, " length ", s.length,
          outputs_to ? absl::StrCat(" (the space: region ", outputs_to->region, " offset ",
                                    outputs_to->offset, " length ", outputs_to->length, ")")
                     : std::string(" (the task named none)")));
    }
  }
  return absl::OkStatus();
}

}  // namespace pswitch::controller
