// The zoo's architecture names, without libtorch: pswitchd checks a fill job's model name with
// them and never builds a model. models/registry.h builds them (a test keeps the two equal).
#ifndef PSWITCH_MODELS_ZOO_NAMES_H_
#define PSWITCH_MODELS_ZOO_NAMES_H_

#include <array>
#include <string_view>

namespace pswitch::models {

inline constexpr std::array<std::string_view, 10> kZooModelNames = {
    "resnet18",  "resnet50",   "resnet152", "vgg19",    "inception_v3",
    "bert_base", "bert_large", "gpt2",      "tiny_mlp", "tiny_cnn"};

inline bool IsZooModel(std::string_view name) {
  for (std::string_view zoo : kZooModelNames) {
    if (zoo == name) return true;
  }
  return false;
}

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_ZOO_NAMES_H_
