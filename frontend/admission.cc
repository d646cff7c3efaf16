#include "frontend/admission.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/text.h"
#include "controller/controller.h"
#include "controller/fill_manager.h"
#include "controller/fill_request.h"
#include "frontend/requests.h"

namespace pswitch::frontend {
namespace {

using controller::TaskOutcome;
using controller::TaskSpec;
using registry::CatalogEntry;
using registry::EntryRef;

// The answer for a model `who` may not see: the catalog's own for an unknown one.
absl::Status NoModel(absl::string_view model) {
  return absl::NotFoundError(absl::StrCat("model '", model, "' is not registered"));
}

bool DTypeFits(proto::DType want, proto::DType got) {
  // The worker widens int32 token ids to a model's int64 (models/script_model.cc).
  return got == want || (want == proto::DType::I64 && got == proto::DType::I32);
}

class ControllerSink : public TaskSink {
 public:
  ControllerSink(controller::Controller* controller, controller::FillManager* fill)
      : controller_(controller), fill_(fill) {}
  absl::StatusOr<EntryRef> Find(absl::string_view model) const override {
    return controller_->catalog().Find(model);
  }
  std::vector<EntryRef> List() const override { return controller_->List(); }
  absl::StatusOr<uint64_t> Queue(TaskSpec spec, controller::TaskCallback done) override {
    if (spec.online_slo) {
      if (fill_ == nullptr) {
        return absl::FailedPreconditionError(
            "this port serves no online fill requests (a latency objective)");
      }
      return fill_->SubmitOnline(std::move(spec), std::move(done));
    }
    return controller_->Submit(std::move(spec), std::move(done));
  }
  void RegisterCopy(std::string original, std::string name, std::string owner,
                    std::function<void(const absl::StatusOr<EntryRef>&)> done) override {
    controller_->RegisterCopy(
        std::move(original), std::move(name), std::move(owner),
        [done = std::move(done)](
            const absl::StatusOr<controller::Controller::Registered>& registered) {
          done(registered.ok() ? absl::StatusOr<EntryRef>(registered->entry)
                               : absl::StatusOr<EntryRef>(registered.status()));
        });
  }

