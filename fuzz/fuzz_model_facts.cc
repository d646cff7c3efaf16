// fuzz_model_facts: a model's registration facts as an archive's checking child writes them
// (models::DecodeModelFacts), and its refusal (models::DecodeRefusal): pswitchd reads both from a
// process that has run a hostile archive's code.
//
// Facts that decode are read whole and must survive a round trip (EncodeModelFacts of what was
// decoded decodes to the same facts); a refusal never decodes as OK.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz/check.h"
#include "models/model_facts.h"

namespace pswitch::fuzz {
namespace {

bool SameFacts(const models::ModelFacts& a, const models::ModelFacts& b) {
  if (a.layers.size() != b.layers.size() || a.optimizer_slot_bytes != b.optimizer_slot_bytes ||
      a.trainable != b.trainable || a.input.dtype != b.input.dtype ||
      a.input.shape != b.input.shape || a.output.dtype != b.output.dtype ||
      a.output.shape != b.output.shape) {
    return false;
  }
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const models::FactsLayer &x = a.layers[l], &y = b.layers[l];
    if (x.name != y.name || x.executed != y.executed || x.tensors.size() != y.tensors.size()) {
      return false;
    }
    for (size_t t = 0; t < x.tensors.size(); ++t) {
      const auto &p = x.tensors[t], &q = y.tensors[t];
      if (p.name != q.name || p.bytes.size() != q.bytes.size() ||
          (!p.bytes.empty() && std::memcmp(p.bytes.data(), q.bytes.data(), p.bytes.size()) != 0)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace
}  // namespace pswitch::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pswitch;
  const std::string input(reinterpret_cast<const char*>(data), size);
  PSWITCH_FUZZ_CHECK(!models::DecodeRefusal(input, "fuzz").ok(), "a refusal decoded as OK");
  absl::StatusOr<models::ModelFacts> facts = models::DecodeModelFacts(input, "fuzz");
  if (!facts.ok()) return 0;
  absl::StatusOr<std::string> encoded = models::EncodeModelFacts(*facts);
  PSWITCH_FUZZ_CHECK(encoded.ok(), "decoded facts do not encode: " + encoded.status().ToString());
  absl::StatusOr<models::ModelFacts> again = models::DecodeModelFacts(*std::move(encoded), "again");
  PSWITCH_FUZZ_CHECK(again.ok(), "encoded facts do not decode: " + again.status().ToString());
  PSWITCH_FUZZ_CHECK(fuzz::SameFacts(*facts, *again), "facts changed in a round trip");
  return 0;
}
