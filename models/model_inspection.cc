#include "models/model_inspection.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "base/mapped_file.h"
#include "base/status.h"
#include "models/layer_profiler.h"
#include "models/registry.h"
#include "models/script_model.h"
#include "models/training.h"
#include "models/weight_init.h"
#include "models/weights.h"

namespace pswitch::models {
namespace {

absl::StatusOr<FactsTensorSpec> SpecOf(const char* what, const at::Tensor& t) {
  FactsTensorSpec spec;
  switch (t.scalar_type()) {
    case at::kFloat:
      spec.dtype = DType::kF32;
      break;
    case at::kHalf:
      spec.dtype = DType::kF16;
      break;
    case at::kBFloat16:
      spec.dtype = DType::kBF16;
      break;
    case at::kLong:
      spec.dtype = DType::kI64;
      break;
    case at::kInt:
      spec.dtype = DType::kI32;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("the model's ", what, " is ", c10::toString(t.scalar_type()),
                       "; pswitch serves float32, float16, bfloat16, int64 and int32 tensors"));
  }
  spec.shape.assign(t.sizes().begin(), t.sizes().end());
  if (!spec.shape.empty()) spec.shape[0] = -1;  // the batch
  return spec;
}

// A descriptor the request lends: read through a duplicate, so the lender's stays open.
absl::StatusOr<UniqueFd> Borrow(int fd, const std::string& what) {
  const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return ErrnoStatus(absl::StrCat("borrowing ", what));
  return UniqueFd(copy);
}

// Measured runs of an "auto" plan's profile (its warm-up is the inspection's forward).
constexpr int kProfileRuns = 3;

// Moves `model` to `target.device`, where an "auto" plan is profiled.
absl::StatusOr<c10::Device> MoveToProfileDevice(ZooModel& model, const AutoPlanProfile& target) {
  absl::StatusOr<c10::Device> device = ResolveDevice(target.device);
  absl::Status moved = device.status();
  if (moved.ok()) moved = CatchTorch("moving the model", [&] { model.to(*device); });
  if (!moved.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("an \"auto\" plan is profiled on ", target.device,
                     ", the device the workers compute on, and that failed (", moved.message(),
                     "); register with a find-grouping plan file"));
  }
  return *device;
}

// The layer profile of `model` (on `device`) at `batch` (layer times do not depend on the
// weights), as profile JSON. The inspection's forward at this batch on this device was its
// warm-up (Inspect).
absl::StatusOr<std::string> Profile(ZooModel& model, uint32_t batch, c10::Device device,
                                    const AutoPlanProfile& target,
                                    const std::function<void(const InspectionProgress&)>& told) {
  ProfileOptions options;
  options.batch = batch;
  options.warmup_runs = 0;
  options.measured_runs = kProfileRuns;
  options.bandwidth_cap_bytes_per_s = target.bandwidth_bytes_per_s;
  options.measured_bandwidth_bytes_per_s = target.bandwidth_bytes_per_s;
  if (told) {
    options.on_run = [&told](int done, int total) {
      told({InspectionStep::kProfile, static_cast<uint32_t>(done), static_cast<uint32_t>(total)});
    };
  }
  PSWITCH_ASSIGN_OR_RETURN(ModelProfile profile, ProfileModel(model, device, options));
  return ProfileToJson(profile).dump();
}

}  // namespace

at::ScalarType TorchDType(ModelDType dtype) {
  switch (dtype) {
    case ModelDType::kFloat16:
      return at::kHalf;
    case ModelDType::kBFloat16:
      return at::kBFloat16;
    case ModelDType::kFloat32:
      break;
  }
  return at::kFloat;
}

