// Factories of the zoo's architectures; the registry (models/registry.h) is the public way in.
// Each reads its integer settings from `config` (defaults in registry.cc) and may throw c10::Error;
// the registry catches. Parameter and buffer names follow torchvision / Hugging Face state_dicts.
#ifndef PSWITCH_MODELS_INTERNAL_ARCHITECTURES_H_
#define PSWITCH_MODELS_INTERNAL_ARCHITECTURES_H_

#include <memory>

#include "models/registry.h"
#include "models/zoo_model.h"

namespace pswitch::models::internal {

// torchvision.models.resnet{18,50,152}: config "depth" in {18, 34, 50, 101, 152}.
std::shared_ptr<ZooModel> MakeResNet(const std::string& name, const ModelConfig& config);
// torchvision.models.vgg19 (no batch norm).
std::shared_ptr<ZooModel> MakeVgg19(const std::string& name, const ModelConfig& config);
// torchvision.models.inception_v3 (aux_logits=True, transform_input from config, default 0).
std::shared_ptr<ZooModel> MakeInceptionV3(const std::string& name, const ModelConfig& config);
// transformers.BertForSequenceClassification.
std::shared_ptr<ZooModel> MakeBert(const std::string& name, const ModelConfig& config);
// transformers.GPT2LMHeadModel (lm_head tied to transformer.wte).
std::shared_ptr<ZooModel> MakeGpt2(const std::string& name, const ModelConfig& config);
// Small test models: an MLP on [N, 64] and a CNN on [N, 3, 16, 16].
std::shared_ptr<ZooModel> MakeTinyMlp(const std::string& name, const ModelConfig& config);
std::shared_ptr<ZooModel> MakeTinyCnn(const std::string& name, const ModelConfig& config);

}  // namespace pswitch::models::internal

#endif  // PSWITCH_MODELS_INTERNAL_ARCHITECTURES_H_
