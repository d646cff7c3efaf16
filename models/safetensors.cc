#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/json.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "nlohmann/json.hpp"

namespace pswitch::models {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t bytes;
  bool floating;
};

constexpr std::array<DTypeInfo, 10> kDTypes = {{
    {DType::kF64, "F64", 8, true},
    {DType::kF32, "F32", 4, true},
    {DType::kF16, "F16", 2, true},
    {DType::kBF16, "BF16", 2, true},
    {DType::kI64, "I64", 8, false},
    {DType::kI32, "I32", 4, false},
    {DType::kI16, "I16", 2, false},
    {DType::kI8, "I8", 1, false},
    {DType::kU8, "U8", 1, false},
    {DType::kBool, "BOOL", 1, false},
}};

const DTypeInfo& Info(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[1];  // unreachable: every enumerator is in the table
}

constexpr char kMetadataKey[] = "__metadata__";

// numel * element size with overflow detection; nullopt-like false on overflow.
bool CheckedByteSize(const std::vector<int64_t>& shape, size_t element_bytes, uint64_t* bytes) {
  uint64_t total = element_bytes;
  for (int64_t dim : shape) {
    if (dim < 0) return false;
    if (dim != 0 && total > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      return false;
    }
    total *= static_cast<uint64_t>(dim);
  }
  *bytes = total;
  return true;
}