absl::StatusOr<std::vector<int>> MapToLayoutOrder(const std::vector<Layer>& mode_layers,
                                                  const std::vector<Layer>& eval_layers) {
  absl::flat_hash_map<std::string, int> index;
  for (size_t i = 0; i < eval_layers.size(); ++i) index[eval_layers[i].name] = static_cast<int>(i);
  std::vector<int> map;
  map.reserve(mode_layers.size());
  for (const Layer& layer : mode_layers) {
    auto it = index.find(layer.name);
    if (it == index.end()) {
      return absl::NotFoundError(absl::StrCat("layer '", layer.name, "' missing from the layout"));
    }
    map.push_back(it->second);
  }
  return map;
}

namespace {

// The facts of InspectModel but the input and output specs (RecordSpecs).
absl::StatusOr<ModelFacts> CollectFacts(ZooModel& model) {
  ModelFacts facts;
  // Both modes' orders, recorded here once per registration: workers bind and gate by them.
  model.train();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<Layer>* train_layers, model.Layers());
  model.eval();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<Layer>* layers, model.Layers());
  PSWITCH_ASSIGN_OR_RETURN(std::vector<int> train_order, MapToLayoutOrder(*train_layers, *layers));
  facts.train_order.assign(train_order.begin(), train_order.end());
  auto storage = std::make_shared<std::vector<at::Tensor>>();
  for (const Layer& layer : *layers) {
    FactsLayer out{layer.name, layer.executed, {}};
    for (const LayerTensor& t : layer.tensors) {
      // A reference to the host bytes (no copy when already contiguous): moving the model to a
      // device for the profile gives it new tensors and leaves these as they were collected.
      at::Tensor contiguous = t.tensor.detach().contiguous();
      storage->push_back(contiguous);
      out.tensors.push_back(
          {t.name, std::span<const std::byte>(static_cast<const std::byte*>(contiguous.data_ptr()),
                                              contiguous.nbytes())});
    }
    facts.layers.push_back(std::move(out));
  }
  facts.optimizer_slot_bytes = OptimizerSlotBytes(model);
  facts.trainable = CheckTrainable(model);
  if (const at::ScalarType dtype = model.FloatDType(); dtype != at::kFloat) {
    facts.trainable = absl::FailedPreconditionError(absl::StrCat(
        "model '", model.model_name(), "' is served in ", c10::toString(dtype),
        "; pswitch trains float32 models only (register it with dtype float32 to train it)"));
  }
  facts.keep_alive = std::move(storage);
  return facts;
}

