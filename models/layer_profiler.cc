#include "models/layer_profiler.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>
#ifdef PSWITCH_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"

namespace pswitch::models {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

void Synchronize(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Median time of one host->device copy of `bytes` (pinned source on CUDA; plain memcpy on the
// host backend, where a "transfer" is a copy between two host buffers).
double MedianCopySeconds(c10::Device device, int64_t bytes, int runs) {
  const bool cuda = device.is_cuda();
  at::Tensor src = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(cuda));
  at::Tensor dst = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  src.fill_(1);
  dst.copy_(src);  // warm-up: first touch of the pages
  Synchronize(device);
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    const auto start = Clock::now();
    dst.copy_(src, /*non_blocking=*/cuda);
    Synchronize(device);
    times.push_back(Seconds(Clock::now() - start));
  }
  return Median(times);
}

// One-way cost of signalling "group ready" between threads: the host backend's flag protocol
// (an atomic word + futex wake, which is what std::atomic::wait/notify use on Linux). On CUDA the
// wait happens on the stream; the cost we can see from here is a device synchronisation.
double GroupSyncSeconds(c10::Device device) {
  if (device.is_cuda()) {
    std::vector<double> times;
    for (int i = 0; i < 50; ++i) {
      const auto start = Clock::now();
      Synchronize(device);
      times.push_back(Seconds(Clock::now() - start));
    }
    return Median(times);
  }
  constexpr int kRounds = 200;
  std::atomic<int> flag{0}, ack{0};
  std::thread waiter([&] {
    for (int i = 1; i <= kRounds; ++i) {
      flag.wait(i - 1);
      ack.store(i);
      ack.notify_one();
    }
  });
  std::vector<double> times;
  for (int i = 1; i <= kRounds; ++i) {
    const auto start = Clock::now();
    flag.store(i);
    flag.notify_one();
    ack.wait(i - 1);
    times.push_back(Seconds(Clock::now() - start) / 2);  // a round trip is two signals
  }
  waiter.join();
  return Median(times);
}

}  // namespace

absl::StatusOr<c10::Device> ResolveDevice(absl::string_view name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name.substr(0, 4) == "cuda") {
    if (!torch::cuda::is_available()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--device ", name,
                       ": this libtorch build has no CUDA support or sees no GPU "
                       "(torch::cuda::is_available() is false); use --device cpu"));
    }
    c10::Device device(c10::kCPU);
    PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("--device ", name),
                                       [&] { device = c10::Device(std::string(name)); }));
    return device;
  }
  return absl::InvalidArgumentError(absl::StrCat("--device ", name, ": expected cpu or cuda[:N]"));
}

absl::StatusOr<ModelProfile> ProfileModel(ZooModel& model, c10::Device device,
                                          const ProfileOptions& options) {
  if (options.batch <= 0 || options.measured_runs <= 0 || options.warmup_runs < 0) {
    return absl::InvalidArgumentError("batch and runs must be positive");
  }
  ModelProfile profile;
  profile.model = model.model_name();
  profile.device = device.str();
  profile.mode = options.training ? "training" : "inference";
  profile.batch = options.batch;
  model.train(options.training);
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<Layer>* layers, model.Layers());
  int executed = 0;
  for (const Layer& layer : *layers) {
    (layer.executed ? profile.layers : profile.unexecuted_layers)
        .push_back({layer.name, layer.param_bytes, 0});
    executed += layer.executed ? 1 : 0;
  }

  const std::string what = absl::StrCat("profiling model '", model.model_name(), "'");
  std::vector<std::vector<double>> samples(executed);
  std::vector<double> backward_samples;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(what, [&] {
    const ModelInput input = model.ExampleInput(options.batch, options.seed, device);
    const at::Tensor target = model.ExampleTarget(options.batch, options.seed, device);
    std::unique_ptr<torch::optim::SGD> sgd;
    if (options.training) {
      sgd = std::make_unique<torch::optim::SGD>(model.parameters(), torch::optim::SGDOptions(1e-4));
    }
    std::vector<Clock::time_point> starts(executed);
    model.SetGateHook([&](int index) {
      Synchronize(device);
      starts[index] = Clock::now();
    });
    const int total = options.warmup_runs + options.measured_runs;
    const auto begin = Clock::now();
    for (int run = 0; run < total; ++run) {
      const bool warmup = run < options.warmup_runs;
      std::optional<torch::NoGradGuard> no_grad;
      if (!options.training) no_grad.emplace();
      if (sgd) sgd->zero_grad();
      ModelOutput out = model.Forward(input);
      Synchronize(device);
      const auto forward_end = Clock::now();
      if (options.training) {
        model.Loss(out, target).backward();
        sgd->step();
        Synchronize(device);
      }
      const auto end = Clock::now();
      if (!warmup) {
        for (int i = 0; i < executed; ++i) {
          const auto next = i + 1 < executed ? starts[i + 1] : forward_end;
          samples[i].push_back(Seconds(next - starts[i]));
        }
        backward_samples.push_back(Seconds(end - forward_end));
      }
      if (options.on_run) options.on_run(run + 1, total);
      if (options.progress) {
        options.progress(
            absl::StrFormat("%s: %s run %d/%d (%s) %.3f s, %.1f s elapsed", model.model_name(),
                            profile.mode, run + 1, total, warmup ? "warm-up" : "measured",
                            Seconds(end - starts.front()), Seconds(Clock::now() - begin)));
      }
    }
    model.SetGateHook(nullptr);

    if (device.is_cuda() && options.measured_bandwidth_bytes_per_s > 0) {
      profile.bandwidth_bytes_per_s = options.measured_bandwidth_bytes_per_s;
      profile.bandwidth_source = "measured at start-up through pswitchd's copy engine";
    } else if (device.is_cuda()) {
      constexpr int64_t kBandwidthProbeBytes = 256 << 20;
      profile.bandwidth_bytes_per_s =
          kBandwidthProbeBytes / MedianCopySeconds(device, kBandwidthProbeBytes, 5);
      profile.bandwidth_source = "measured: pinned host-to-device copy of 256 MiB";
    } else {
      profile.bandwidth_bytes_per_s = options.bandwidth_cap_bytes_per_s;
      profile.bandwidth_source =
          "configured cap (--bandwidth-cap): the host backend has no device link to measure";
    }
    profile.transfer_overhead_s = MedianCopySeconds(device, 4096, 50);
    profile.group_sync_overhead_s = GroupSyncSeconds(device);
  }));
  model.SetGateHook(nullptr);

  for (int i = 0; i < executed; ++i) profile.layers[i].exec_s = Median(samples[i]);
  if (options.training) {
    profile.backward_s = Median(backward_samples);
    if (!profile.layers.empty()) profile.layers.back().exec_s += profile.backward_s;
  }
  return profile;
}

void ReleaseCachedDeviceMemory() {
#ifdef PSWITCH_TORCH_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

nlohmann::json ProfileToJson(const ModelProfile& profile) {
  nlohmann::json json = grouping::ProfileToJson(profile);
  json["device"] = profile.device;
  json["mode"] = profile.mode;
  json["batch"] = profile.batch;
  json["bandwidth_source"] = profile.bandwidth_source;
  nlohmann::json unexecuted = nlohmann::json::array();
  for (const grouping::LayerProfile& layer : profile.unexecuted_layers) {
    unexecuted.push_back({{"name", layer.name}, {"param_bytes", layer.param_bytes}});
  }
  json["unexecuted_layers"] = std::move(unexecuted);
  if (profile.mode == "training") json["backward_s_in_last_layer"] = profile.backward_s;
  return json;
}

}  // namespace pswitch::models
