// fuzz_bubble_cycle: a client's RegisterBubbleCycle JSON (fill::ParseBubbleCycleJson), which
// pswitchd parses on its network thread.
//
// A cycle that parses is valid (ValidateBubbleCycle) and survives a round trip through
// BubbleCycleToJson unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "fill/bubble_cycle.h"
#include "fuzz/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pswitch;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<fill::BubbleCycle> cycle = fill::ParseBubbleCycleJson(text);
  if (!cycle.ok()) return 0;
  PSWITCH_FUZZ_CHECK(fill::ValidateBubbleCycle(*cycle).ok(), "a parsed cycle is not valid");
  const std::string again_text = fill::BubbleCycleToJson(*cycle).dump();
  absl::StatusOr<fill::BubbleCycle> again = fill::ParseBubbleCycleJson(again_text);
  PSWITCH_FUZZ_CHECK(again.ok(), "a cycle's own JSON does not parse: " + again.status().ToString());
  PSWITCH_FUZZ_CHECK(*again == *cycle, "a cycle changed in a round trip: " + again_text);
  return 0;
}
