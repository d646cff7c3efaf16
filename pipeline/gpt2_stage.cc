#include "pipeline/gpt2_stage.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"

namespace pswitch::pipeline {
namespace {

using models::CatchTorch;

constexpr char kTiedWeight[] = "transformer.wte.weight";

// Wraps a received tensor's bytes without copying (on the CPU); the tensor owns them from here
// on. On a GPU stage it is copied to the device.
at::Tensor FromWire(WireTensor wire, c10::Device device) {
  auto* bytes = new std::vector<uint8_t>(std::move(wire.data));
  at::Tensor host = at::from_blob(
      bytes->data(), wire.shape, [bytes](void*) { delete bytes; },
      at::TensorOptions().dtype(at::kFloat));
  return device.is_cpu() ? host : host.to(device);
}

WireTensor ToWire(const at::Tensor& tensor) {
  at::Tensor t = tensor.detach().to(at::kCPU, at::kFloat).contiguous();
  WireTensor wire{WireDType::kF32, t.sizes().vec(), std::vector<uint8_t>(t.nbytes())};
  std::memcpy(wire.data.data(), t.data_ptr(), t.nbytes());
  return wire;
}

absl::Duration Median(std::vector<absl::Duration> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::pair<int, int> StageBlocks(int blocks, int stages, int stage) {
  const int base = blocks / stages, extra = blocks % stages;
  const int first = stage * base + std::min(stage, extra);
  return {first, first + base + (stage < extra ? 1 : 0)};
}

at::Tensor IterationTokens(const models::ZooModel& model, int64_t samples, uint64_t seed,
                           int iteration) {
  // Distinct from the weight seed's stream and from every other iteration's batch.
  const uint64_t data_seed = seed * 1000003ull + 7919ull * static_cast<uint64_t>(iteration + 1);
  return model.ExampleInput(samples, data_seed).input;
}

Gpt2StageCompute::Gpt2StageCompute(const Gpt2StageOptions& options,
                                   std::shared_ptr<models::ZooModel> model,
                                   models::Gpt2Parts* parts, int64_t seq_len, int64_t embd)
    : options_(options),
      model_(std::move(model)),
      parts_(parts),
      activation_spec_{WireDType::kF32, {options.microbatch_size, seq_len, embd}} {}

Gpt2StageCompute::~Gpt2StageCompute() = default;

absl::StatusOr<std::unique_ptr<Gpt2StageCompute>> Gpt2StageCompute::Create(
    const Gpt2StageOptions& options) {
  if (options.stages < 1 || options.stage < 0 || options.stage >= options.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", options.stage, " of ", options.stages, " stages"));
  }
  if (options.microbatches < 1 || options.microbatch_size < 1) {
    return absl::InvalidArgumentError("micro-batches and micro-batch size must be positive");
  }
  if (options.learning_rate <= 0 || options.momentum < 0) {
    return absl::InvalidArgumentError("learning rate must be positive and momentum >= 0");
  }
  // One intra-op thread: a stage is one pipeline worker, and its bubbles must be idle time,
  // not time other threads of the same stage spend computing.
  at::set_num_threads(1);
  PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<models::ZooModel> model,
                           models::CreateModel("gpt2", options.model_config, options.seed));
  models::Gpt2Parts* parts = models::AsGpt2Parts(*model);
  if (parts == nullptr) return absl::InternalError("the zoo's gpt2 exposes no Gpt2Parts");
  if (parts->num_blocks() < options.stages) {
    return absl::InvalidArgumentError(absl::StrCat("gpt2 with n_layer=", parts->num_blocks(),
                                                   " cannot be split over ", options.stages,
                                                   " stages (at least one block each)"));
  }
  // The settings the model was built with: the registry's defaults under the overrides.
  models::ModelConfig config;
  for (const models::ModelSpec& spec : models::ModelSpecs()) {
    if (spec.name == "gpt2") config = spec.defaults;
  }
  for (const auto& [key, value] : options.model_config.values) config.values[key] = value;
  auto compute = std::unique_ptr<Gpt2StageCompute>(
      new Gpt2StageCompute(options, model, parts, config.Get("seq_len"), config.Get("n_embd")));
  PSWITCH_RETURN_IF_ERROR(compute->SelectParameters());
  return compute;
}

absl::Status Gpt2StageCompute::SelectParameters() {
  std::tie(first_block_, end_block_) =
      StageBlocks(parts_->num_blocks(), options_.stages, options_.stage);
  std::vector<std::string> prefixes;
  if (first()) prefixes = {"transformer.wte.", "transformer.wpe."};
  for (int b = first_block_; b < end_block_; ++b) {
    prefixes.push_back(absl::StrCat("transformer.h.", b, "."));
  }
  if (last()) prefixes.push_back("transformer.ln_f.");
  return CatchTorch(absl::StrCat("gpt2 stage ", options_.stage, ": parameters"), [&] {
    options_.dropout ? model_->train() : model_->eval();
    model_->to(options_.device);
    torch::NoGradGuard no_grad;
    for (const auto& p : model_->named_parameters()) {
      bool owned = (last() && p.key() == kTiedWeight);
      for (const std::string& prefix : prefixes) owned = owned || absl::StartsWith(p.key(), prefix);
      if (owned) {
        params_.emplace_back(p.key(), p.value());
        if (p.key() == kTiedWeight) tied_weight_ = p.value();
      } else {
        // Never used on this stage: release its memory (the whole model was built only so
        // that every stage starts from the same weights).
        p.value().set_data(at::empty({0}, p.value().options()));
      }
    }
    std::vector<at::Tensor> tensors;
    for (const auto& [name, tensor] : params_) tensors.push_back(tensor);
    optimizer_ = std::make_unique<torch::optim::SGD>(
        tensors, torch::optim::SGDOptions(options_.learning_rate).momentum(options_.momentum));
  });
}

void Gpt2StageCompute::SyncDevice() const {
  // A profiled op must include its kernels, not just their launch.
  if (options_.device.is_cuda()) torch::cuda::synchronize(options_.device.index());
}

at::Tensor Gpt2StageCompute::MicrobatchTokens(int microbatch) const {
  return tokens_.narrow(0, microbatch * options_.microbatch_size, options_.microbatch_size);
}

Gpt2StageCompute::InFlight Gpt2StageCompute::RunForward(const at::Tensor& input,
                                                        const at::Tensor& ids) {
  InFlight f;
  at::Tensor h;
  if (first()) {
    h = parts_->Embed(ids);
  } else {
    f.input = input.requires_grad_(true);
    h = f.input;
  }
  for (int b = first_block_; b < end_block_; ++b) h = parts_->Block(b, h);
  if (last()) {
    const at::Tensor loss = model_->Loss({parts_->Head(h), {}}, ids);
    // The mean over micro-batches is the loss of the whole batch (equal-sized micro-batches).
    f.output = loss / options_.microbatches;
  } else {
    f.output = h;
  }
  return f;
}

absl::StatusOr<StageCost> Gpt2StageCompute::Profile() {
  std::vector<absl::Duration> forward, backward;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("gpt2 stage ", options_.stage, ": profile"), [&] {
    const at::Tensor ids =
        IterationTokens(*model_, options_.microbatch_size, options_.seed, -2).to(options_.device);
    at::Generator gen = at::detail::createCPUGenerator(options_.seed + 17);
    for (int run = 0; run <= options_.profile_microbatches; ++run) {
      const at::Tensor input = at::randn(activation_spec_.shape, gen).to(options_.device);
      const at::Tensor grad = at::randn(activation_spec_.shape, gen).to(options_.device);
      absl::Time t = absl::Now();
      InFlight f = RunForward(input, ids);
      SyncDevice();
      const absl::Duration fwd = absl::Now() - t;
      t = absl::Now();
      last() ? f.output.backward() : f.output.backward(grad);
      SyncDevice();
      const absl::Duration bwd = absl::Now() - t;
      if (run > 0) {  // the first run pays for allocations and lazy initialisation
        forward.push_back(fwd);
        backward.push_back(bwd);
      }
    }
    optimizer_->zero_grad();
  }));
  if (forward.empty()) return StageCost{};
  return StageCost{Median(forward), Median(backward)};
}

