#include "proto/dtype.h"

#include <cstring>

namespace pswitch::proto {
namespace {

template <typename Match>
const DTypeInfo* FindRow(Match match) {
  for (const DTypeInfo& info : kDTypes) {
    if (match(info)) return &info;
  }
  return nullptr;
}

bool Same(const char* a, absl::string_view b) { return a != nullptr && absl::string_view(a) == b; }

}  // namespace

const DTypeInfo* FindDType(DType dtype) {
  return FindRow([dtype](const DTypeInfo& i) { return i.wire == dtype; });
}
const DTypeInfo* DTypeByName(absl::string_view name) {
  return FindRow([name](const DTypeInfo& i) { return Same(i.name, name); });
}
const DTypeInfo* DTypeByKserve(absl::string_view kserve) {
  return FindRow([kserve](const DTypeInfo& i) { return Same(i.kserve, kserve); });
}
const DTypeInfo* DTypeByNumpy(absl::string_view numpy) {
  return FindRow([numpy](const DTypeInfo& i) { return Same(i.numpy, numpy); });
}
const DTypeInfo* DTypeByTorch(int torch_scalar_type) {
  return FindRow(
      [torch_scalar_type](const DTypeInfo& i) { return i.torch_scalar_type == torch_scalar_type; });
}

}  // namespace pswitch::proto
