#include "registry/registration_pipeline.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/json.h"
#include "base/log.h"
#include "base/status.h"
#include "grouping/cost_model.h"
#include "grouping/profile.h"
#include "grouping/search.h"
#include "models/model_dtype.h"
#include "models/model_source.h"
#include "nlohmann/json.hpp"
#include "proto/dtype.h"

namespace pswitch::registry {
namespace {

absl::string_view StepName(models::InspectionStep step) {
  switch (step) {
    case models::InspectionStep::kBuild:
      return "build";
    case models::InspectionStep::kCheckpoint:
      return "checkpoint";
    case models::InspectionStep::kLayers:
      return "layers";
    case models::InspectionStep::kProfile:
      return "profile";
  }
  return "unknown";
}

// One `inspection_step` line per step of an inspection, with the time from its first report to
// the next step's (the last: to the facts' arrival, which includes sending them back).
class InspectionStepLog {
 public:
  explicit InspectionStepLog(const std::string& model) : model_(model) {}
  void Reached(models::InspectionStep step) {
    if (step_.has_value() && *step_ == step) return;
    Close(absl::Now(), /*last=*/false);
    step_ = step;
  }
  void Ended(bool ok) {
    if (ok) Close(absl::Now(), /*last=*/true);
  }

 private:
  void Close(absl::Time now, bool last) {
    if (step_.has_value()) {
      base::Log(base::LogLevel::kInfo, "inspection_step")
          .Field("model", model_)
          .Field("step", StepName(*step_))
          .FieldMs("ms", now - since_)
          .Field("with_facts_returned", last ? "yes" : "no");
    }
    since_ = now;
  }

  const std::string& model_;
  std::optional<models::InspectionStep> step_;
  absl::Time since_ = absl::Now();
};

constexpr uint64_t kMaxPlanBytes = 16 << 20;
// An archive holds the model's weights too: one larger than the weights region (plus room for
// its code) could not register anyway, and is not read into memory.
constexpr uint64_t kMaxArchiveBytes = 64ull << 30;
constexpr uint64_t kArchiveCodeBytes = 256ull << 20;

// A file the request names: in its repository folder, or (local use) a server path; or the copy
// of a file the client passed (`passed`), never opened by path.
absl::StatusOr<std::string> ReadRequestFile(const ModelRequest& request, const std::string& path,
                                            const char* kind, uint64_t max_bytes,
                                            const std::shared_ptr<const UniqueFd>& passed) {
  const std::string what = absl::StrCat(kind, " '", path, "'");
  if (passed != nullptr) return base::ReadSealedMemoryFile(*passed, what, max_bytes);
  absl::StatusOr<std::string> read = request.files != nullptr
                                         ? request.files->Read(path, kind, max_bytes)
                                         : base::ReadRegularFile(path, what, max_bytes);
  if (request.files == nullptr &&
      (absl::IsNotFound(read.status()) || absl::IsPermissionDenied(read.status()))) {
    // Existence of a server file is not a client's to learn.
    return absl::PermissionDeniedError(absl::StrCat(what, " cannot be opened by pswitchd"));
  }
  return read;
}

absl::StatusOr<grouping::GroupPlan> ReadPlanFile(const ModelRequest& request) {
  const std::string& path = request.plan;
  PSWITCH_ASSIGN_OR_RETURN(std::string text, ReadRequestFile(request, path, "plan file",
                                                             kMaxPlanBytes, request.plan_fd));
  const std::string what = absl::StrCat("plan file '", path, "'");
  PSWITCH_ASSIGN_OR_RETURN(nlohmann::json json, base::ParseUntrustedJson(text, what));
  if (!json.is_object() || !json.contains("groups")) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan file '", path, "' is not find-grouping output (no \"groups\")"));
  }
  return grouping::PlanFromJson(json["groups"]);
}

// The unexecuted tail layers (Inception's aux head in eval) ride in one last group.
grouping::GroupPlan CoverTail(grouping::GroupPlan plan, int executed, int layout_layers) {
  if (layout_layers > executed) plan.push_back({executed, layout_layers - 1});
  return plan;
}

proto::DType WireDType(models::DType dtype) {
  // The facts hold F32, F16, BF16, I64 or I32 only (checked when they are decoded).
  const proto::DTypeInfo* info = proto::DTypeByName(models::DTypeName(dtype));
  return info == nullptr ? proto::DType::F32 : info->wire;
}

TensorSpec WireSpec(const std::string& name, const models::FactsTensorSpec& spec) {
  return TensorSpec{name, WireDType(spec.dtype), spec.shape};
}

