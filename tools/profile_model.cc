// profile-model: per-layer execution times and bytes of a zoo model, written as the grouping
// profile JSON that find-grouping reads.
//
//   profile-model --model NAME --batch N [--device cpu|cuda] [--mode inference|training]
//                 --out P.json [--runs R] [--warmup W] [--bandwidth-cap BYTES_PER_S]
//
// On CUDA the host-to-device bandwidth is measured; the host backend has no device link, so the
// profile carries --bandwidth-cap (default 12e9 B/s, a PCIe 3 x16 link) and says so.
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/layer_profiler.h"
#include "models/registry.h"
#include "models/zoo_model.h"
#include "base/status.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, model, "", "registered model name");
ABSL_FLAG(int64_t, batch, 1, "batch size");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda[:N]");
ABSL_FLAG(std::string, mode, "inference", "inference or training");
ABSL_FLAG(std::string, out, "", "profile JSON to write");
ABSL_FLAG(int32_t, runs, 10, "measured runs; each layer's time is the median");
ABSL_FLAG(int32_t, warmup, 2, "warm-up runs before measuring");
ABSL_FLAG(double, bandwidth_cap, 12e9, "host backend: modelled transfer bandwidth, bytes/s");
ABSL_FLAG(std::string, config, "", "model setting overrides, e.g. n_layer=4,n_embd=256");
ABSL_FLAG(uint64_t, seed, 0, "seed for random weights and example input");

namespace pswitch::models {
namespace {

absl::Status Run() {
  const std::string name = absl::GetFlag(FLAGS_model);
  const std::string out_path = absl::GetFlag(FLAGS_out);
  if (name.empty() || out_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--model and --out are required; models: ",
                                                   absl::StrJoin(ModelNames(), ", ")));
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "inference" && mode != "training") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode ", mode, ": expected inference or training"));
  }
  if (absl::GetFlag(FLAGS_bandwidth_cap) <= 0) {
    return absl::InvalidArgumentError("--bandwidth-cap must be positive");
  }
  PSWITCH_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(absl::GetFlag(FLAGS_config)));
  PSWITCH_ASSIGN_OR_RETURN(c10::Device device, ResolveDevice(absl::GetFlag(FLAGS_device)));
  PSWITCH_ASSIGN_OR_RETURN(auto model, CreateModel(name, config, absl::GetFlag(FLAGS_seed)));
  PSWITCH_RETURN_IF_ERROR(CatchTorch("moving the model", [&] { model->to(device); }));

  ProfileOptions options;
  options.batch = absl::GetFlag(FLAGS_batch);
  options.training = mode == "training";
  options.warmup_runs = absl::GetFlag(FLAGS_warmup);
  options.measured_runs = absl::GetFlag(FLAGS_runs);
  options.bandwidth_cap_bytes_per_s = absl::GetFlag(FLAGS_bandwidth_cap);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.progress = [](const std::string& line) {
    std::fprintf(stderr, "profile-model: %s\n", line.c_str());
  };
  PSWITCH_ASSIGN_OR_RETURN(ModelProfile profile, ProfileModel(*model, device, options));

  std::ofstream out(out_path);
  out << ProfileToJson(profile).dump(2) << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("writing '", out_path, "' failed"));

  int64_t bytes = 0;
  double exec_s = 0;
  for (const auto& layer : profile.layers) {
    bytes += layer.param_bytes;
    exec_s += layer.exec_s;
  }
  std::fprintf(stderr,
               "profile-model: %s %s batch %lld on %s: %zu layers (%zu not executed), %lld bytes, "
               "sum exec_s %.6f s; bandwidth %.3g B/s (%s) -> %s\n",
               name.c_str(), mode.c_str(), static_cast<long long>(profile.batch),
               profile.device.c_str(), profile.layers.size(), profile.unexecuted_layers.size(),
               static_cast<long long>(bytes), exec_s, profile.bandwidth_bytes_per_s,
               profile.bandwidth_source.c_str(), out_path.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace pswitch::models

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(
      argc, argv,
      "profile-model --model NAME --batch N [--device cpu|cuda] [--mode inference|training] "
      "--out P.json");
  try {
    absl::Status status = pswitch::models::Run();
    if (!status.ok()) {
      std::fprintf(stderr, "profile-model: %s\n", status.ToString().c_str());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profile-model: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