absl::Status Gpt2StageCompute::StartIteration(int iteration) {
  iteration_ = iteration;
  in_flight_.clear();
  loss_sum_ = 0;
  return CatchTorch(absl::StrCat("gpt2 stage ", options_.stage, ": start"), [&] {
    optimizer_->zero_grad();
    if (first() || last()) {
      tokens_ = IterationTokens(*model_, options_.microbatches * options_.microbatch_size,
                                options_.seed, iteration)
                    .to(options_.device);
    }
  });
}

absl::StatusOr<WireTensor> Gpt2StageCompute::Forward(int microbatch, WireTensor input) {
  if (microbatch < 0 || microbatch >= options_.microbatches || in_flight_.count(microbatch)) {
    return absl::FailedPreconditionError(
        absl::StrCat("forward of micro-batch ", microbatch, " out of order"));
  }
  WireTensor out;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("gpt2 stage ", options_.stage, ": forward"), [&] {
    const at::Tensor ids = (first() || last()) ? MicrobatchTokens(microbatch) : at::Tensor();
    InFlight f =
        RunForward(first() ? at::Tensor() : FromWire(std::move(input), options_.device), ids);
    if (last()) {
      loss_sum_ += f.output.item<double>() * options_.microbatches;
    } else {
      out = ToWire(f.output);
    }
    in_flight_.emplace(microbatch, std::move(f));
  }));
  return out;
}