 private:
  controller::Controller* const controller_;
  controller::FillManager* const fill_;
};

}  // namespace

bool MaySeeOwnedBy(const Principal& who, absl::string_view owner) {
  return who.role == Role::kAdmin || owner.empty() || owner == who.name;
}

bool MaySee(const Principal& who, const CatalogEntry& model) {
  return MaySeeOwnedBy(who, model.request.owner);
}

bool MayChange(const Principal& who, const CatalogEntry& model) {
  if (who.role == Role::kAdmin) return true;
  if (!model.request.owner.empty()) return model.request.owner == who.name;
  const std::vector<std::string>& trainers = model.request.trainers;
  return std::find(trainers.begin(), trainers.end(), who.name) != trainers.end();
}

absl::Status CheckCopyName(const std::string& name) {
  PSWITCH_RETURN_IF_ERROR(base::CheckText(name, "copy name", kMaxNameBytes));
  if (name.empty()) return absl::InvalidArgumentError("the copy name must not be empty");
  if (absl::StartsWith(name, controller::kFillModelPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat("model names starting with '",
                                                   controller::kFillModelPrefix,
                                                   "' are reserved for fill jobs' own models"));
  }
  return absl::OkStatus();
}

absl::Status CheckInputs(const CatalogEntry& model, const std::vector<proto::HostTensor>& inputs) {
  static constexpr const char* kNames[] = {"input", "attention_mask", "token_type_ids"};
  const std::string& name = model.request.name;
  const registry::TensorSpec& want = model.input;
  const proto::HostTensor* input = nullptr;
  std::set<std::string> seen;
  for (const proto::HostTensor& t : inputs) {
    if (std::find(std::begin(kNames), std::end(kNames), t.name) == std::end(kNames)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", name, "' has no input '", t.name,
                       "' (it takes 'input', optionally 'attention_mask' and 'token_type_ids')"));
    }
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", name, "': input '", t.name, "' is given twice"));
    }
    if (t.name == want.name) input = &t;
  }
  if (input == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("inference on '", name, "' needs an '", want.name, "' tensor"));
  }
  if (!DTypeFits(want.dtype, input->dtype) || input->shape.size() != want.shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", name, "' takes a ", want.shape.size(), "-d ",
                     proto::EnumNameDType(want.dtype), " '", want.name, "'; got a ",
                     input->shape.size(), "-d ", proto::EnumNameDType(input->dtype), " tensor"));
  }
  for (const proto::HostTensor& t : inputs) {
    if (&t == input) continue;
    if (t.shape != input->shape) {
      return absl::InvalidArgumentError(absl::StrCat("model '", name, "': '", t.name,
                                                     "' must have the shape of '", want.name, "'"));
    }
    if (t.dtype != proto::DType::I64 && t.dtype != proto::DType::I32) {
      return absl::InvalidArgumentError(absl::StrCat("model '", name, "': '", t.name,
                                                     "' must be int64 or int32, got ",
                                                     proto::EnumNameDType(t.dtype)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> OutputBytesNeeded(const CatalogEntry& model,
                                           const std::vector<proto::HostTensor>& inputs) {
  const std::string& name = model.request.name;
  const registry::TensorSpec& in = model.input;
  const proto::HostTensor* input = nullptr;
  for (const proto::HostTensor& t : inputs) {
    if (t.name == in.name) input = &t;
  }
  int64_t batch = 1;
  for (size_t d = 0; d < in.shape.size(); ++d) {
    if (in.shape[d] != -1) continue;
    if (input == nullptr || d >= input->shape.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", name, "': the batch cannot be told from the inputs"));
    }
    batch = input->shape[d];
    break;
  }
  std::vector<int64_t> shape = model.output.shape;
  for (int64_t& dim : shape) {
    if (dim == -1) dim = batch;
  }
  absl::StatusOr<uint64_t> bytes = proto::ShapeBytes(model.output.dtype, shape);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", name,
                     "': its recorded output does not give a size: ", bytes.status().message()));
  }
  return *bytes;
}

absl::Status PlacePayload(std::vector<proto::HostTensor>& inputs, uint64_t payload_bytes,
                          const dataplane::TransferRegion& staging) {
  if (staging.bytes() < payload_bytes) {
    return absl::InternalError(absl::StrCat("a staging region of ", staging.bytes(),
                                            " bytes for a payload of ", payload_bytes));
  }
  for (proto::HostTensor& t : inputs) {
    if (t.place != proto::Place::Payload) continue;
    const std::string what = absl::StrCat("input '", t.name, "'");
    // Subtraction, not addition: a hostile offset near 2^64 must not wrap into range.
    if (t.slice.offset > payload_bytes || t.slice.length > payload_bytes - t.slice.offset) {
      return absl::OutOfRangeError(absl::StrCat(what, ": bytes [", t.slice.offset, ", +",
                                                t.slice.length, ") lie outside the raw payload's ",
                                                payload_bytes, " bytes"));
    }
    PSWITCH_ASSIGN_OR_RETURN(uint64_t bytes, proto::ShapeBytes(t.dtype, t.shape));
    if (bytes != t.slice.length) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": its dtype and shape need ", bytes,
                                                     " bytes; the payload slice holds ",
                                                     t.slice.length));
    }
    t.place = proto::Place::Region;
    t.slice.region = staging.id();
  }
  return absl::OkStatus();
}

