// safetensors reader and writer (https://github.com/huggingface/safetensors format).
//
// A file is: 8-byte little-endian header length N, N bytes of JSON header, then the data
// section. The header maps tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section) plus an optional "__metadata__" string map.
//
// This module has no libtorch dependency on purpose: the memdaemon reads weights into pinned
// memory without building models. The reader is strict, like the reference implementation: every
// byte of the data section belongs to exactly one tensor (no overlap, no holes), byte sizes match
// dtype x shape, and the header and file sizes are bounded so a hostile file cannot make us
// allocate or parse without limit. Every error names the file and, where there is one, the key.
#ifndef PSWITCH_MODELS_SAFETENSORS_H_
#define PSWITCH_MODELS_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pswitch::models {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32" etc. as spelled in safetensors headers.
absl::string_view DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(absl::string_view name);
size_t DTypeBytes(DType dtype);
bool IsFloatingPoint(DType dtype);

struct SafetensorsLimits {
  // The reference implementation refuses headers over 100 MB; so do we.
  uint64_t max_header_bytes = 100ull << 20;
  uint64_t max_file_bytes = 64ull << 30;
  size_t max_tensors = 1 << 20;
  size_t max_rank = 16;
};

// One tensor of a parsed file. `data` points into the owning SafetensorsFile.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t bytes = 0;

  // The product of the dims (0 when one is 0); cannot overflow for a tensor Parse returned.
  int64_t NumElements() const;
};

// A parsed, validated safetensors file held in memory. Movable, not copyable (tensors point into
// the owned buffer). Thread-compatible: const methods may be called concurrently.
class SafetensorsFile {
 public:
  // Parses `bytes` (the whole file). `origin` names the source in error messages.
  static absl::StatusOr<SafetensorsFile> Parse(std::string bytes, absl::string_view origin,
                                               const SafetensorsLimits& limits = {});
  // The same for `bytes` that `owner` keeps valid (a mapping of the file: no copy of it).
  static absl::StatusOr<SafetensorsFile> ParseShared(std::shared_ptr<const void> owner,
                                                     absl::string_view bytes,
                                                     absl::string_view origin,
                                                     const SafetensorsLimits& limits = {});
  // Reads and parses the file at `path`.
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path,
                                              const SafetensorsLimits& limits = {});

  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Tensors in data-offset order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // nullptr when absent.
  const SafetensorsTensor* Find(absl::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& origin() const { return origin_; }

 private:
  SafetensorsFile() = default;

  std::string origin_;
  std::shared_ptr<const void> owner_;  // keeps the bytes the tensors point into
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write; `data` is borrowed and must stay live during the write call.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// Serialises `entries` in the given order (the data section keeps that order, so a file written in
// execution order can be streamed layer by layer). The header is space-padded to a multiple of 8
// bytes so every tensor starts 8-byte aligned. Errors on duplicate names or size mismatches.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata = {});

// The same file written to `fd` as it is made, tensor by tensor from where they lie (no copy of
// the whole file in memory); `what` names `fd` in errors.
absl::Status WriteSafetensorsTo(int fd, const std::vector<SafetensorsEntry>& entries,
                                const std::map<std::string, std::string>& metadata,
                                absl::string_view what);

// SerializeSafetensors, written to `path` through a fresh temporary file and rename (replacing
// `path`: for local tools; files pswitchd writes for clients go through base::ConfinedDir).
absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_SAFETENSORS_H_
