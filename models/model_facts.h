// What registration needs to know of a model: its layers in layout order with their weights'
// bytes, the optimizer-slot size, whether it trains, and its input and output. For a pswitch.export
// archive these facts are made in a bounded child process (the archive is hostile input, and
// libtorch's loader is not hardened against it) and come back to pswitchd as a safetensors file,
// decoded here as untrusted bytes: pswitchd never loads an archive itself.
//
// No libtorch: the fuzzer links this alone. Making the facts from a model is
// models/model_inspection.h.
#ifndef PSWITCH_MODELS_MODEL_FACTS_H_
#define PSWITCH_MODELS_MODEL_FACTS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/safetensors.h"

namespace pswitch::models {

// A model input or output as clients see it: F32, F16, BF16, I64 or I32; shape[0] is the batch
// (-1).
struct FactsTensorSpec {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

struct FactsTensor {
  std::string name;
  std::span<const std::byte> bytes;  // into ModelFacts::keep_alive
};

struct FactsLayer {
  std::string name;
  bool executed = true;  // false: never runs in eval mode (rides in the plan's last group)
  std::vector<FactsTensor> tensors;
};

struct ModelFacts {
  std::vector<FactsLayer> layers;  // layout (eval) order
  // The layout index of each layer a training forward runs, in its order: with `layers`, what a
  // worker binds and gates a model by (a zoo model without recording a forward pass itself).
  std::vector<uint32_t> train_order;
  uint64_t optimizer_slot_bytes = 0;
  absl::Status trainable;  // why training tasks are refused, or OK
  FactsTensorSpec input, output;
  // An "auto" plan's layer profile, measured in the same process at the registered batch (the
  // profile JSON of grouping/profile.h: untrusted text until parsed), and what measuring it
  // took. Empty and 0 when none was asked for.
  std::string profile_json;
  uint64_t profile_us = 0;
  std::shared_ptr<const void> keep_alive;  // owns the bytes the tensors' spans point into
};

// Where an "auto" plan's layer profile is measured: on the device the workers compute on ("cpu"
// or "cuda:N"), for the link the switch sees (CUDA: measured at start-up; host backend: the
// configured copy cap, or PCIe 3 x16).
struct AutoPlanProfile {
  std::string device = "cpu";
  double bandwidth_bytes_per_s = 12e9;
};

// How far an inspection has come, for a registration's progress ("profiling: run 2 of 4").
// Steps are a closed set: a child's report of one is checked, never shown as the child wrote it.
enum class InspectionStep : uint8_t { kBuild = 1, kCheckpoint, kLayers, kProfile };
struct InspectionProgress {
  InspectionStep step = InspectionStep::kBuild;
  uint32_t done = 0;   // kProfile: runs done
  uint32_t total = 0;  // kProfile: runs in all; 0 for a step without a count
};
// "building the model", "profiling: run 2 of 4".
std::string DescribeInspectionProgress(const InspectionProgress& progress);

// What one inspection of a model being registered is asked. The descriptors are borrowed: an
// inspector reads them (a child inherits them) and never closes them.
struct InspectionRequest {
  std::string name;            // the model's registered name (messages)
  std::string zoo;             // a zoo architecture; empty: the archive in `archive_fd`
  int archive_fd = -1;         // a sealed memory file
  int weights_fd = -1;         // a sealed memory file holding a safetensors checkpoint; -1: none
  std::string weights_name;    // the checkpoint's name in messages
  // A zoo model's precision (models/model_dtype.h: "float16", ...); empty: float32. An archive's
  // is the one it was exported in.
  std::string dtype;
  uint32_t profile_batch = 0;  // > 0: profile at this batch too (ModelFacts::profile_json)
  uint64_t max_facts_bytes = 0;
  // Told as the inspection advances (optional; not sent to a child, whose reports come back to
  // the inspector that asked). On the inspecting thread.
  std::function<void(const InspectionProgress&)> on_progress;
};

// Limits a decoded file is held to (beyond SafetensorsLimits').
struct ModelFactsLimits {
  SafetensorsLimits file;
  size_t max_layers = 1 << 16;
  size_t max_name_bytes = 1024;
  size_t max_message_bytes = 4096;
  size_t max_profile_bytes = 16 << 20;
};

// The facts as a safetensors file: each tensor's bytes as a U8 vector keyed "<layer>/<tensor>" by
// index, everything else as JSON in the metadata entry "pswitch.facts", and a profile as the
// metadata entry "pswitch.profile".
absl::StatusOr<std::string> EncodeModelFacts(const ModelFacts& facts);
// The same written to `fd` as it is made, the weights from where they lie (`what` names `fd`).
absl::Status WriteModelFacts(const ModelFacts& facts, int fd, absl::string_view what);

// Parses and checks untrusted `bytes` (from a child process): InvalidArgument naming `origin` for
// anything malformed, inconsistent or over the limits. The result owns the bytes.
absl::StatusOr<ModelFacts> DecodeModelFacts(std::string bytes, absl::string_view origin,
                                            const ModelFactsLimits& limits = {});
// The same for `bytes` that `owner` keeps valid (a mapping of the child's output: no copy).
absl::StatusOr<ModelFacts> DecodeModelFacts(std::shared_ptr<const void> owner,
                                            absl::string_view bytes, absl::string_view origin,
                                            const ModelFactsLimits& limits = {});

// A refusal as the child reports it (JSON: code and message), and back. DecodeRefusal never
// returns OK: an OK code or malformed text is an Internal error naming `origin`; a message over
// `max_message_bytes` is cut.
std::string EncodeRefusal(const absl::Status& status);
absl::Status DecodeRefusal(absl::string_view text, absl::string_view origin,
                           size_t max_message_bytes = 4096);

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_MODEL_FACTS_H_