// The facts' weights as the memdaemon's store takes them; the spans point into `facts`.
memdaemon::ModelBytes WeightsOf(const models::ModelFacts& facts, const std::string& name) {
  memdaemon::ModelBytes bytes;
  bytes.name = name;
  for (const models::FactsLayer& layer : facts.layers) {
    memdaemon::LayerBytes out{layer.name, {}};
    for (const models::FactsTensor& t : layer.tensors) out.tensors.push_back({t.name, t.bytes});
    bytes.layers.push_back(std::move(out));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<grouping::GroupPlan> RegistrationPipeline::MakePlan(const ModelRequest& request,
                                                                   const std::string& profile_json,
                                                                   int layout_layers,
                                                                   int executed_layers,
                                                                   PhaseClock& clock) const {
  if (request.plan != "auto") {
    PSWITCH_ASSIGN_OR_RETURN(grouping::GroupPlan plan, ReadPlanFile(request));
    // A plan made from profile-model output covers the executed layers only.
    if (grouping::ValidatePlan(plan, executed_layers).ok()) {
      plan = CoverTail(std::move(plan), executed_layers, layout_layers);
    }
    absl::Status valid = grouping::ValidatePlan(plan, layout_layers);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan file '", request.plan, "': ", valid.message()));
    }
    clock.End("plan");
    return plan;
  }
  // The inspection child's profile: untrusted text until parsed and checked.
  absl::StatusOr<grouping::Profile> profile = grouping::ParseProfileJson(profile_json);
  if (!profile.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the inspector's profile is not a profile: ", profile.status().message()));
  }
  // Checked before the search, whose time grows with the layer count the child claims.
  if (profile->layers.size() != static_cast<size_t>(executed_layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the inspector's profile has ", profile->layers.size(),
                     " layers; the model executes ", executed_layers));
  }
  PSWITCH_ASSIGN_OR_RETURN(grouping::CostModel cost, grouping::CostModel::Create(*profile));
  PSWITCH_ASSIGN_OR_RETURN(grouping::SearchOutcome outcome,
                           grouping::FindGrouping(cost, grouping::SearchOptions{}));
  clock.End("plan");
  if (grouping::ValidatePlan(outcome.result.plan, executed_layers).ok()) {
    return CoverTail(outcome.result.plan, executed_layers, layout_layers);
  }
  return absl::InternalError("the profile does not match the model's layers");
}

