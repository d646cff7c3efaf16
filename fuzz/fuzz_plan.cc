// fuzz_plan: a grouping plan file as pswitchd reads it at registration
// (registry/registration_pipeline.cc ReadPlanFile and MakePlan): base::ParseUntrustedJson, the
// "groups" member through grouping::PlanFromJson, then grouping::ValidatePlan.
//
// ValidatePlan must agree with a plain reading of its promise (a contiguous cover of layers
// 0..n-1 by non-empty groups) for layer counts around the plan's own end, and a plan survives a
// round trip through PlanToJson.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "base/json.h"
#include "fuzz/check.h"
#include "grouping/plan.h"

namespace pswitch::fuzz {
namespace {

bool CoversLayers(const grouping::GroupPlan& plan, int num_layers) {
  if (num_layers <= 0 || plan.empty()) return false;
  int64_t next = 0;
  for (const grouping::LayerGroup& group : plan) {
    if (group.first != next || group.last < group.first) return false;
    next = int64_t{group.last} + 1;
  }
  return next == num_layers;
}

}  // namespace
}  // namespace pswitch::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pswitch;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<nlohmann::json> json = base::ParseUntrustedJson(text, "plan file 'fuzz.json'");
  if (!json.ok()) return 0;
  if (!json->is_object() || !json->contains("groups")) return 0;
  absl::StatusOr<grouping::GroupPlan> plan = grouping::PlanFromJson((*json)["groups"]);
  if (!plan.ok()) return 0;

  const int64_t end = plan->empty() ? 0 : int64_t{plan->back().last} + 1;
  for (int64_t layers :
       {int64_t{-1}, int64_t{0}, int64_t{1}, end - 1, end, end + 1, int64_t{INT_MAX}}) {
    if (layers < INT_MIN || layers > INT_MAX) continue;
    const int n = static_cast<int>(layers);
    PSWITCH_FUZZ_CHECK(grouping::ValidatePlan(*plan, n).ok() == fuzz::CoversLayers(*plan, n),
                       "ValidatePlan disagrees for " + std::to_string(n) + " layers");
  }
  // MakePlan: a plan for the executed layers gets the unexecuted tail as one more group.
  if (end > 0 && end < INT_MAX - 2 && grouping::ValidatePlan(*plan, static_cast<int>(end)).ok()) {
    grouping::GroupPlan covered = *plan;
    covered.push_back({static_cast<int>(end), static_cast<int>(end) + 1});
    PSWITCH_FUZZ_CHECK(grouping::ValidatePlan(covered, static_cast<int>(end) + 2).ok(),
                       "a plan with its tail covered is not valid");
  }

  const nlohmann::json again_json = nlohmann::json::parse(grouping::PlanToJson(*plan).dump());
  absl::StatusOr<grouping::GroupPlan> again = grouping::PlanFromJson(again_json);
  PSWITCH_FUZZ_CHECK(again.ok() && *again == *plan, "a plan changed in a round trip");
  return 0;
}
