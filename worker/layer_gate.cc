#include "worker/layer_gate.h"

#include <algorithm>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/status.h"
#include "models/training.h"
#include "models/zoo_model.h"

namespace pswitch::worker {
namespace {

// Thrown by the gate hook through libtorch's forward; caught at the task boundary (Task::Run).
class GateFailure : public std::runtime_error {
 public:
  explicit GateFailure(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

}  // namespace

LayerGate::Spec LayerGate::FromLastLayers(std::string model, uint32_t epoch, uint32_t flag_base,
                                          const std::vector<uint32_t>& group_last_layer,
                                          size_t layers) {
  Spec spec{std::move(model), epoch, flag_base, {}};
  spec.group_of_layer.resize(layers);
  uint32_t g = 0;
  for (size_t l = 0; l < layers; ++l) {
    while (g + 1 < group_last_layer.size() && group_last_layer[g] < l) ++g;
    spec.group_of_layer[l] = g;
  }
  return spec;
}

uint32_t LayerGate::groups() const {
  uint32_t groups = 0;
  for (uint32_t g : spec_.group_of_layer) groups = std::max(groups, g + 1);
  return groups;
}

absl::Status LayerGate::AwaitAll(int64_t deadline_ns) const {
  const uint32_t all = groups();
  for (uint32_t g = 0; g < all; ++g) {
    absl::Duration left = absl::Nanoseconds(deadline_ns - base::MonotonicNowNs());
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("bubble ended");
    PSWITCH_RETURN_IF_ERROR(ready_flags_->WaitReady(spec_.flag_base + g, spec_.epoch, left));
  }
  return absl::OkStatus();
}

LayerGate::Task::Task(const LayerGate& gate, BoundModel& bound, bool training, gpu::Stream& stream,
                      const std::string& model, uint64_t task_id, const std::atomic<bool>* cut,
                      const std::atomic<int64_t>* cut_at_ns, const std::function<bool()>* suspend)
    : gate_(gate),
      bound_(bound),
      training_(training),
      stream_(stream),
      cut_(cut),
      cut_at_ns_(cut_at_ns),
      suspend_(suspend),
      what_(absl::StrCat("model '", model, "'")) {
  (void)stream_.TakeMarks();  // nothing left from an earlier task
  // Nsight Systems: the task, and within it each group from its gate to the next one (on CUDA
  // the CPU's issue of that group's layers; the wait itself shows on the stream).
  task_range_.Restart(absl::StrCat(training ? "train " : "infer ", model, " task ", task_id));
  bound_.model().SetGateHook([this](int index) { OnLayer(index); });
}

LayerGate::Task::~Task() { bound_.model().SetGateHook(nullptr); }

void LayerGate::Task::OnLayer(int index) {
  // Marks on the stream time the first layer: started once its group was ready (mark 0),
  // finished when the second layer is issued (mark 1).
  if (++hooks_ == 2) (void)stream_.Mark();
  if (index < 0 || static_cast<size_t>(index) >= bound_.mode_layers(training_)) {
    throw GateFailure(absl::FailedPreconditionError(
        absl::StrCat(what_, " ran more layers than it has (", bound_.mode_layers(training_), ")")));
  }
  // Between two layers: the step under way stops here, its earlier layers' work undone. A fill
  // step still running at its bubble's end stops here too, without waiting for the pause to come
  // as a message, or (suspend_) waits here for its next bubble.
  models::StepCutPoint(cut_, cut_at_ns_, suspend_);
  const Spec& spec = gate_.spec_;
  const int group = static_cast<int>(spec.group_of_layer[bound_.LayoutIndex(training_, index)]);
  if (group <= waited_group_) return;  // groups arrive in order: one wait per group
  absl::Status s = stream_.WaitFlag(*gate_.ready_flags_, spec.flag_base + group, spec.epoch,
                                    gate_.group_timeout_);
  if (!s.ok()) throw GateFailure(s);
  if (waited_group_ < 0) {
    (void)stream_.Mark();
  } else if (gated_marks_ + 2 < gpu::kMaxStreamMarks) {
    (void)stream_.Mark();  // group `group`'s gate released (the trace's per-group compute)
    ++gated_marks_;
  }
  waited_group_ = group;
  if constexpr (base::kNvtxBuilt) group_range_.Restart(absl::StrCat("group ", group));
}

bool LayerGate::Task::PassAllIfIn() {
  const Spec& spec = gate_.spec_;
  const int all = static_cast<int>(gate_.groups());
  if (waited_group_ + 1 >= all) return true;
  for (int g = waited_group_ + 1; g < all; ++g) {
    absl::StatusOr<uint32_t> flag = gate_.ready_flags_->Load(spec.flag_base + g);
    if (!flag.ok() || *flag != spec.epoch) return false;
  }
  // Already released: on a GPU these device-side waits order the step's reads after the copy
  // (the CPU having seen a flag orders nothing on the device); on the host they return at once.
  for (int g = waited_group_ + 1; g < all; ++g) {
    if (!stream_.WaitFlag(*gate_.ready_flags_, spec.flag_base + g, spec.epoch, gate_.group_timeout_)
             .ok()) {
      return false;  // the layer's own gate reports it
    }
    if (waited_group_ < 0) (void)stream_.Mark();  // the first layer starts here
    waited_group_ = g;
  }
  return true;
}

absl::Status LayerGate::Task::Run(const std::function<absl::Status()>& body) {
  absl::Status body_status;
  absl::Status gate_status;
  absl::Status torch_status = models::CatchTorch(what_, [&] {
    try {
      body_status = body();
    } catch (const GateFailure& failure) {
      gate_status = failure.status();
    } catch (const models::StepCut&) {
      body_status = models::StepCutError();  // thrown where no training step catches it
    }
  });
  // A gate failure explains everything after it; then libtorch's own errors; then the task's.
  if (!gate_status.ok()) return gate_status;
  if (!torch_status.ok()) return torch_status;
  return body_status;
}

LayerGate::Task::Marks LayerGate::Task::TakeMarks() {
  Marks out;
  if (absl::StatusOr<std::vector<int64_t>> marks = stream_.TakeMarks(); marks.ok()) {
    if (!marks->empty()) out.first_layer_start_ns = (*marks)[0];
    if (marks->size() > 1) out.first_layer_done_ns = (*marks)[1];
    if (marks->size() > 2) out.group_gates_ns.assign(marks->begin() + 2, marks->end());
  }
  return out;
}

absl::Status LayerGate::Task::CheckEpoch() const {
  // The device released its waits at >= the epoch: insist that every group the task went
  // through really holds this copy's epoch, or it ran (partly) on an earlier model's weights. A
  // task stopped early (preempted mid-switch) never reached the later groups, whose copy a newer
  // switch may have cancelled: those are not its concern.
  return gpu::CheckGroupsHoldEpoch(*gate_.ready_flags_, gate_.spec_.flag_base,
                                   static_cast<uint32_t>(waited_group_ + 1), gate_.spec_.epoch);
}

}  // namespace pswitch::worker
