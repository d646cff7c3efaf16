// bench-transfer: how fast the memdaemon streams a ResNet-152-sized model into the arena as one
// group, per layer and in 20 groups, against a plain memcpy of the same bytes measured in the
// same run. Prints time to first group ready (when compute could start) and to last group
// ready (when the whole model is in). Then the same model in half precision (float16 or
// bfloat16: the same layers, each tensor half the bytes) against float32, alternating in the same
// run (issue 28: half the copy time).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "grouping/baselines.h"
#include "memdaemon/memdaemon.h"
#include "memdaemon/synthetic_model.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, backend, "host", "device backend: host or cuda");
ABSL_FLAG(double, bandwidth_cap, 0,
          "host backend: copy bandwidth cap in bytes/s (e.g. 12e9 for PCIe 3 x16); 0 = none");
ABSL_FLAG(int, repeats, 5, "runs per plan; the median is reported");
ABSL_FLAG(bool, cuda_vmm_arena, false,
          "cuda: the arena in VMM chunks, so the per-task access section measures a worker's "
          "grant (cuMemMap + cuMemSetAccess) against the region's copy");
ABSL_FLAG(uint32_t, layers, pswitch::memdaemon::kResNet152Layers, "layers of the model");
ABSL_FLAG(uint64_t, model_bytes, pswitch::memdaemon::kResNet152Bytes, "bytes of the model");

