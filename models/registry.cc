#include "models/registry.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/internal/architectures.h"
#include "models/zoo_model.h"
#include "base/status.h"

namespace pswitch::models {
namespace {

using internal::MakeBert;
using internal::MakeGpt2;
using internal::MakeInceptionV3;
using internal::MakeResNet;
using internal::MakeTinyCnn;
using internal::MakeTinyMlp;
using internal::MakeVgg19;

ModelConfig Vision(int64_t depth, int64_t image_size) {
  ModelConfig config{{{"num_classes", 1000}, {"image_size", image_size}}};
  if (depth > 0) config.values["depth"] = depth;
  return config;
}

ModelConfig Bert(int64_t hidden, int64_t layers, int64_t heads) {
  return ModelConfig{{{"hidden_size", hidden},
                      {"num_hidden_layers", layers},
                      {"num_attention_heads", heads},
                      {"intermediate_size", 4 * hidden},
                      {"vocab_size", 30522},
                      {"max_position_embeddings", 512},
                      {"type_vocab_size", 2},
                      {"num_labels", 2},
                      {"seq_len", 128}}};
}

std::vector<ModelSpec> BuildSpecs() {
  return {
      {"resnet18", "torchvision ResNet-18", Vision(18, 224), MakeResNet},
      {"resnet50", "torchvision ResNet-50", Vision(50, 224), MakeResNet},
      {"resnet152", "torchvision ResNet-152", Vision(152, 224), MakeResNet},
      {"vgg19", "torchvision VGG-19", Vision(0, 224), MakeVgg19},
      {"inception_v3", "torchvision Inception-v3 (aux head runs in train mode only)",
       ModelConfig{{{"num_classes", 1000}, {"image_size", 299}, {"transform_input", 0}}},
       MakeInceptionV3},
      {"bert_base", "Hugging Face BertForSequenceClassification, BERT-base", Bert(768, 12, 12),
       MakeBert},
      {"bert_large", "Hugging Face BertForSequenceClassification, BERT-large", Bert(1024, 24, 16),
       MakeBert},
      {"gpt2", "Hugging Face GPT2LMHeadModel, configurable depth/width (tiny default)",
       ModelConfig{{{"n_layer", 2},
                    {"n_embd", 64},
                    {"n_head", 4},
                    {"vocab_size", 512},
                    {"n_positions", 64},
                    {"seq_len", 32}}},
       MakeGpt2},
      {"tiny_mlp", "2-layer MLP on [N, 64] for tests",
       ModelConfig{{{"hidden", 128}, {"num_classes", 10}}}, MakeTinyMlp},
      {"tiny_cnn", "2-conv CNN on [N, 3, 16, 16] for tests", ModelConfig{{{"num_classes", 10}}},
       MakeTinyCnn},
  };
}

}  // namespace

const std::vector<ModelSpec>& ModelSpecs() {
  static const std::vector<ModelSpec>* specs = new std::vector<ModelSpec>(BuildSpecs());
  return *specs;
}

std::vector<std::string> ModelNames() {
  std::vector<std::string> names;
  for (const auto& spec : ModelSpecs()) names.push_back(spec.name);
  return names;
}

absl::StatusOr<std::shared_ptr<ZooModel>> CreateModel(absl::string_view name,
                                                      const ModelConfig& overrides, uint64_t seed) {
  const ModelSpec* spec = nullptr;
  for (const auto& candidate : ModelSpecs()) {
    if (candidate.name == name) spec = &candidate;
  }
  if (spec == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "unknown model '", name, "'; known models: ", absl::StrJoin(ModelNames(), ", ")));
  }
  ModelConfig config = spec->defaults;
  for (const auto& [key, value] : overrides.values) {
    if (!config.values.count(key)) {
      std::vector<std::string> keys;
      for (const auto& [k, unused] : config.values) keys.push_back(k);
      return absl::InvalidArgumentError(absl::StrCat("model '", name, "' has no setting '", key,
                                                     "'; settings: ", absl::StrJoin(keys, ", ")));
    }
    if (value <= 0 && key != "transform_input") {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", name, "': setting '", key, "' must be positive, got ", value));
    }
    config.values[key] = value;
  }
  std::shared_ptr<ZooModel> model;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("model '", name, "': construction"), [&] {
    // Initialisers draw from libtorch's global generator; seeding it makes weights reproducible.
    torch::manual_seed(seed);
    model = spec->factory(spec->name, config);
    model->eval();
  }));
  return model;
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view text) {
  ModelConfig config;
  if (text.empty()) return config;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    int64_t value = 0;
    if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config item '", item, "' is not key=integer"));
    }
    config.values[std::string(kv.first)] = value;
  }
  return config;
}

}  // namespace pswitch::models