absl::StatusOr<WireTensor> Gpt2StageCompute::Backward(int microbatch, WireTensor output_grad) {
  auto node = in_flight_.extract(microbatch);
  if (node.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("backward of micro-batch ", microbatch, " before its forward"));
  }
  WireTensor input_grad;
  PSWITCH_RETURN_IF_ERROR(
      CatchTorch(absl::StrCat("gpt2 stage ", options_.stage, ": backward"), [&] {
        InFlight& f = node.mapped();
        if (last()) {
          f.output.backward();
        } else {
          f.output.backward(FromWire(std::move(output_grad), options_.device));
        }
        if (!first()) input_grad = ToWire(f.input.grad());
      }));
  return input_grad;
}

absl::StatusOr<std::optional<WireTensor>> Gpt2StageCompute::TiedGradient() {
  if (!holds_tied()) return std::nullopt;
  std::optional<WireTensor> grad;
  PSWITCH_RETURN_IF_ERROR(CatchTorch("tied gradient", [&] {
    grad =
        ToWire(tied_weight_.grad().defined() ? tied_weight_.grad() : at::zeros_like(tied_weight_));
  }));
  return grad;
}

absl::Status Gpt2StageCompute::AddTiedGradient(const WireTensor& peer) {
  if (!holds_tied()) return StageCompute::AddTiedGradient(peer);
  return CatchTorch("add tied gradient", [&] {
    at::Tensor other = FromWire(peer, options_.device);
    if (!tied_weight_.grad().defined()) {
      tied_weight_.mutable_grad() = other.clone();
    } else {
      // Both ends add in the same order, mine + peer's, but float addition commutes: the two
      // copies of the weight stay bit-identical.
      tied_weight_.mutable_grad().add_(other);
    }
  });
}

absl::StatusOr<double> Gpt2StageCompute::FinishIteration() {
  if (!in_flight_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(in_flight_.size(), " micro-batches without backward at the iteration's end"));
  }
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("gpt2 stage ", options_.stage, ": step"),
                                     [&] { optimizer_->step(); }));
  return last() ? loss_sum_ / options_.microbatches : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace pswitch::pipeline