absl::Status ResolvePlacement(const dataplane::RegionTable* table, const Principal& who,
                              const CatalogEntry& model, TaskSpec& spec) {
  const std::string& name = model.request.name;
  // Regions a port found already (by a Triton name) are kept only if they are the caller's.
  for (const auto& region : spec.regions) {
    if (region == nullptr || region->owner() != who.name) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", name, "': the task holds a region that is not the caller's"));
    }
  }
  auto hold = [&spec](std::shared_ptr<const dataplane::TransferRegion> region) {
    const bool held = std::any_of(spec.regions.begin(), spec.regions.end(),
                                  [&](const auto& r) { return r->id() == region->id(); });
    if (!held) spec.regions.push_back(std::move(region));
  };
  // The caller's region `slice` names, with the slice inside it.
  auto resolve = [&](const proto::ByteSlice& slice, const std::string& what) -> absl::Status {
    // A staging region a port filled from this request's own body (HTTP) is pswitchd's, held by
    // the task already (and the caller's, checked above): it is in no table.
    for (const auto& held : spec.regions) {
      if (held->id() == slice.region && held->kind() == dataplane::RegionKind::kStaging) {
        if (absl::Status inside = held->CheckSlice(slice.offset, slice.length); !inside.ok()) {
          return absl::Status(inside.code(), absl::StrCat(what, ": ", inside.message()));
        }
        return absl::OkStatus();
      }
    }
    if (table == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": this port serves no transfer regions: send the bytes inline"));
    }
    absl::StatusOr<std::shared_ptr<const dataplane::TransferRegion>> region =
        table->Find(who.name, slice.region);
    if (!region.ok()) {
      // Another principal's region and a missing one: the same answer.
      return absl::NotFoundError(
          absl::StrCat(what, ": no transfer region ", slice.region, " of yours"));
    }
    if (absl::Status inside = (*region)->CheckSlice(slice.offset, slice.length); !inside.ok()) {
      return absl::Status(inside.code(), absl::StrCat(what, ": ", inside.message()));
    }
    hold(*std::move(region));
    return absl::OkStatus();
  };
  for (const proto::HostTensor& t : spec.inputs) {
    const std::string what = absl::StrCat("model '", name, "': input '", t.name, "'");
    if (t.place == proto::Place::Inline) continue;
    if (t.place == proto::Place::Payload) {
      // Only a port that received the payload can say where it lies (PlacePayload did).
      return absl::InvalidArgumentError(absl::StrCat(
          what, " lies in a raw payload, which only a TCP request's own payload may carry "
                "(ClientRequest.payload_bytes)"));
    }
    if (t.place != proto::Place::Region) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": unknown place"));
    }
    PSWITCH_ASSIGN_OR_RETURN(uint64_t bytes, proto::ShapeBytes(t.dtype, t.shape));
    if (bytes != t.slice.length) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": its dtype and shape need ", bytes,
                                                     " bytes; the slice holds ", t.slice.length));
    }
    PSWITCH_RETURN_IF_ERROR(resolve(t.slice, what));
  }
  if (!spec.outputs_to) return absl::OkStatus();
  const proto::ByteSlice& out = *spec.outputs_to;
  const std::string what = absl::StrCat("model '", name, "': the output space");
  PSWITCH_RETURN_IF_ERROR(resolve(out, what));
  for (const proto::HostTensor& t : spec.inputs) {
    if (t.place != proto::Place::Region || t.slice.region != out.region) continue;
    // Both lie inside one region (checked above): no sum overflows.
    const bool apart =
        out.offset + out.length <= t.slice.offset || t.slice.offset + t.slice.length <= out.offset;
    if (!apart) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " overlaps input '", t.name,
                       "': the worker would overwrite an input it may still read"));
    }
  }
  PSWITCH_ASSIGN_OR_RETURN(uint64_t needed, OutputBytesNeeded(model, spec.inputs));
  if (out.length < needed) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " holds ", out.length, " bytes; the output needs ", needed));
  }
  return absl::OkStatus();
}

std::unique_ptr<TaskSink> ControllerTaskSink(controller::Controller* controller,
                                             controller::FillManager* fill) {
  return std::make_unique<ControllerSink>(controller, fill);
}

absl::StatusOr<EntryRef> TaskAdmission::FindModel(const Principal& who,
                                                  absl::string_view model) const {
  absl::StatusOr<EntryRef> entry = sink_->Find(model);
  if (!entry.ok()) return entry.status();
  if (!MaySee(who, **entry)) return NoModel(model);
  return entry;
}

std::vector<EntryRef> TaskAdmission::ListModels(const Principal& who) const {
  std::vector<EntryRef> models = sink_->List();
  std::erase_if(models, [&who](const EntryRef& e) { return !MaySee(who, *e); });
  std::sort(models.begin(), models.end(),
            [](const EntryRef& a, const EntryRef& b) { return a->request.name < b->request.name; });
  return models;
}

absl::Status TaskAdmission::CheckUnload(const Principal& who, absl::string_view model) const {
  PSWITCH_ASSIGN_OR_RETURN(EntryRef entry, FindModel(who, model));
  if (!MayChange(who, *entry)) {
    return absl::PermissionDeniedError(
        absl::StrCat("'", who.name, "' may not unload model '", model,
                     "': only admins and the principals its configuration names may"));
  }
  return absl::OkStatus();
}

absl::Status TaskAdmission::Check(const Principal& who, const CatalogEntry& model,
                                  TaskSpec& spec) const {
  if (spec.kind == controller::TaskKind::kTraining) {
    if (!MayChange(who, model)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "'", who.name, "' may not change model '", model.request.name,
          "' for everyone (only admins and the principals its configuration names may): pass a "
          "copy name to train a copy of your own (pswitchctl train --as NAME, Python "
          "train(..., as_model=NAME))"));
    }
    if (spec.outputs_to || !spec.regions.empty() ||
        std::any_of(spec.inputs.begin(), spec.inputs.end(),
                    [](const proto::HostTensor& t) { return t.place != proto::Place::Inline; })) {
      return absl::InvalidArgumentError("a training task's tensors are inline");
    }
  } else {
    PSWITCH_RETURN_IF_ERROR(CheckInputs(model, spec.inputs));
    PSWITCH_RETURN_IF_ERROR(ResolvePlacement(regions_, who, model, spec));
  }
  Stamp(who, spec);
  return absl::OkStatus();
}