// The input and output specs, from one forward pass of the example input at `batch` on `device`
// (where the model is).
absl::Status RecordSpecs(ZooModel& model, uint32_t batch, c10::Device device, ModelFacts& facts) {
  // No activations kept for a backward that never comes (on a shared GPU, at the profile's batch).
  torch::NoGradGuard no_grad;
  // The input as the model takes it: a half-precision model's images in its own dtype.
  const ModelInput example = model.InModelDType(
      model.ExampleInput(static_cast<int64_t>(std::max<uint32_t>(batch, 1)), 0, device));
  PSWITCH_ASSIGN_OR_RETURN(ModelOutput out, RunForward(model, example));
  PSWITCH_ASSIGN_OR_RETURN(facts.input, SpecOf("input", example.input));
  PSWITCH_ASSIGN_OR_RETURN(facts.output, SpecOf("output", out.output));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelFacts> InspectModel(ZooModel& model, uint32_t example_batch) {
  PSWITCH_ASSIGN_OR_RETURN(ModelFacts facts, CollectFacts(model));
  PSWITCH_RETURN_IF_ERROR(RecordSpecs(model, example_batch, c10::kCPU, facts));
  return facts;
}

absl::StatusOr<ModelFacts> Inspect(const InspectionRequest& request,
                                   const AutoPlanProfile& profile) {
  auto told = [&request](InspectionStep step) {
    if (request.on_progress) request.on_progress({step});
  };
  told(InspectionStep::kBuild);
  ModelSource source{request.zoo, nullptr, request.name};
  if (request.zoo.empty()) {
    if (request.archive_fd < 0) {
      return absl::InvalidArgumentError("an inspection needs a zoo model or an archive");
    }
    PSWITCH_ASSIGN_OR_RETURN(UniqueFd archive_fd, Borrow(request.archive_fd, "the archive"));
    PSWITCH_ASSIGN_OR_RETURN(std::string archive,
                             base::ReadSealedMemoryFile(archive_fd, "the archive to inspect",
                                                        std::numeric_limits<uint64_t>::max()));
    source.archive = std::make_shared<const std::string>(std::move(archive));
  }
  std::shared_ptr<ZooModel> model;
  {
    // A checkpoint replaces every parameter and buffer (LoadWeights refuses one that misses
    // any): the seeded draw would be wasted.
    std::optional<SkipWeightInit> skip;
    if (request.weights_fd >= 0) skip.emplace();
    PSWITCH_ASSIGN_OR_RETURN(model, CreateModelFrom(source, request.name));
  }
  source.archive.reset();
  std::optional<ModelDType> dtype;
  if (!request.dtype.empty()) {
    PSWITCH_ASSIGN_OR_RETURN(dtype, ParseModelDType(request.dtype));
    if (request.zoo.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", request.name,
          "': an exported archive keeps the precision it was exported "
          "in (export it after model.half() or model.bfloat16()); register it without a dtype"));
    }
  }
  if (request.weights_fd >= 0) {
    told(InspectionStep::kCheckpoint);
    PSWITCH_ASSIGN_OR_RETURN(UniqueFd weights_fd,
                             Borrow(request.weights_fd, "the weights checkpoint"));
    // Mapped, not read: the checkpoint's bytes go once, into the model's tensors.
    PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<const base::MappedFile> mapped,
                             base::MappedFile::MapSealed(weights_fd, "the weights checkpoint",
                                                         std::numeric_limits<uint64_t>::max()));
    const absl::string_view bytes = mapped->bytes();
    PSWITCH_ASSIGN_OR_RETURN(SafetensorsFile file,
                             SafetensorsFile::ParseShared(
                                 std::move(mapped), bytes,
                                 request.weights_name.empty() ? "weights" : request.weights_name));
    PSWITCH_RETURN_IF_ERROR(LoadWeights(*model, file));
  }
  if (dtype.has_value() && *dtype != ModelDType::kFloat32) {
    // Built (and its checkpoint loaded) in float32, then converted whole: what
    // model.half() / model.bfloat16() does in PyTorch.
    PSWITCH_RETURN_IF_ERROR(
        CatchTorch(absl::StrCat("converting '", request.name, "' to ", request.dtype),
                   [&] { model->to(TorchDType(*dtype)); }));
  }
  const uint32_t batch = request.profile_batch;
  told(InspectionStep::kLayers);
  absl::StatusOr<ModelFacts> inspected = CollectFacts(*model);
  // The forward that records the input and output specs runs where the profile does, at its
  // batch, and is its warm-up: on a GPU node the CPU pass it replaces took 0.3 s of ResNet-152's
  // registration on the H100's host. Without a profile it runs on the CPU at batch 1.
  c10::Device device = c10::kCPU;
  const absl::Time profile_start = absl::Now();
  if (inspected.ok() && batch > 0) {
    // From here on it is the profile's time: the move, its warm-up, its runs.
    if (request.on_progress) request.on_progress({InspectionStep::kProfile, 0, kProfileRuns});
    // The facts keep the host bytes they collected; the model gets the device's own tensors.
    absl::StatusOr<c10::Device> moved = MoveToProfileDevice(*model, profile);
    if (!moved.ok()) return moved.status();
    device = *moved;
  }
  if (inspected.ok()) {
    absl::Status specs = RecordSpecs(*model, batch > 0 ? batch : 1, device, *inspected);
    if (!specs.ok() && !device.is_cpu() && absl::StrContains(specs.message(), "out of memory")) {
      // The device's memory failed the model, not the model itself.
      specs = absl::FailedPreconditionError(absl::StrCat(
          "an \"auto\" plan is profiled on ", profile.device, " at batch ", batch,
          ", the device the workers compute on, and the model's forward there failed (",
          specs.message(), "); register with a find-grouping plan file"));
    }
    if (!specs.ok()) {
      inspected = specs;
      model.reset();
      if (!device.is_cpu()) ReleaseCachedDeviceMemory();
    }
  }
  if (!inspected.ok() && device.is_cpu() && dtype.has_value() && *dtype != ModelDType::kFloat32 &&
      absl::IsInternal(inspected.status())) {
    // Without a GPU profile the inspection's forward runs on the CPU, where libtorch 1.13 has no
    // float16 kernels (2.x has them), whatever device the workers compute on.
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", request.name, "' cannot compute in ", request.dtype,
        " with this libtorch on the CPU, where its inspection runs (", inspected.status().message(),
        ")", *dtype == ModelDType::kFloat16 ? "; register it in bfloat16" : ""));
  }
  PSWITCH_ASSIGN_OR_RETURN(ModelFacts facts, std::move(inspected));
  if (batch > 0) {
    // The model is on the profile's device already, warmed by the specs' forward.
    absl::StatusOr<std::string> measured =
        Profile(*model, batch, device, profile, request.on_progress);
    facts.profile_us =
        static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - profile_start));
    // A GPU profile's blocks go back to the device once the model that holds them is gone (an
    // inspector in a long-lived process keeps nothing cached).
    model.reset();
    if (profile.device != "cpu") ReleaseCachedDeviceMemory();
    PSWITCH_ASSIGN_OR_RETURN(facts.profile_json, std::move(measured));
  }
  return facts;
}

