// fuzz_safetensors: a weights file as the memdaemon and the model loaders read it
// (models::SafetensorsFile::Parse: 8-byte header length, JSON header, data section).
//
// A file that parses is read whole (every tensor's shape, element count and bytes, the
// metadata), and must survive a round trip: SerializeSafetensors of what was parsed parses back
// to the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/check.h"
#include "models/safetensors.h"

namespace pswitch::fuzz {
namespace {

void ReadFile(const models::SafetensorsFile& file) {
  ReadSink sink;
  for (const models::SafetensorsTensor& tensor : file.tensors()) {
    sink.Text(tensor.name);
    sink.Text(std::string(models::DTypeName(tensor.dtype)));
    sink.Value(models::IsFloatingPoint(tensor.dtype));
    sink.Bytes(tensor.shape.data(), tensor.shape.size() * sizeof(int64_t));
    sink.Value(tensor.NumElements());
    sink.Bytes(tensor.data, tensor.bytes);
    PSWITCH_FUZZ_CHECK(file.Find(tensor.name) == &tensor, "Find() misses tensor " + tensor.name);
  }
  for (const auto& [key, value] : file.metadata()) {
    sink.Text(key);
    sink.Text(value);
  }
}

bool SameTensor(const models::SafetensorsTensor& a, const models::SafetensorsTensor& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.bytes == b.bytes &&
         (a.bytes == 0 || std::memcmp(a.data, b.data, a.bytes) == 0);
}

void CheckRoundTrip(const models::SafetensorsFile& file) {
  std::vector<models::SafetensorsEntry> entries;
  bool empty_name = false;
  for (const models::SafetensorsTensor& tensor : file.tensors()) {
    entries.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.data, tensor.bytes});
    empty_name |= tensor.name.empty();
  }
  absl::StatusOr<std::string> bytes = models::SerializeSafetensors(entries, file.metadata());
  if (!bytes.ok()) {
    // The writer refuses an empty tensor name, which the reader (like the reference) accepts.
    PSWITCH_FUZZ_CHECK(empty_name,
                       "a parsed file does not serialize: " + bytes.status().ToString());
    return;
  }
  absl::StatusOr<models::SafetensorsFile> again =
      models::SafetensorsFile::Parse(*std::move(bytes), "round trip");
  PSWITCH_FUZZ_CHECK(again.ok(), "a serialized file does not parse: " + again.status().ToString());
  PSWITCH_FUZZ_CHECK(again->metadata() == file.metadata(), "metadata changed in a round trip");
  PSWITCH_FUZZ_CHECK(again->tensors().size() == file.tensors().size(),
                     "tensor count changed in a round trip");
  for (size_t i = 0; i < file.tensors().size(); ++i) {
    PSWITCH_FUZZ_CHECK(SameTensor(again->tensors()[i], file.tensors()[i]),
                       "tensor " + file.tensors()[i].name + " changed in a round trip");
  }
}

}  // namespace
}  // namespace pswitch::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pswitch;
  absl::StatusOr<models::SafetensorsFile> file = models::SafetensorsFile::Parse(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors");
  if (!file.ok()) return 0;
  fuzz::ReadFile(*file);
  fuzz::CheckRoundTrip(*file);
  return 0;
}