absl::StatusOr<SafetensorsTensor> ParseEntry(const std::string& name, const nlohmann::json& entry,
                                             uint64_t data_bytes, const SafetensorsLimits& limits,
                                             uint64_t* begin_out, uint64_t* end_out) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", why));
  };
  if (!entry.is_object()) return bad("header entry is not an object");
  for (const auto& [field, unused] : entry.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      return bad(absl::StrCat("unknown field '", field, "'"));
    }
  }
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) return bad("missing string 'dtype'");
  auto dtype = ParseDType(dtype_it->get<std::string>());
  if (!dtype.ok()) return bad(dtype.status().message());

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) return bad("missing array 'shape'");
  if (shape_it->size() > limits.max_rank) {
    return bad(absl::StrCat("rank ", shape_it->size(), " exceeds limit ", limits.max_rank));
  }
  SafetensorsTensor tensor;
  tensor.name = name;
  tensor.dtype = *dtype;
  for (const auto& dim : *shape_it) {
    if (!dim.is_number_unsigned() ||
        dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return bad(absl::StrCat("shape entry of type ", dim.type_name(),
                              " is not a non-negative integer"));
    }
    tensor.shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return bad("'data_offsets' must be two non-negative integers");
  }
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end) return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] decrease"));
  if (end > data_bytes) {
    return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] exceed the data section of ",
                            data_bytes, " bytes (truncated file?)"));
  }
  uint64_t expected = 0;
  if (!CheckedByteSize(tensor.shape, DTypeBytes(*dtype), &expected)) {
    return bad("shape byte size overflows");
  }
  if (expected != end - begin) {
    return bad(absl::StrCat("dtype ", DTypeName(*dtype), " and shape [",
                            absl::StrJoin(tensor.shape, ", "), "] need ", expected,
                            " bytes but data_offsets span ", end - begin));
  }
  tensor.bytes = static_cast<size_t>(end - begin);
  *begin_out = begin;
  *end_out = end;
  return tensor;
}

}  // namespace

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const auto& info : kDTypes) {
    if (name == info.name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype '", name, "'"));
}

size_t DTypeBytes(DType dtype) { return Info(dtype).bytes; }
bool IsFloatingPoint(DType dtype) { return Info(dtype).floating; }

int64_t SafetensorsTensor::NumElements() const {
  // Parse bounds the product of the dims only through the byte count, which a zero dim makes 0
  // whatever the others are: [2^32, 2^31, 0] is a valid empty tensor whose first two dims
  // overflow an int64_t. Without a zero, dims x element size == bytes, which fits.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes, absl::string_view origin,
                                                       const SafetensorsLimits& limits) {
  auto owner = std::make_shared<const std::string>(std::move(bytes));
  const absl::string_view view(*owner);
  return ParseShared(std::move(owner), view, origin, limits);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::ParseShared(std::shared_ptr<const void> owner,
                                                             absl::string_view bytes,
                                                             absl::string_view origin,
                                                             const SafetensorsLimits& limits) {
  auto bad = [&](const absl::Status& status) {
    return absl::Status(status.code(),
                        absl::StrCat("safetensors '", origin, "': ", status.message()));
  };
  auto invalid = [&](absl::string_view why) { return bad(absl::InvalidArgumentError(why)); };
  if (bytes.size() > limits.max_file_bytes) {
    return invalid(absl::StrCat("file of ", bytes.size(), " bytes exceeds the limit of ",
                                limits.max_file_bytes));
  }
  if (bytes.size() < 8) {
    return invalid(absl::StrCat("file of ", bytes.size(),
                                " bytes is shorter than the 8-byte "
                                "header length (truncated file?)"));
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<uint8_t>(bytes[i]);
  }
  if (header_bytes > limits.max_header_bytes) {
    // The length is the file's first 8 bytes: not echoed (no error reveals file content).
    return invalid(absl::StrCat("header length exceeds the limit of ", limits.max_header_bytes,
                                " bytes (not a safetensors file?)"));
  }
  if (header_bytes > bytes.size() - 8) {
    return invalid(absl::StrCat("header length exceeds the ", bytes.size() - 8,
                                " bytes after it (truncated file?)"));
  }
  const uint64_t data_begin = 8 + header_bytes;
  const uint64_t data_bytes = bytes.size() - data_begin;

  absl::StatusOr<nlohmann::json> parsed =
      base::ParseUntrustedJson(bytes.substr(8, header_bytes), "header");
  if (!parsed.ok()) return invalid(parsed.status().message());
  nlohmann::json header = std::move(*parsed);
  if (!header.is_object()) return invalid("header is not a JSON object");
  if (header.size() > limits.max_tensors + 1) {
    return invalid(absl::StrCat("header lists ", header.size(), " entries, over the limit of ",
                                limits.max_tensors));
  }

  SafetensorsFile file;
  file.origin_ = std::string(origin);
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) return invalid("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return invalid(absl::StrCat("__metadata__ value of '", key, "' is not a string"));
        }
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    uint64_t begin = 0, end = 0;
    auto tensor = ParseEntry(name, entry, data_bytes, limits, &begin, &end);
    if (!tensor.ok()) return bad(tensor.status());
    spans.push_back({begin, end, file.tensors_.size()});
    file.tensors_.push_back(*std::move(tensor));
  }

  // Every data byte must belong to exactly one tensor: sort by offset, then check contiguity.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected_begin = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& span = spans[i];
    if (span.begin < expected_begin) {
      return invalid(absl::StrCat("tensor '", file.tensors_[span.index].name, "' overlaps tensor '",
                                  file.tensors_[spans[i - 1].index].name, "' (data_offsets [",
                                  span.begin, ", ", span.end, "])"));
    }
    if (span.begin > expected_begin) {
      return invalid(absl::StrCat("data bytes [", expected_begin, ", ", span.begin,
                                  ") before tensor '", file.tensors_[span.index].name,
                                  "' belong to no tensor"));
    }
    expected_begin = span.end;
  }
  if (expected_begin != data_bytes) {
    return invalid(absl::StrCat("data section has ", data_bytes, " bytes but tensors cover ",
                                expected_begin, " (trailing bytes belong to no tensor)"));
  }

  file.owner_ = std::move(owner);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data()) + data_begin;
  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(spans.size());
  for (const Span& span : spans) {
    SafetensorsTensor tensor = std::move(file.tensors_[span.index]);
    tensor.data = data + span.begin;
    ordered.push_back(std::move(tensor));
  }
  file.tensors_ = std::move(ordered);
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path,
                                                      const SafetensorsLimits& limits) {
  const std::string what = absl::StrCat("safetensors '", path, "'");
  PSWITCH_ASSIGN_OR_RETURN(std::string bytes,
                           base::ReadRegularFile(path, what, limits.max_file_bytes));
  return Parse(std::move(bytes), path, limits);
}