absl::Status PrepareInspection(const AutoPlanProfile& profile) {
  // Two small models, a convolutional one and a one-layer transformer, go through what an
  // inspection does: a build, both recordings, a forward, and on a GPU a training step. The first
  // of each in a process pays for libtorch's allocator, thread pools, autograd's engine and the
  // code pages of its kernels (a cold child built ResNet-152 in 0.8 s where a warm process takes
  // 0.16 s), and on a GPU for the context, cuDNN's and cuBLAS's handles and lazily loaded kernels.
  const bool gpu = !(profile.device == "cpu" || profile.device.empty());
  absl::StatusOr<c10::Device> device = c10::Device(c10::kCPU);
  if (gpu) device = ResolveDevice(profile.device);
  PSWITCH_RETURN_IF_ERROR(device.status());
  const ModelConfig tiny_bert{{{"hidden_size", 64},
                               {"num_hidden_layers", 1},
                               {"num_attention_heads", 2},
                               {"intermediate_size", 128},
                               {"vocab_size", 512},
                               {"seq_len", 8}}};
  for (const auto& [zoo, config] :
       {std::pair<const char*, ModelConfig>{"tiny_cnn", {}}, {"bert_base", tiny_bert}}) {
    PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<ZooModel> model, CreateModel(zoo, config));
    PSWITCH_RETURN_IF_ERROR(InspectModel(*model, 2).status());
    if (!gpu) continue;
    PSWITCH_RETURN_IF_ERROR(
        CatchTorch(absl::StrCat("preparing ", profile.device, " for profiles"), [&] {
          model->to(*device);
          model->train();
        }));
    PSWITCH_RETURN_IF_ERROR(ComputeGradients(*model, model->ExampleInput(2, 0, *device),
                                             model->ExampleTarget(2, 0, *device))
                                .status());
  }
  // The blocks go back to the device: an inspector that waits keeps its context and the cuDNN
  // and cuBLAS handles (with cuBLAS's workspace), nothing of the models.
  if (gpu) ReleaseCachedDeviceMemory();
  return absl::OkStatus();
}

std::function<absl::StatusOr<ModelFacts>(const InspectionRequest&)> InspectInProcess(
    AutoPlanProfile profile) {
  return [profile = std::move(profile)](const InspectionRequest& request) {
    return Inspect(request, profile);
  };
}

}  // namespace pswitch::models
