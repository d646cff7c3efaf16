// The one table of the element types a tensor can have on the wire, with every name each of
// pswitch's interfaces gives them: safetensors' (also pswitch's own messages and the archives'
// facts), KServe v2's (the HTTP port), numpy's (the Python package) and libtorch's scalar type
// (the worker). A dtype added here is added everywhere; a name missing here is refused everywhere.
#ifndef PSWITCH_PROTO_DTYPE_H_
#define PSWITCH_PROTO_DTYPE_H_

#include <array>
#include <cstddef>
#include <optional>

#include "absl/strings/string_view.h"
#include "proto/common_generated.h"

namespace pswitch::proto {

struct DTypeInfo {
  DType wire;
  const char* name;    // safetensors' spelling ("F32")
  const char* kserve;  // KServe v2's datatype ("FP32")
  const char* numpy;   // numpy's dtype name; null where numpy has none (bfloat16)
  size_t bytes;
  // c10::ScalarType's value (libtorch's enum is stable across releases; worker/host_tensors.cc
  // checks each against libtorch at compile time).
  int torch_scalar_type;
  // Taken as a KServe v2 input over HTTP (the others are outputs only there).
  bool kserve_input;
};

inline constexpr std::array<DTypeInfo, 6> kDTypes = {{
    {DType::F32, "F32", "FP32", "float32", 4, /*Float*/ 6, true},
    {DType::F16, "F16", "FP16", "float16", 2, /*Half*/ 5, true},
    {DType::BF16, "BF16", "BF16", nullptr, 2, /*BFloat16*/ 15, true},
    {DType::I64, "I64", "INT64", "int64", 8, /*Long*/ 4, true},
    {DType::I32, "I32", "INT32", "int32", 4, /*Int*/ 3, true},
    {DType::U8, "U8", "UINT8", "uint8", 1, /*Byte*/ 0, true},
}};

// The row of `dtype`; null for a value outside the enum (a hostile message's).
const DTypeInfo* FindDType(DType dtype);
// The row named `name` in safetensors' spelling, KServe's, or numpy's; null when none is.
const DTypeInfo* DTypeByName(absl::string_view name);
const DTypeInfo* DTypeByKserve(absl::string_view kserve);
const DTypeInfo* DTypeByNumpy(absl::string_view numpy);
// The row whose libtorch scalar type is `torch_scalar_type`; null when none is.
const DTypeInfo* DTypeByTorch(int torch_scalar_type);

}  // namespace pswitch::proto

#endif  // PSWITCH_PROTO_DTYPE_H_