namespace pswitch::memdaemon {
namespace {

struct PlanResult {
  double first_ready_ms = 0;
  double last_ready_ms = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::StatusOr<PlanResult> RunPlan(MemDaemon& daemon, const StoredModel& model,
                                   const grouping::GroupPlan& groups, uint64_t offset,
                                   int repeats) {
  std::vector<double> first, last;
  for (int r = 0; r < repeats; ++r) {
    int64_t start_ns = base::MonotonicNowNs();
    auto t = daemon.transmitter().Start(TransmitRequest{&model, groups, offset});
    if (!t.ok()) return t.status();
    auto traces = (*t)->Wait(absl::Seconds(60));
    if (!traces.ok()) return traces.status();
    first.push_back((traces->front().ready_ns - start_ns) / 1e6);
    last.push_back((traces->back().ready_ns - start_ns) / 1e6);
  }
  return PlanResult{Median(first), Median(last)};
}

// Issue 29 item 2: what a worker pays to be given a model region (and to give it back), in a
// second mapping of the arena restricted as a worker's is, against the region's own copy.
int ReportAccess(MemDaemon& daemon, uint64_t offset, uint64_t bytes, double copy_ms, int repeats) {
  // A second import of the daemon's own arena, in this process (a CUDA IPC arena cannot be
  // imported by its exporter, and cannot restrict access either).
  if (daemon.arena().access_granularity() == 0) {
    std::printf("\nper-task arena access: not restricted on this backend\n");
    return 0;
  }
  absl::StatusOr<gpu::ArenaHandle> handle = daemon.arena().Export();
  absl::StatusOr<std::unique_ptr<gpu::Arena>> view =
      handle.ok() ? daemon.device().ImportArena(std::move(*handle))
                  : absl::StatusOr<std::unique_ptr<gpu::Arena>>(handle.status());
  if (!view.ok()) {
    std::fprintf(stderr, "bench-transfer: %s\n", view.status().ToString().c_str());
    return 1;
  }
  if (absl::Status restricted = (*view)->RestrictAccess(); !restricted.ok()) {
    std::fprintf(stderr, "bench-transfer: %s\n", restricted.ToString().c_str());
    return 1;
  }
  std::vector<double> grant_ms, revoke_ms;
  for (int r = 0; r < repeats; ++r) {
    const int64_t t0 = base::MonotonicNowNs();
    absl::Status granted = (*view)->SetAccess(offset, bytes, gpu::Arena::Access::kRead);
    const int64_t t1 = base::MonotonicNowNs();
    absl::Status revoked = (*view)->SetAccess(offset, bytes, gpu::Arena::Access::kNone);
    const int64_t t2 = base::MonotonicNowNs();
    if (!granted.ok() || !revoked.ok()) {
      std::fprintf(stderr, "bench-transfer: %s\n",
                   (!granted.ok() ? granted : revoked).ToString().c_str());
      return 1;
    }
    grant_ms.push_back((t1 - t0) / 1e6);
    revoke_ms.push_back((t2 - t1) / 1e6);
  }
  const double mb = static_cast<double>(bytes) / (1 << 20);
  std::printf(
      "\nper-task arena access (a worker given this region, read-only, then not): grant %.3f ms "
      "(%.1f us/MB), revoke %.3f ms; against the region's copy (20 groups) %.3f ms: %.3fx\n",
      Median(grant_ms), Median(grant_ms) * 1e3 / mb, Median(revoke_ms), copy_ms,
      Median(grant_ms) / copy_ms);
  std::printf("FIG arena-access grant_us_per_mb=%.1f grant_over_copy=%.3f\n",
              Median(grant_ms) * 1e3 / mb, Median(grant_ms) / copy_ms);
  return 0;
}

int Main() {
  auto backend = gpu::ParseBackend(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) {
    std::fprintf(stderr, "bench-transfer: %s\n", backend.status().ToString().c_str());
    return 2;
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const uint32_t layers = absl::GetFlag(FLAGS_layers);
  const uint64_t bytes = absl::GetFlag(FLAGS_model_bytes);
  if (repeats < 1 || layers < 20 || bytes < layers * 4ull) {
    std::fprintf(stderr,
                 "bench-transfer: need --repeats >= 1, --layers >= 20, "
                 "--model_bytes >= 4 per layer\n");
    return 2;
  }
  MemDaemonOptions options;
  options.device.backend = *backend;
  options.device.copy_bandwidth_bytes_per_s = absl::GetFlag(FLAGS_bandwidth_cap);
  options.device.cuda_vmm_arena = absl::GetFlag(FLAGS_cuda_vmm_arena);
  options.arena_bytes = bytes + (64ull << 20);
  auto daemon = MemDaemon::Create(options);
  if (!daemon.ok()) {
    std::fprintf(stderr, "bench-transfer: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  auto synthetic = MakeSyntheticModel("resnet152-sized", layers, bytes, 1);
  auto stored = (*daemon)->weights().Register(synthetic->model);
  auto region = (*daemon)->leases().Acquire("bench", bytes + (1 << 20));
  if (!stored.ok() || !region.ok()) {
    std::fprintf(stderr, "bench-transfer: %s\n",
                 (!stored.ok() ? stored.status() : region.status()).ToString().c_str());
    return 1;
  }
  const StoredModel& model = **stored;
  const uint64_t offset = region->offset;

  // Baseline: one plain copy of the same bytes into the same (already touched) memory.
  std::vector<double> memcpy_ms;
  for (int r = 0; r < repeats + 1; ++r) {
    int64_t t0 = base::MonotonicNowNs();
    absl::Status copied = (*daemon)->arena().CopyFromHost(
        offset, std::span<const std::byte>(model.host_bytes(), model.total_bytes()));
    if (!copied.ok()) {
      std::fprintf(stderr, "bench-transfer: %s\n", copied.ToString().c_str());
      return 1;
    }
    if (r > 0) memcpy_ms.push_back((base::MonotonicNowNs() - t0) / 1e6);  // r = 0 warms pages
  }
  const double baseline_ms = Median(memcpy_ms);

  struct Plan {
    std::string name;
    grouping::GroupPlan groups;
  };
  const int n = static_cast<int>(layers);
  std::vector<Plan> plans = {{"single", grouping::SingleGroupPlan(n)},
                             {"per-layer", grouping::PerLayerPlan(n)},
                             {"20 groups", *grouping::EveryKPlan(n, (n + 19) / 20)}};
  std::printf("bench-transfer: %s, model %llu bytes in %u layers, median of %d runs\n",
              (*daemon)->device().description().c_str(),
              static_cast<unsigned long long>(model.total_bytes()), layers, repeats);
  std::printf("baseline memcpy of the same bytes: %.2f ms (%.2f GB/s)\n\n", baseline_ms,
              model.total_bytes() / baseline_ms / 1e6);
  std::printf("%-10s %7s %15s %15s %14s\n", "plan", "groups", "first ready ms", "last ready ms",
              "last/memcpy");
  std::fflush(stdout);
  for (const Plan& plan : plans) {
    std::fprintf(stderr, "  running %s (%zu groups)...\n", plan.name.c_str(), plan.groups.size());
    auto result = RunPlan(**daemon, model, plan.groups, offset, repeats);
    if (!result.ok()) {
      std::fprintf(stderr, "bench-transfer: %s: %s\n", plan.name.c_str(),
                   result.status().ToString().c_str());
      return 1;
    }
    std::printf("%-10s %7zu %15.3f %15.3f %13.2fx\n", plan.name.c_str(), plan.groups.size(),
                result->first_ready_ms, result->last_ready_ms, result->last_ready_ms / baseline_ms);
    std::fflush(stdout);
  }

  // Half precision: every tensor in two bytes instead of four, the transmitter's work halved.
  auto half_synthetic = MakeSyntheticModel("resnet152-sized-half", layers, bytes / 2, 1);
  auto half = (*daemon)->weights().Register(half_synthetic->model);
  if (!half.ok()) {
    std::fprintf(stderr, "bench-transfer: %s\n", half.status().ToString().c_str());
    return 1;
  }
  const grouping::GroupPlan twenty = plans.back().groups;
  std::vector<double> full_ms, half_ms;
  for (int r = 0; r < repeats; ++r) {
    for (auto [stored_model, into] : {std::pair{&model, &full_ms}, std::pair{*half, &half_ms}}) {
      auto result = RunPlan(**daemon, *stored_model, twenty, offset, 1);
      if (!result.ok()) {
        std::fprintf(stderr, "bench-transfer: %s\n", result.status().ToString().c_str());
        return 1;
      }
      into->push_back(result->last_ready_ms);
    }
  }
  std::printf(
      "\nhalf precision (%llu bytes, 20 groups) against float32, alternating: last ready "
      "%.3f ms against %.3f ms, %.2fx\n",
      static_cast<unsigned long long>((*half)->total_bytes()), Median(half_ms), Median(full_ms),
      Median(half_ms) / Median(full_ms));
  return ReportAccess(**daemon, offset, model.total_bytes(), Median(full_ms), repeats);
}

}  // namespace
}  // namespace pswitch::memdaemon

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv,
                                 "Benchmarks pipelined model transmission against memcpy.");
  return pswitch::memdaemon::Main();
}
