// Per-layer profile of a zoo model: what the grouping search (grouping/) needs to plan pipelined
// transmission. Layer times come from the gate hook: the device is synchronised at every layer
// boundary and exec_s[i] = start(i + 1) - start(i), so functional glue between two leaf layers
// (residual adds, concatenations, pooling in Inception branches) is charged to the layer before
// it and the per-layer times add up to the whole forward pass.
#ifndef PSWITCH_MODELS_LAYER_PROFILER_H_
#define PSWITCH_MODELS_LAYER_PROFILER_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grouping/profile.h"
#include "models/zoo_model.h"
#include "nlohmann/json.hpp"

namespace pswitch::models {

// "cpu" or "cuda[:N]". FailedPrecondition when CUDA is asked for but this libtorch has none.
absl::StatusOr<c10::Device> ResolveDevice(absl::string_view name);

struct ProfileOptions {
  int64_t batch = 1;
  bool training = false;
  int warmup_runs = 2;
  int measured_runs = 10;
  // Host backend: no device link to measure, so transfers are modelled at this rate (PCIe 3 x16).
  double bandwidth_cap_bytes_per_s = 12e9;
  // CUDA: the link bandwidth already measured by the caller (pswitchd measures its own copy path
  // once at start-up); 0 = measure a pinned 256 MiB copy here.
  double measured_bandwidth_bytes_per_s = 0;
  uint64_t seed = 0;
  // Called with one line of progress per run; may be empty.
  std::function<void(const std::string&)> progress;
  // Called after each run with the runs done and in all (warm-ups included); may be empty.
  std::function<void(int done, int total)> on_run;
};

// The grouping search's own profile (model, link, overheads, executed layers in execution
// order), which the search takes as it is, plus how it was measured.
struct ModelProfile : grouping::Profile {
  std::string device;
  std::string mode;  // "inference" | "training"
  int64_t batch = 0;
  std::string bandwidth_source;  // "measured" or why it is a configured cap
  // Training only: backward + optimizer step, already included in the last layer's exec_s.
  double backward_s = 0;
  // Never run in this mode; not transmitted (exec_s unused).
  std::vector<grouping::LayerProfile> unexecuted_layers;
};

// Profiles `model` (already on `device`) with its ExampleInput. Leaves the model in the profiled
// mode; in training mode the SGD steps change its weights. Not thread-safe.
absl::StatusOr<ModelProfile> ProfileModel(ZooModel& model, c10::Device device,
                                          const ProfileOptions& options);

// Returns the CUDA caching allocator's free blocks to the driver (a no-op without a CUDA
// libtorch), so a profile run inside pswitchd keeps no device memory outside the arena.
void ReleaseCachedDeviceMemory();

// grouping::ProfileToJson's form (what find-grouping reads), plus how it was measured.
nlohmann::json ProfileToJson(const ModelProfile& profile);

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_LAYER_PROFILER_H_
