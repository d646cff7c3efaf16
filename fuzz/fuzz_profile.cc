// fuzz_profile: a per-layer profile as find-grouping reads it (grouping::LoadProfileFile's
// grouping::ParseProfileJson), then grouping::CostModel::Create.
//
// A profile that parses is valid (ValidateProfile), survives a round trip through
// ProfileToJson, and yields a cost model whose times are finite wherever the searches ask.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/check.h"
#include "grouping/cost_model.h"
#include "grouping/profile.h"

namespace pswitch::fuzz {
namespace {

bool SameProfile(const grouping::Profile& a, const grouping::Profile& b) {
  if (a.model != b.model || a.bandwidth_bytes_per_s != b.bandwidth_bytes_per_s ||
      a.transfer_overhead_s != b.transfer_overhead_s ||
      a.group_sync_overhead_s != b.group_sync_overhead_s || a.layers.size() != b.layers.size()) {
    return false;
  }
  for (size_t i = 0; i < a.layers.size(); ++i) {
    if (a.layers[i].name != b.layers[i].name ||
        a.layers[i].param_bytes != b.layers[i].param_bytes ||
        a.layers[i].exec_s != b.layers[i].exec_s) {
      return false;
    }
  }
  return true;
}

void UseCostModel(const grouping::CostModel& model) {
  const int n = model.num_layers();
  PSWITCH_FUZZ_CHECK(n >= 1, "a cost model without layers");
  const double all = model.TransmitS(0, n - 1) + model.ExecS(0, n - 1) + model.ArrivalS(n, n);
  PSWITCH_FUZZ_CHECK(std::isfinite(all), "a valid profile gives non-finite times");
  // What the searches call, bounded so a long profile stays fast.
  const int steps = n < 64 ? n : 64;
  for (int s = 0; s < steps; ++s) {
    const int layer = static_cast<int>(int64_t{s} * n / steps);
    const double at = model.ArrivalS(layer, 1);
    ReadSink sink;
    sink.Value(model.TransmitS(layer, n - 1));
    sink.Value(model.ExecS(layer, layer));
    sink.Value(model.LastLayerArrivingBy(layer, at, at + model.TransmitS(layer, n - 1)));
    if (layer > 0) {
      const double bound = model.CompletionLowerBoundS(layer, at, at);
      PSWITCH_FUZZ_CHECK(!std::isnan(bound), "CompletionLowerBoundS is NaN");
    }
  }
}

}  // namespace
}  // namespace pswitch::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pswitch;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<grouping::Profile> profile = grouping::ParseProfileJson(text);
  if (!profile.ok()) return 0;
  PSWITCH_FUZZ_CHECK(grouping::ValidateProfile(*profile).ok(), "a parsed profile is not valid");

  const std::string again_text = grouping::ProfileToJson(*profile).dump();
  absl::StatusOr<grouping::Profile> again = grouping::ParseProfileJson(again_text);
  PSWITCH_FUZZ_CHECK(again.ok(),
                     "a profile's own JSON does not parse: " + again.status().ToString());
  PSWITCH_FUZZ_CHECK(fuzz::SameProfile(*again, *profile), "a profile changed in a round trip");

  absl::StatusOr<grouping::CostModel> model = grouping::CostModel::Create(*profile);
  PSWITCH_FUZZ_CHECK(model.ok(),
                     "CostModel::Create refuses a valid profile: " + model.status().ToString());
  fuzz::UseCostModel(*model);
  return 0;
}
