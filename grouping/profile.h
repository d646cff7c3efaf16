// Per-layer profile of a model: the input of the grouping search.
//
// A profile lists the model's layers in execution order with their parameter bytes and
// measured execution times, plus the link's bandwidth and the two per-group overheads of the
// cost model (see grouping/cost_model.h). `profile-model` writes it as JSON:
//
//   {"model": str, "bandwidth_bytes_per_s": num, "transfer_overhead_s": num,
//    "group_sync_overhead_s": num,
//    "layers": [{"name": str, "param_bytes": int, "exec_s": num}, ...]}
//
// Layers with 0 bytes (activations, pooling) and 0 exec time are normal.
#ifndef PSWITCH_GROUPING_PROFILE_H_
#define PSWITCH_GROUPING_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace pswitch::grouping {

// The most layers a profile may have; larger inputs are rejected as malformed.
inline constexpr int kMaxProfileLayers = 100'000;

struct LayerProfile {
  std::string name;
  int64_t param_bytes = 0;
  double exec_s = 0.0;
};

struct Profile {
  std::string model;
  double bandwidth_bytes_per_s = 0.0;
  double transfer_overhead_s = 0.0;
  double group_sync_overhead_s = 0.0;
  std::vector<LayerProfile> layers;
};

// OK when `profile` is usable by the cost model: finite non-negative numbers, positive
// bandwidth, 1..kMaxProfileLayers layers, and totals (bytes, exec time, transmission time)
// that stay finite. Otherwise InvalidArgument naming the field and, for layers, the index and
// name, e.g. "profile 'resnet': layers[37] 'conv2': exec_s must be finite and >= 0, got -1".
absl::Status ValidateProfile(const Profile& profile);

// Parses and validates a profile from JSON text. Never throws: malformed JSON, missing fields
// and wrongly typed fields are InvalidArgument naming the field (and layer index). Unknown
// fields are ignored.
absl::StatusOr<Profile> ParseProfileJson(absl::string_view json_text);

// Reads `path` and parses it with ParseProfileJson. NotFound (or the errno's code) when the
// file cannot be read; the message names the path.
absl::StatusOr<Profile> LoadProfileFile(const std::string& path);

// The JSON form of `profile`, the inverse of ParseProfileJson.
nlohmann::json ProfileToJson(const Profile& profile);

}  // namespace pswitch::grouping

#endif  // PSWITCH_GROUPING_PROFILE_H_
