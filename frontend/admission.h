// The one way a task gets from any port (TCP, HTTP) into the scheduler. Every port parses its
// own request into a controller::TaskSpec and hands it here with who sent it; admission then
// decides, in one place, what each port once decided for itself:
//   - the model: one the principal may see (another user's copy is NotFound, as a model that
//     does not exist), and for training one it may change (admins, the model's trainers, a copy's
//     owner), else PermissionDenied telling it to train a copy of its own;
//   - the inputs: names, dtypes and ranks against the model's recorded input;
//   - where the tensors lie (docs/dataplane.md): every Place::Region slice in one of the
//     principal's own transfer regions, inside it, as long as its dtype and shape need; the
//     output space (TaskSpec::outputs_to) in one of them too, overlapping no input and large
//     enough for the model's recorded output at this batch; the regions held by the task;
//   - the deadline: at most kMaxTaskDeadline from now;
//   - the client's quota (ClientQuota), held until the task's answer;
//   - the task's owner (TaskOwners), so only it (and admins) see and cancel the task, and its
//     principal (TaskSpec::principal), so workers clear their lease between owners.
// Only then is the task queued; on any refusal nothing is queued and nothing is counted.
//
// Training a copy (SubmitOnCopy) first registers the copy, owned by the principal, with the
// original's weights as they are then (Controller::RegisterCopy), and trains that: nobody else's
// answers change.
#ifndef PSWITCH_FRONTEND_ADMISSION_H_
#define PSWITCH_FRONTEND_ADMISSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "controller/task_spec.h"
#include "dataplane/region_table.h"
#include "frontend/auth.h"
#include "frontend/client_quota.h"
#include "registry/model_catalog.h"

namespace pswitch::controller {
class Controller;
class FillManager;
}

namespace pswitch::frontend {

// A client's deadline is capped at this (the scheduler caps tasks further: --max-task-time).
inline constexpr absl::Duration kMaxTaskDeadline = absl::Hours(24);

// Whether `who` may see, list and serve `model`: a copy only its owner and admins.
bool MaySee(const Principal& who, const registry::CatalogEntry& model);
// The same for a model whose registry::ModelRequest::owner is `owner` (empty: everyone's).
bool MaySeeOwnedBy(const Principal& who, absl::string_view owner);
// Whether `who` may train `model` in place or unload it: admins, the principals the model's
// configuration names (trainers), and a copy's owner.
bool MayChange(const Principal& who, const registry::CatalogEntry& model);
// A copy name a client chose: text within kMaxNameBytes, not empty, not the fill jobs' prefix.
absl::Status CheckCopyName(const std::string& name);
// `inputs` against `model`'s recorded input: known names ("input", and optionally
// "attention_mask" and "token_type_ids"), each at most once, "input" present with the model's
// dtype (int32 accepted for int64) and rank, the others of the input's shape. InvalidArgument
// naming the model and the tensor.
absl::Status CheckInputs(const registry::CatalogEntry& model,
                         const std::vector<proto::HostTensor>& inputs);
// The bytes `model`'s output needs for a task whose inputs are `inputs` (the recorded output
// shape with its batch dimension, -1, set from the input's). InvalidArgument when it cannot be
// told.
absl::StatusOr<uint64_t> OutputBytesNeeded(const registry::CatalogEntry& model,
                                           const std::vector<proto::HostTensor>& inputs);
// Resolves where `spec`'s tensors lie for `who`: each Place::Region input and `outputs_to` in
// one of `who`'s regions of `table` (another's and a missing one: the same NotFound), inside it
// (OutOfRange), the input as long as its dtype and shape need (InvalidArgument), the output
// overlapping no input (InvalidArgument) and at least OutputBytesNeeded (ResourceExhausted naming
// both sizes). Fills `spec.regions` with each region once. Place::Payload is refused
// (InvalidArgument: a port that takes raw payloads places them first, PlacePayload); `table`
// null refuses any region (FailedPrecondition).
// A request's raw payload (TCP, docs/dataplane.md) received into `staging`, at offset 0: each
// Place::Payload input of `inputs` becomes a Place::Region slice of it. Each slice must lie
// inside the payload's `payload_bytes` (OutOfRange, never overflowing) and be exactly as long
// as its dtype and shape need (InvalidArgument); slices may overlap one another (they are only
// read). Other inputs are left alone. `staging` must hold at least `payload_bytes`.
absl::Status PlacePayload(std::vector<proto::HostTensor>& inputs, uint64_t payload_bytes,
                          const dataplane::TransferRegion& staging);
absl::Status ResolvePlacement(const dataplane::RegionTable* table, const Principal& who,
                              const registry::CatalogEntry& model, controller::TaskSpec& spec);

// Where admitted tasks go: pswitchd's Controller (ControllerTaskSink), a fake in tests.
class TaskSink {
 public:
  virtual ~TaskSink() = default;
  virtual absl::StatusOr<registry::EntryRef> Find(absl::string_view model) const = 0;
  virtual std::vector<registry::EntryRef> List() const = 0;
  // Queues the task (Controller::Submit's checks and limits apply); `done` runs once if queued.
  virtual absl::StatusOr<uint64_t> Queue(controller::TaskSpec spec,
                                         controller::TaskCallback done) = 0;
  // Controller::RegisterCopy: `done` runs once, on another thread.
  virtual void RegisterCopy(
      std::string original, std::string name, std::string owner,
      std::function<void(const absl::StatusOr<registry::EntryRef>&)> done) = 0;
};

// `*controller` (and `*fill`, which may be null) must outlive the sink. Tasks with a latency
// objective (TaskSpec::online_slo) go to `fill`'s online queues (FillManager::SubmitOnline);
// without a fill manager they are refused.
std::unique_ptr<TaskSink> ControllerTaskSink(controller::Controller* controller,
                                             controller::FillManager* fill);

// Thread-safe: ports call it from their own threads; answers arrive on scheduler threads.
// `*sink`, `*quota` and `*owners` must outlive it.
class TaskAdmission {
 public:
  // A principal may own at most `max_copies` copies at once (each holds a model's weights in
  // pinned memory); admins are not capped.
  // `regions`: the transfer regions every port shares (null: tensors must be inline); it must
  // outlive the admission.
  TaskAdmission(TaskSink* sink, ClientQuota* quota, TaskOwners* owners, size_t max_copies = 8,
                const dataplane::RegionTable* regions = nullptr)
      : sink_(sink), quota_(quota), owners_(owners), max_copies_(max_copies), regions_(regions) {}
  TaskAdmission(const TaskAdmission&) = delete;
  TaskAdmission& operator=(const TaskAdmission&) = delete;

