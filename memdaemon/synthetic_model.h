// Synthetic models with a realistic size profile, for pswitchd's embedded default, benchmarks
// and tests when no zoo model is wanted: alternating conv-like layers (weights growing with
// depth, as in ResNets) and small norm layers, with deterministic byte contents.
#ifndef PSWITCH_MEMDAEMON_SYNTHETIC_MODEL_H_
#define PSWITCH_MEMDAEMON_SYNTHETIC_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memdaemon/weight_store.h"

namespace pswitch::memdaemon {

// Owns the bytes that `model` points into.
struct SyntheticModel {
  std::vector<std::vector<std::byte>> storage;
  ModelBytes model;
};

// `num_layers` layers totalling about `total_bytes` (each tensor a multiple of 4 bytes); the
// content of every tensor depends on (`seed`, tensor index) only.
std::unique_ptr<SyntheticModel> MakeSyntheticModel(const std::string& name, uint32_t num_layers,
                                                   uint64_t total_bytes, uint32_t seed);

// ResNet-152 as PipeSwitch groups it: about 360 parameterised layers, 241 MB of fp32.
inline constexpr uint32_t kResNet152Layers = 360;
inline constexpr uint64_t kResNet152Bytes = 241'376'928;

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_SYNTHETIC_MODEL_H_