void TaskAdmission::Stamp(const Principal& who, TaskSpec& spec) {
  spec.deadline = std::min(spec.deadline, absl::Now() + kMaxTaskDeadline);
  spec.principal = who.name;  // workers clear their lease between owners
}

absl::StatusOr<uint64_t> TaskAdmission::Submit(const Principal& who, const std::string& client,
                                               TaskSpec spec, Done done) {
  PSWITCH_ASSIGN_OR_RETURN(EntryRef model, FindModel(who, spec.model));
  PSWITCH_RETURN_IF_ERROR(Check(who, *model, spec));
  PSWITCH_RETURN_IF_ERROR(quota_->Admit(client));
  ClientQuota* quota = quota_;
  absl::StatusOr<uint64_t> task = sink_->Queue(
      std::move(spec),
      [quota, client, done = std::move(done)](const absl::StatusOr<TaskOutcome>& outcome) {
        quota->Done(client);
        done(outcome);
      });
  if (!task.ok()) {
    quota_->Done(client);
    return task.status();
  }
  owners_->Record(*task, who.name);
  return task;
}

void TaskAdmission::SubmitOnCopy(const Principal& who, const std::string& client, TaskSpec spec,
                                 std::string copy_name, Accepted accepted, Done done) {
  auto refuse = [&accepted](const absl::Status& why) { accepted(why); };
  if (spec.kind != controller::TaskKind::kTraining) {
    return refuse(absl::InvalidArgumentError("only a training task trains a copy"));
  }
  if (absl::Status name = CheckCopyName(copy_name); !name.ok()) return refuse(name);
  absl::StatusOr<EntryRef> original = FindModel(who, spec.model);
  if (!original.ok()) return refuse(original.status());
  if (!(*original)->trainable.ok()) return refuse((*original)->trainable);
  if (sink_->Find(copy_name).ok()) {
    return refuse(absl::AlreadyExistsError(
        absl::StrCat("model '", copy_name, "' already exists: choose another copy name")));
  }
  if (who.role != Role::kAdmin) {
    const std::vector<EntryRef> all = sink_->List();
    const size_t owned = std::count_if(
        all.begin(), all.end(), [&who](const EntryRef& e) { return e->request.owner == who.name; });
    if (owned >= max_copies_) {
      return refuse(
          absl::ResourceExhaustedError(absl::StrCat("'", who.name, "' already has ", owned,
                                                    " copies, the most one principal "
                                                    "may have; unload one first")));
    }
  }
  Stamp(who, spec);
  if (absl::Status admitted = quota_->Admit(client); !admitted.ok()) return refuse(admitted);

  // The answer may come (on a scheduler thread) before `accepted` has run (on the registration
  // thread): it then waits, so a port always tells the task's id before its result.
  struct Order {
    explicit Order(Done d) : done(std::move(d)) {}
    const Done done;
    absl::Mutex mu;
    bool accepted ABSL_GUARDED_BY(mu) = false;
    std::optional<absl::StatusOr<TaskOutcome>> early ABSL_GUARDED_BY(mu);
  };
  auto order = std::make_shared<Order>(std::move(done));
  ClientQuota* quota = quota_;
  TaskOwners* owners = owners_;
  TaskSink* sink = sink_;
  const std::string original_name = spec.model;
  sink_->RegisterCopy(
      original_name, copy_name, who.name,
      [sink, quota, owners, client, who, copy_name, order, spec = std::move(spec),
       accepted = std::move(accepted)](const absl::StatusOr<EntryRef>& copy) mutable {
        if (!copy.ok()) {
          quota->Done(client);
          accepted(copy.status());
          return;
        }
        spec.model = copy_name;
        absl::StatusOr<uint64_t> task = sink->Queue(
            std::move(spec), [quota, client, order](const absl::StatusOr<TaskOutcome>& outcome) {
              quota->Done(client);
              {
                absl::MutexLock lock(&order->mu);
                if (!order->accepted) {
                  order->early = outcome;
                  return;
                }
              }
              order->done(outcome);
            });
        if (!task.ok()) {
          quota->Done(client);
          accepted(absl::Status(
              task.status().code(),
              absl::StrCat("copy '", copy_name, "' is registered for '", who.name,
                           "', but its training was refused: ", task.status().message())));
          return;
        }
        owners->Record(*task, who.name);
        accepted(*task);
        std::optional<absl::StatusOr<TaskOutcome>> early;
        {
          absl::MutexLock lock(&order->mu);
          order->accepted = true;
          early = std::move(order->early);
        }
        if (early) order->done(*early);
      });
}

}  // namespace pswitch::frontend
