#include "models/weights.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/zoo_model.h"
#include "base/status.h"

namespace pswitch::models {
namespace {

struct TypePair {
  DType dtype;
  at::ScalarType scalar;
};
constexpr TypePair kTypes[] = {
    {DType::kF64, at::kDouble},    {DType::kF32, at::kFloat}, {DType::kF16, at::kHalf},
    {DType::kBF16, at::kBFloat16}, {DType::kI64, at::kLong},  {DType::kI32, at::kInt},
    {DType::kI16, at::kShort},     {DType::kI8, at::kChar},   {DType::kU8, at::kByte},
    {DType::kBool, at::kBool},
};

at::ScalarType ToScalarType(DType dtype) {
  for (const auto& pair : kTypes) {
    if (pair.dtype == dtype) return pair.scalar;
  }
  return at::kFloat;  // unreachable: the table covers every DType
}

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Summarise(const std::vector<std::string>& keys) {
  const size_t shown = std::min<size_t>(keys.size(), 5);
  std::string out =
      absl::StrJoin(keys.begin(), keys.begin() + shown, ", ",
                    [](std::string* o, const std::string& k) { absl::StrAppend(o, "'", k, "'"); });
  if (keys.size() > shown) absl::StrAppend(&out, " and ", keys.size() - shown, " more");
  return out;
}

}  // namespace

absl::StatusOr<DType> ToDType(at::ScalarType type) {
  for (const auto& pair : kTypes) {
    if (pair.scalar == type) return pair.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("scalar type ", c10::toString(type), " has no safetensors dtype"));
}

absl::StatusOr<at::Tensor> ToTorch(const SafetensorsTensor& tensor) {
  at::Tensor out;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("tensor '", tensor.name, "'"), [&] {
    out = at::empty(tensor.shape, at::TensorOptions().dtype(ToScalarType(tensor.dtype)));
    if (tensor.bytes > 0) std::memcpy(out.data_ptr(), tensor.data, tensor.bytes);
  }));
  return out;
}

absl::StatusOr<NamedTensors> ReadTensors(const std::string& path) {
  PSWITCH_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  NamedTensors out;
  for (const auto& tensor : file.tensors()) {
    PSWITCH_ASSIGN_OR_RETURN(at::Tensor t, ToTorch(tensor));
    out.emplace_back(tensor.name, std::move(t));
  }
  return out;
}

absl::Status WriteTensors(const std::string& path, const NamedTensors& tensors) {
  std::vector<at::Tensor> host;  // keeps the CPU copies alive during the write
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, tensor] : tensors) {
    PSWITCH_ASSIGN_OR_RETURN(DType dtype, ToDType(tensor.scalar_type()));
    PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("tensor '", name, "'"), [&] {
      host.push_back(tensor.detach().to(at::kCPU).contiguous());
    }));
    const at::Tensor& t = host.back();
    entries.push_back({name, dtype, t.sizes().vec(), t.data_ptr(),
                       static_cast<size_t>(t.numel() * t.element_size())});
  }
  return WriteSafetensors(path, entries);
}

absl::StatusOr<NamedTensors> StateDict(ZooModel& model) {
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<Layer>* layers, model.Layers());
  NamedTensors out;
  for (const Layer& layer : *layers) {
    for (const LayerTensor& t : layer.tensors) out.emplace_back(t.name, t.tensor);
  }
  return out;
}

absl::Status LoadWeights(ZooModel& model, const SafetensorsFile& checkpoint) {
  const std::string where =
      absl::StrCat("loading '", checkpoint.origin(), "' into model '", model.model_name(), "'");
  std::map<std::string, at::Tensor> targets;
  for (const auto& p : model.named_parameters()) targets[p.key()] = p.value();
  for (const auto& b : model.named_buffers()) targets[b.key()] = b.value();

  std::vector<std::string> unexpected;
  std::set<std::string> loaded;
  for (const auto& tensor : checkpoint.tensors()) {
    auto it = targets.find(tensor.name);
    if (it == targets.end()) {
      if (!model.IsIgnorableCheckpointKey(tensor.name)) unexpected.push_back(tensor.name);
      continue;
    }
    at::Tensor& target = it->second;
    if (target.sizes() != at::IntArrayRef(tensor.shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": key '", tensor.name, "': checkpoint shape ", ShapeString(tensor.shape),
          " but the model expects ", ShapeString(target.sizes())));
    }
    if (IsFloatingPoint(tensor.dtype) != target.is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": key '", tensor.name, "': checkpoint dtype ", DTypeName(tensor.dtype),
          " but the model holds ", c10::toString(target.scalar_type())));
    }
    PSWITCH_ASSIGN_OR_RETURN(at::Tensor source, ToTorch(tensor));
    PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat(where, ": key '", tensor.name, "'"), [&] {
      torch::NoGradGuard no_grad;
      target.copy_(source);
    }));
    loaded.insert(tensor.name);
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unexpected keys ", Summarise(unexpected)));
  }
  std::vector<std::string> missing;
  for (const auto& [name, unused] : targets) {
    if (!loaded.count(name)) missing.push_back(name);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing keys ", Summarise(missing)));
  }
  return absl::OkStatus();
}

absl::Status LoadWeights(ZooModel& model, const std::string& path) {
  PSWITCH_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  return LoadWeights(model, file);
}

}  // namespace pswitch::models
