// What a model is built from, and the names of a pswitch.export archive's parts: shared by the
// loader (models/script_model.h) and the controller and worker, which pass archives around
// without needing libtorch's headers.
#ifndef PSWITCH_MODELS_MODEL_SOURCE_H_
#define PSWITCH_MODELS_MODEL_SOURCE_H_

#include <memory>
#include <string>

namespace pswitch::models {

// The extra file holding the layer table (python/pswitch/export.py writes it).
inline constexpr char kLayerTableFile[] = "pswitch/layers.json";
// The extra file holding the loss (a TorchScript archive of forward(output, target) -> loss).
inline constexpr char kLossFile[] = "pswitch/loss.pt";
// A script model's architecture as clients see it (ModelInfo.zoo_model, KServe platform).
inline constexpr char kScriptArchitecture[] = "torchscript";

// A zoo architecture, or an exported archive's bytes.
struct ModelSource {
  std::string zoo_model;                       // used when `archive` is null
  std::shared_ptr<const std::string> archive;  // a pswitch.export archive
  std::string archive_name;                    // for messages: the file it came from
};

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_MODEL_SOURCE_H_
