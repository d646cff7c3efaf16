// run-model: one forward pass of a zoo model outside the server, so a user can check a model and
// its weights before registering them.
//
//   run-model --model NAME [--weights W.safetensors] [--input X.safetensors] --output Y.safetensors
//             [--device cpu|cuda] [--batch N] [--config k=v,...] [--seed S]
//   run-model --archive A.pswitch.pt ...   (your own model, made by pswitch.export)
//
// Input keys: `input` (images, or token ids for BERT/GPT-2), plus `attention_mask` and
// `token_type_ids` for BERT when given. Without --input, a seeded example batch of --batch samples
// is used. With --input and --batch, the input runs in chunks of N samples. Output key: `output`.
// --device cuda builds the model on the CPU, loads the weights, moves both to the GPU (the first
// CUDA call creates the context) and copies the output back; a libtorch without CUDA is an error.
// The last stderr line gives the time of each phase (bench-switch's stop-and-start baseline).
#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/layer_profiler.h"
#include "base/files.h"
#include "models/registry.h"
#include "models/script_model.h"
#include "models/weights.h"
#include "models/zoo_model.h"
#include "base/status.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, model, "", "registered model name");
ABSL_FLAG(std::string, archive, "", "your own model: a pswitch.export archive (instead of --model)");
ABSL_FLAG(std::string, weights, "", "safetensors checkpoint (default: random weights from --seed)");
ABSL_FLAG(std::string, input, "", "safetensors file with key 'input' (default: example input)");
ABSL_FLAG(std::string, output, "", "safetensors file to write, key 'output'");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N]");
ABSL_FLAG(int64_t, batch, 0, "samples per forward pass (0: the whole input; 1 without --input)");
ABSL_FLAG(std::string, config, "", "model setting overrides, e.g. n_layer=4,n_embd=256");
ABSL_FLAG(uint64_t, seed, 0, "seed for random weights and example input");

namespace pswitch::models {
namespace {

absl::StatusOr<ModelInput> ReadInput(const std::string& path) {
  PSWITCH_ASSIGN_OR_RETURN(NamedTensors tensors, ReadTensors(path));
  ModelInput in;
  for (auto& [name, tensor] : tensors) {
    // Images run in fp32, token ids and masks as int64, whatever the file stores.
    at::Tensor t = tensor.is_floating_point() ? tensor.to(at::kFloat) : tensor.to(at::kLong);
    if (name == "input") {
      in.input = t;
    } else if (name == "attention_mask") {
      in.attention_mask = t;
    } else if (name == "token_type_ids") {
      in.token_type_ids = t;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", path, "': unexpected key '", name,
                       "' (expected 'input', 'attention_mask', 'token_type_ids')"));
    }
  }
  if (!in.input.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("input '", path, "': no key 'input'"));
  }
  return in;
}

ModelInput Slice(const ModelInput& in, int64_t begin, int64_t count, c10::Device device) {
  auto part = [&](const at::Tensor& t) {
    return t.defined() ? t.narrow(0, begin, count).to(device) : t;
  };
  return {part(in.input), part(in.attention_mask), part(in.token_type_ids)};
}

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

absl::Status Run() {
  const std::string archive = absl::GetFlag(FLAGS_archive);
  const std::string name = archive.empty() ? absl::GetFlag(FLAGS_model) : archive;
  const std::string output_path = absl::GetFlag(FLAGS_output);
  if (name.empty() || output_path.empty() ||
      (!archive.empty() && !absl::GetFlag(FLAGS_model).empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output and one of --model or --archive are required; models: ",
                     absl::StrJoin(ModelNames(), ", ")));
  }
  PSWITCH_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(absl::GetFlag(FLAGS_config)));
  PSWITCH_ASSIGN_OR_RETURN(c10::Device device, ResolveDevice(absl::GetFlag(FLAGS_device)));
  auto phase_start = Clock::now();
  std::shared_ptr<ZooModel> model;
  if (archive.empty()) {
    PSWITCH_ASSIGN_OR_RETURN(model, CreateModel(name, config, absl::GetFlag(FLAGS_seed)));
  } else {
    PSWITCH_ASSIGN_OR_RETURN(std::string bytes,
                             base::ReadRegularFile(archive, "archive", uint64_t{64} << 30));
    PSWITCH_ASSIGN_OR_RETURN(model, LoadScriptModel(archive, bytes, archive));
  }
  const double create_s = SecondsSince(phase_start);
  phase_start = Clock::now();
  if (!absl::GetFlag(FLAGS_weights).empty()) {
    PSWITCH_RETURN_IF_ERROR(LoadWeights(*model, absl::GetFlag(FLAGS_weights)));
  }
  const double load_s = SecondsSince(phase_start);
  int64_t batch = absl::GetFlag(FLAGS_batch);
  if (batch < 0) return absl::InvalidArgumentError("--batch must be >= 0");
  ModelInput input;
  if (absl::GetFlag(FLAGS_input).empty()) {
    input = model->ExampleInput(batch == 0 ? 1 : batch, absl::GetFlag(FLAGS_seed));
  } else {
    PSWITCH_ASSIGN_OR_RETURN(input, ReadInput(absl::GetFlag(FLAGS_input)));
  }
  const int64_t samples = input.input.size(0);
  if (batch == 0 || batch > samples) batch = samples;

  at::Tensor output;
  double to_device_s = 0;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("model '", name, "'"), [&] {
    phase_start = Clock::now();
    model->to(device);
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    to_device_s = SecondsSince(phase_start);
    model->eval();
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> outputs;
    const int64_t chunks = (samples + batch - 1) / batch;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < chunks; ++i) {
      const int64_t begin = i * batch;
      outputs.push_back(
          model->Forward(Slice(input, begin, std::min(batch, samples - begin), device))
              .output.cpu());
      if (chunks > 1) {
        std::fprintf(stderr, "run-model: %s batch %lld/%lld done\n", name.c_str(),
                     static_cast<long long>(i + 1), static_cast<long long>(chunks));
      }
    }
    output = at::cat(outputs, 0);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "run-model: %s on %s: %lld samples -> output [%s] in %.3f s\n",
                 name.c_str(), device.str().c_str(), static_cast<long long>(samples),
                 absl::StrJoin(output.sizes(), ", ").c_str(), seconds);
    std::fprintf(stderr,
                 "run-model: phases: create %.3f s, load weights %.3f s, to %s %.3f s (with the "
                 "CUDA context on a GPU), forward + output %.3f s\n",
                 create_s, load_s, device.str().c_str(), to_device_s, seconds);
  }));
  return WriteTensors(output_path, {{"output", output}});
}

}  // namespace
}  // namespace pswitch::models

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(
      argc, argv,
      "run-model --model NAME [--weights W.safetensors] [--input X.safetensors] "
      "--output Y.safetensors [--device cpu|cuda] [--batch N]");
  try {
    absl::Status status = pswitch::models::Run();
    if (!status.ok()) {
      std::fprintf(stderr, "run-model: %s\n", status.ToString().c_str());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run-model: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