const SafetensorsTensor* SafetensorsFile::Find(absl::string_view name) const {
  for (const auto& tensor : tensors_) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

namespace {

// The file's first part: the header's length (8 bytes, little-endian) and the header, padded
// with spaces to a multiple of 8 bytes so every tensor starts 8-byte aligned.
absl::StatusOr<std::string> SafetensorsPrefix(const std::vector<SafetensorsEntry>& entries,
                                              const std::map<std::string, std::string>& metadata) {
  // nlohmann's ordered_json keeps insertion order, so the header lists tensors in file order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& entry : entries) {
    if (entry.name == kMetadataKey || entry.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("invalid tensor name '", entry.name, "'"));
    }
    if (!names.insert(entry.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name '", entry.name, "'"));
    }
    uint64_t expected = 0;
    if (!CheckedByteSize(entry.shape, DTypeBytes(entry.dtype), &expected) ||
        expected != entry.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", entry.name, "': ", entry.bytes, " bytes do not match dtype ",
          DTypeName(entry.dtype), " and shape [", absl::StrJoin(entry.shape, ", "), "]"));
    }
    header[entry.name] = {{"dtype", std::string(DTypeName(entry.dtype))},
                          {"shape", entry.shape},
                          {"data_offsets", {offset, offset + entry.bytes}}};
    offset += entry.bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json.size());
  const uint64_t header_bytes = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header_bytes >> (8 * i)) & 0xff));
  out += json;
  return out;
}

absl::Status WriteAll(int fd, const void* data, size_t bytes, absl::string_view what) {
  const char* from = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, from, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(absl::StrCat("write ", what));
    from += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata) {
  PSWITCH_ASSIGN_OR_RETURN(std::string out, SafetensorsPrefix(entries, metadata));
  size_t data_bytes = 0;
  for (const auto& entry : entries) data_bytes += entry.bytes;
  out.reserve(out.size() + data_bytes);
  for (const auto& entry : entries) {
    out.append(static_cast<const char*>(entry.data), entry.bytes);
  }
  return out;
}

absl::Status WriteSafetensorsTo(int fd, const std::vector<SafetensorsEntry>& entries,
                                const std::map<std::string, std::string>& metadata,
                                absl::string_view what) {
  PSWITCH_ASSIGN_OR_RETURN(std::string prefix, SafetensorsPrefix(entries, metadata));
  PSWITCH_RETURN_IF_ERROR(WriteAll(fd, prefix.data(), prefix.size(), what));
  for (const auto& entry : entries) {
    PSWITCH_RETURN_IF_ERROR(WriteAll(fd, entry.data, entry.bytes, what));
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                              const std::map<std::string, std::string>& metadata) {
  // A fresh temporary that no one else can have planted (O_EXCL, no symlink followed). This is
  // the local tools' writer, replacing `path` as asked; what pswitchd writes for clients goes
  // through base::ConfinedDir, which never replaces a file.
  std::random_device random;
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", random());
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoStatus(absl::StrCat("create '", tmp, "'"));
    if (absl::Status written =
            WriteSafetensorsTo(fd.get(), entries, metadata, absl::StrCat("'", tmp, "'"));
        !written.ok()) {
      ::unlink(tmp.c_str());
      return written;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status status = ErrnoStatus(absl::StrCat("rename '", tmp, "' to '", path, "'"));
    ::unlink(tmp.c_str());
    return status;
  }
  return absl::OkStatus();
}

}  // namespace pswitch::models
