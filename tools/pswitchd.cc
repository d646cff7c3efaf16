// pswitchd: the per-node pswitch daemon. This build runs the memory daemon for one GPU: it takes
// the arena, serves workers on its Unix socket, registers the embedded default models (two
// ResNet-152-sized weight sets) and switches between them to show the pipelined transmission,
// then serves until SIGINT/SIGTERM. The controller (task API) joins it in a later release.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "grouping/baselines.h"
#include "memdaemon/memdaemon.h"
#include "memdaemon/synthetic_model.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, backend, "auto",
          "device backend: auto (cuda if a GPU is present), cuda, host");
ABSL_FLAG(int, device, 0, "CUDA device ordinal");
ABSL_FLAG(uint64_t, arena_bytes, 0,
          "arena size; 0 = almost all free GPU memory (cuda) or 1 GiB (host)");
ABSL_FLAG(
    double, bandwidth_cap, 0,
    "host backend: copy bandwidth cap in bytes/s to model PCIe (12e9 = PCIe 3 x16); 0 = none");
ABSL_FLAG(std::string, socket, "", "worker socket path (default /tmp/pswitchd-UID.sock)");
ABSL_FLAG(int, demo_switches, 4, "switches between the embedded models at start-up");
ABSL_FLAG(uint32_t, demo_groups, 20, "groups per transmission in the start-up demo");
ABSL_FLAG(bool, exit_after_demo, false, "exit after the start-up demo instead of serving");

namespace pswitch {
namespace {

// logfmt lines on stderr: easy to grep, easy to ship to a log pipeline.
template <typename... Args>
void Log(const char* level, const char* event, const absl::FormatSpec<Args...>& fields,
         const Args&... args) {
  std::fprintf(stderr, "ts=%s level=%s event=%s %s\n",
               absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()).c_str(),
               level, event, absl::StrFormat(fields, args...).c_str());
}

absl::StatusOr<gpu::DeviceOptions> ChooseDevice() {
  gpu::DeviceOptions options;
  options.device_ordinal = absl::GetFlag(FLAGS_device);
  options.copy_bandwidth_bytes_per_s = absl::GetFlag(FLAGS_bandwidth_cap);
  std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "auto") {
    auto parsed = gpu::ParseBackend(backend);
    if (!parsed.ok()) return parsed.status();
    options.backend = *parsed;
    return options;
  }
  options.backend = gpu::Backend::kCuda;
  auto probe = gpu::Device::Open(options);
  if (probe.ok()) return options;
  Log("info", "backend_auto", "chosen=host reason=\"%s\"", probe.status().message());
  options.backend = gpu::Backend::kHost;
  return options;
}

absl::Status RunDemo(memdaemon::MemDaemon& daemon) {
  using memdaemon::kResNet152Bytes;
  using memdaemon::kResNet152Layers;
  auto first = memdaemon::MakeSyntheticModel("default-a", kResNet152Layers, kResNet152Bytes, 1);
  auto second = memdaemon::MakeSyntheticModel("default-b", kResNet152Layers, kResNet152Bytes, 2);
  const memdaemon::StoredModel* models[2];
  for (int i = 0; i < 2; ++i) {
    auto stored = daemon.weights().Register(i == 0 ? first->model : second->model);
    if (!stored.ok()) return stored.status();
    models[i] = *stored;
    Log("info", "model_registered", "model=%s layers=%d bytes=%d", (*stored)->name(),
        (*stored)->num_layers(), (*stored)->total_bytes());
  }
  auto region = daemon.leases().Acquire("active-model", kResNet152Bytes + (1 << 20));
  if (!region.ok()) return region.status();
  const uint32_t groups = absl::GetFlag(FLAGS_demo_groups);
  if (groups == 0 || groups > kResNet152Layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--demo_groups must be in [1, ", kResNet152Layers, "]"));
  }
  const int layers = static_cast<int>(kResNet152Layers);
  grouping::GroupPlan plan =
      *grouping::EveryKPlan(layers, (layers + static_cast<int>(groups) - 1) / groups);
  for (int s = 0; s < absl::GetFlag(FLAGS_demo_switches); ++s) {
    const memdaemon::StoredModel* model = models[s % 2];
    int64_t start_ns = gpu::MonotonicNowNs();
    auto transmission =
        daemon.transmitter().Start(memdaemon::TransmitRequest{model, plan, region->offset});
    if (!transmission.ok()) return transmission.status();
    auto traces = (*transmission)->Wait();
    if (!traces.ok()) return traces.status();
    Log("info", "switch",
        "model=%s epoch=%d groups=%d first_group_ready_ms=%.3f "
        "all_groups_ready_ms=%.3f",
        model->name(), (*transmission)->epoch(), traces->size(),
        (traces->front().ready_ns - start_ns) / 1e6, (traces->back().ready_ns - start_ns) / 1e6);
  }
  return absl::OkStatus();
}

int Main() {
  // Block the stop signals before any thread starts, so only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto device_options = ChooseDevice();
  if (!device_options.ok()) {
    Log("error", "start_failed", "error=\"%s\"", device_options.status().ToString());
    return 2;
  }
  memdaemon::MemDaemonOptions options;
  options.device = *device_options;
  options.arena_bytes = absl::GetFlag(FLAGS_arena_bytes);
  options.socket_path = absl::GetFlag(FLAGS_socket);
  if (options.socket_path.empty()) {
    options.socket_path = absl::StrCat("/tmp/pswitchd-", ::getuid(), ".sock");
  }
  auto daemon = memdaemon::MemDaemon::Create(options);
  if (!daemon.ok()) {
    Log("error", "start_failed", "error=\"%s\"", daemon.status().ToString());
    return 1;
  }
  Log("info", "started", "device=\"%s\" arena_bytes=%d socket=%s",
      (*daemon)->device().description(), (*daemon)->arena().size_bytes(), (*daemon)->socket_path());
  absl::Status demo = RunDemo(**daemon);
  if (!demo.ok()) {
    Log("error", "demo_failed", "error=\"%s\"", demo.ToString());
    return 1;
  }
  if (absl::GetFlag(FLAGS_exit_after_demo)) {
    Log("info", "stopped", "reason=exit_after_demo");
    return 0;
  }
  Log("info", "serving", "hint=\"Ctrl-C or SIGTERM to stop\"");
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  Log("info", "stopping", "signal=%s", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  daemon->reset();
  Log("info", "stopped", "reason=signal");
  return 0;
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv,
                                 "pswitch per-node daemon (memory daemon for one GPU).");
  return pswitch::Main();
}