  using Done = std::function<void(const absl::StatusOr<controller::TaskOutcome>&)>;
  // Admits and queues `spec` for `who`, counted against `client` (its quota's key: a token's
  // name, or a port's name for one unauthenticated connection). The task id, or the refusal
  // (NotFound, PermissionDenied, InvalidArgument, ResourceExhausted, ...): then nothing is queued
  // and `done` never runs. Otherwise `done` runs exactly once, on a scheduler thread, after the
  // quota is released.
  absl::StatusOr<uint64_t> Submit(const Principal& who, const std::string& client,
                                  controller::TaskSpec spec, Done done);

  using Accepted = std::function<void(const absl::StatusOr<uint64_t>&)>;
  // A training task on a new copy of `spec.model` named `copy_name`, registered for `who`.
  // `accepted` runs exactly once: with the task id once the copy is registered and the task
  // queued, or with the refusal (then `done` never runs; a copy registered before its task was
  // refused stays, its owner's to unload). ResourceExhausted when `who` already owns
  // `max_copies` copies. Refusals found before anything is registered run
  // `accepted` before this returns; the rest run it on another thread. `done` as Submit's, never
  // before `accepted`.
  void SubmitOnCopy(const Principal& who, const std::string& client, controller::TaskSpec spec,
                    std::string copy_name, Accepted accepted, Done done);

  // The model `who` names, if it may see it; NotFound otherwise, as for an unknown model.
  absl::StatusOr<registry::EntryRef> FindModel(const Principal& who, absl::string_view model) const;
  // The models `who` may see, in name order.
  std::vector<registry::EntryRef> ListModels(const Principal& who) const;
  // Whether `who` may unload `model`: NotFound if it may not see it, PermissionDenied if it may
  // not change it.
  absl::Status CheckUnload(const Principal& who, absl::string_view model) const;

 private:
  // Everything but the quota and the queue: the model's access, the inputs, the deadline.
  absl::Status Check(const Principal& who, const registry::CatalogEntry& model,
                     controller::TaskSpec& spec) const;
  // What every admitted task carries: the deadline clamp and its principal.
  static void Stamp(const Principal& who, controller::TaskSpec& spec);

  TaskSink* const sink_;
  ClientQuota* const quota_;
  TaskOwners* const owners_;
  const size_t max_copies_;
  const dataplane::RegionTable* const regions_;
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_ADMISSION_H_
