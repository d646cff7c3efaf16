// The model registry: name -> factory + default configuration, so `--model resnet152` means the
// same model in every tool, the worker and the memdaemon.
#ifndef PSWITCH_MODELS_REGISTRY_H_
#define PSWITCH_MODELS_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pswitch::models {

class ZooModel;

// Integer settings of an architecture ("n_layer", "num_classes", "image_size", ...).
struct ModelConfig {
  std::map<std::string, int64_t> values;

  // The value of `key`; the registry guarantees every key a factory reads is present.
  int64_t Get(const std::string& key) const { return values.at(key); }
};

struct ModelSpec {
  std::string name;
  std::string description;
  ModelConfig defaults;
  std::function<std::shared_ptr<ZooModel>(const std::string& name, const ModelConfig&)> factory;
};

// All registered models, in a fixed order.
const std::vector<ModelSpec>& ModelSpecs();
std::vector<std::string> ModelNames();

// Builds `name` with its defaults overridden by `overrides` (unknown keys are errors) and random
// weights drawn from `seed` (torchvision / Hugging Face initialisation schemes). The model is in
// eval mode on the CPU. NotFound for an unknown name; the message lists the known ones.
absl::StatusOr<std::shared_ptr<ZooModel>> CreateModel(absl::string_view name,
                                                      const ModelConfig& overrides = {},
                                                      uint64_t seed = 0);

// Parses "n_layer=12,n_embd=768" into overrides.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view text);

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_REGISTRY_H_