absl::StatusOr<std::unique_ptr<CatalogEntry>> RegistrationPipeline::Build(
    const ModelRequest& request, PhaseClock& clock) const {
  if (request.batch_size == 0 || request.batch_size > kMaxBatchSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size ", request.batch_size, " out of range [1, ", kMaxBatchSize, "]"));
  }
  if (!request.dtype.empty()) {
    PSWITCH_RETURN_IF_ERROR(models::ParseModelDType(request.dtype).status());
    if (request.archive_fd != nullptr || !request.archive_path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", request.name,
          "': an exported archive keeps the precision it was exported in "
          "(export it after model.half() or model.bfloat16()); register it without a dtype"));
    }
  }
  if (!inspector_) {
    return absl::FailedPreconditionError("no model inspector: registration cannot look at models");
  }
  std::shared_ptr<const UniqueFd> archive_fd;
  const uint64_t max_archive_bytes = std::min(kMaxArchiveBytes, region_bytes_ + kArchiveCodeBytes);
  uint64_t archive_bytes = 0;
  if (request.archive_fd != nullptr) {
    // A sealed copy already (a registered model's, or a file the client passed): only the
    // inspector reads it.
    PSWITCH_ASSIGN_OR_RETURN(archive_bytes, base::CheckSealedMemoryFile(
                                                *request.archive_fd, "archive", max_archive_bytes));
    archive_fd = request.archive_fd;
  } else if (!request.archive_path.empty()) {
    PSWITCH_ASSIGN_OR_RETURN(
        std::string bytes,
        ReadRequestFile(request, request.archive_path, "archive", max_archive_bytes, nullptr));
    archive_bytes = bytes.size();
    PSWITCH_ASSIGN_OR_RETURN(UniqueFd fd, base::SealedMemoryFile("pswitch-archive", bytes));
    archive_fd = std::make_shared<const UniqueFd>(std::move(fd));
  }
  // The checkpoint's bytes, read here: the repository's or the server's access rules apply. A
  // file the client passed is already a sealed copy: the inspector reads that one.
  UniqueFd weights_fd;
  const bool passed_weights = request.weights_fd != nullptr;
  if (passed_weights) {
    PSWITCH_RETURN_IF_ERROR(
        base::CheckSealedMemoryFile(*request.weights_fd,
                                    absl::StrCat("weights file '", request.weights_path, "'"),
                                    models::SafetensorsLimits().max_file_bytes)
            .status());
  } else if (!request.weights_path.empty()) {
    PSWITCH_ASSIGN_OR_RETURN(std::string bytes,
                             ReadRequestFile(request, request.weights_path, "weights file",
                                             models::SafetensorsLimits().max_file_bytes, nullptr));
    PSWITCH_ASSIGN_OR_RETURN(weights_fd, base::SealedMemoryFile("pswitch-weights", bytes));
  }
  clock.End("read");
  const bool profile = request.plan == "auto";
  InspectionRequest inspection{
      .name = request.name,
      .zoo = archive_fd != nullptr ? "" : request.zoo_model,
      .archive_fd = archive_fd != nullptr ? archive_fd->get() : -1,
      .weights_fd = passed_weights ? request.weights_fd->get() : weights_fd.get(),
      .weights_name = request.weights_path,
      .dtype = request.dtype,
      .profile_batch = profile ? request.batch_size : 0,
      .max_facts_bytes = max_archive_bytes};
  // The inspection's steps and profile runs, as the "inspect" phase's progress; each step's time
  // as its reports arrive goes to the log (where an inspection's time goes on a machine no one
  // can look at).
  InspectionStepLog steps(request.name);
  inspection.on_progress = [&clock, &steps](const models::InspectionProgress& p) {
    steps.Reached(p.step);
    clock.Progress("inspect", models::DescribeInspectionProgress(p));
  };
  absl::StatusOr<models::ModelFacts> inspected = inspector_(inspection);
  steps.Ended(inspected.ok());
  PSWITCH_ASSIGN_OR_RETURN(models::ModelFacts facts, std::move(inspected));
  if (profile) {
    clock.EndSplit("inspect", "profile", absl::Microseconds(facts.profile_us));
  } else {
    clock.End("inspect");
  }
  const int layout_layers = static_cast<int>(facts.layers.size());
  int executed = 0;
  for (const models::FactsLayer& layer : facts.layers) executed += layer.executed ? 1 : 0;
  const memdaemon::ModelBytes weights = WeightsOf(facts, request.name);
  auto entry = std::make_unique<CatalogEntry>();
  entry->request = request;
  // Read once: a passed file's copy is not kept for the model's life.
  entry->request.weights_fd.reset();
  entry->request.plan_fd.reset();
  entry->optimizer_slot_bytes = facts.optimizer_slot_bytes;
  entry->train_order = facts.train_order;
  entry->trainable = facts.trainable;
  entry->input = WireSpec("input", facts.input);
  entry->output = WireSpec("output", facts.output);
  PSWITCH_ASSIGN_OR_RETURN(entry->plan,
                           MakePlan(request, facts.profile_json, layout_layers, executed, clock));
  entry->archive = archive_fd;
  entry->archive_bytes = archive_bytes;
  for (const grouping::LayerGroup& g : entry->plan) {
    entry->group_last_layer.push_back(static_cast<uint32_t>(g.last));
  }
  // Checked before the weights are copied into pinned memory, so a refusal costs nothing.
  PSWITCH_ASSIGN_OR_RETURN(memdaemon::WeightLayout layout,
                           memdaemon::ComputeWeightLayout(memdaemon::LayerSpecsOf(weights)));
  if (layout.total_bytes > region_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model '", request.name, "' needs ", layout.total_bytes,
                     " bytes of weights; the weights region holds ", region_bytes_));
  }
  PSWITCH_ASSIGN_OR_RETURN(entry->stored, daemon_->weights().Register(weights));
  entry->layers = static_cast<uint32_t>(entry->stored->num_layers());
  entry->weight_bytes = entry->stored->total_bytes();
  clock.End("pin");
  return entry;
}

absl::StatusOr<std::unique_ptr<CatalogEntry>> RegistrationPipeline::Copy(
    const CatalogEntry& original, const std::string& name, const std::string& owner) const {
  if (original.stored == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", original.request.name, "' has no stored weights to copy"));
  }
  // The original's pinned bytes as they are now, tensor by tensor in its layout: the copy gets
  // the same layout, so its plan and group boundaries carry over unchanged.
  const memdaemon::StoredModel& stored = *original.stored;
  memdaemon::ModelBytes bytes;
  bytes.name = name;
  for (size_t l = 0; l < stored.layers().size(); ++l) {
    const memdaemon::LayerSpec& layer = stored.layers()[l];
    memdaemon::LayerBytes out{layer.name, {}};
    for (size_t t = 0; t < layer.tensors.size(); ++t) {
      const memdaemon::TensorPlacement& at = stored.layout().placements[l][t];
      out.tensors.push_back(
          {layer.tensors[t].name,
           std::span<const std::byte>(stored.host_bytes() + at.offset, at.bytes)});
    }
    bytes.layers.push_back(std::move(out));
  }
  absl::StatusOr<const memdaemon::StoredModel*> copied = daemon_->weights().Register(bytes);
  if (!copied.ok()) {
    return absl::Status(copied.status().code(),
                        absl::StrCat("copying '", original.request.name, "' as '", name,
                                     "': ", copied.status().message()));
  }
  auto entry = std::make_unique<CatalogEntry>(original);
  entry->request.name = name;
  entry->request.owner = owner;
  entry->request.trainers.clear();
  entry->stored = *copied;
  entry->layers = static_cast<uint32_t>((*copied)->num_layers());
  entry->weight_bytes = (*copied)->total_bytes();
  return entry;
}

absl::Status RegistrationPipeline::Release(const CatalogEntry& entry) const {
  return daemon_->weights().Remove(entry.request.name);
}

}  // namespace pswitch::registry
