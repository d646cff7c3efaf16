// The precision a model's parameters are registered, transmitted and served at, without libtorch:
// pswitchd checks a registration's "dtype" with it. A zoo model is built in float32 and converted
// (its checkpoint too); an exported archive's parameters keep the dtype it was exported with.
#ifndef PSWITCH_MODELS_MODEL_DTYPE_H_
#define PSWITCH_MODELS_MODEL_DTYPE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pswitch::models {

enum class ModelDType { kFloat32, kFloat16, kBFloat16 };

inline absl::string_view ModelDTypeName(ModelDType dtype) {
  switch (dtype) {
    case ModelDType::kFloat16:
      return "float16";
    case ModelDType::kBFloat16:
      return "bfloat16";
    case ModelDType::kFloat32:
      break;
  }
  return "float32";
}

// "float32", "float16" or "bfloat16"; InvalidArgument naming the choices otherwise.
inline absl::StatusOr<ModelDType> ParseModelDType(absl::string_view name) {
  for (ModelDType dtype : {ModelDType::kFloat32, ModelDType::kFloat16, ModelDType::kBFloat16}) {
    if (name == ModelDTypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype '", name, "' is not a model precision: float32, float16 or bfloat16"));
}

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_MODEL_DTYPE_H_
