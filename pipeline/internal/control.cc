#include "pipeline/internal/control.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "base/status.h"

namespace pswitch::pipeline::internal {
namespace {

using nlohmann::json;

absl::StatusOr<json> Parse(absl::string_view text, absl::string_view what) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", what, " control message"));
  }
  return j;
}

absl::StatusOr<int64_t> Int(const json& j, const char* key, absl::string_view what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " control message: missing integer '", key, "'"));
  }
  return it->get<int64_t>();
}

absl::StatusOr<absl::Duration> NonNegativeNanos(const json& j, const char* key,
                                                absl::string_view what) {
  PSWITCH_ASSIGN_OR_RETURN(int64_t ns, Int(j, key, what));
  if (ns < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " control message: negative '", key, "'"));
  }
  return absl::Nanoseconds(ns);
}

int64_t Nanos(absl::Duration d) { return absl::ToInt64Nanoseconds(d); }

json CostJson(const StageCost& cost) {
  return {{"forward_ns", Nanos(cost.forward)}, {"backward_ns", Nanos(cost.backward)}};
}

absl::StatusOr<StageCost> CostFromJson(const json& j, absl::string_view what) {
  StageCost cost;
  PSWITCH_ASSIGN_OR_RETURN(cost.forward, NonNegativeNanos(j, "forward_ns", what));
  PSWITCH_ASSIGN_OR_RETURN(cost.backward, NonNegativeNanos(j, "backward_ns", what));
  return cost;
}

}  // namespace

std::string EncodeCost(const StageCost& cost) { return CostJson(cost).dump(); }

absl::StatusOr<StageCost> DecodeCost(absl::string_view text) {
  PSWITCH_ASSIGN_OR_RETURN(json j, Parse(text, "ready"));
  return CostFromJson(j, "ready");
}

std::string EncodePlan(const std::vector<StageCost>& costs) {
  json stages = json::array();
  for (const StageCost& cost : costs) stages.push_back(CostJson(cost));
  return json{{"stages", stages}}.dump();
}

absl::StatusOr<std::vector<StageCost>> DecodePlan(absl::string_view text, int stages) {
  PSWITCH_ASSIGN_OR_RETURN(json j, Parse(text, "plan"));
  auto it = j.find("stages");
  if (it == j.end() || !it->is_array() || static_cast<int>(it->size()) != stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan control message: expected costs of ", stages, " stages"));
  }
  std::vector<StageCost> costs;
  for (const json& stage : *it) {
    if (!stage.is_object()) return absl::InvalidArgumentError("plan control message: bad entry");
    PSWITCH_ASSIGN_OR_RETURN(StageCost cost, CostFromJson(stage, "plan"));
    costs.push_back(cost);
  }
  return costs;
}

std::string EncodeStart(absl::Time start) {
  return json{{"start_unix_ns", absl::ToUnixNanos(start)}}.dump();
}

absl::StatusOr<absl::Time> DecodeStart(absl::string_view text) {
  PSWITCH_ASSIGN_OR_RETURN(json j, Parse(text, "start"));
  PSWITCH_ASSIGN_OR_RETURN(int64_t ns, Int(j, "start_unix_ns", "start"));
  return absl::FromUnixNanos(ns);
}

std::string EncodeStats(const StageIterationStats& s) {
  json waits = json::array();
  for (const MeasuredWait& w : s.waits) {
    waits.push_back({{"before_op", w.before_op},
                     {"start_ns", Nanos(w.start)},
                     {"duration_ns", Nanos(w.duration)},
                     {"expected_ns", Nanos(w.expected)}});
  }
  json j = {{"stage", s.stage},
            {"finish_ns", Nanos(s.finish)},
            {"forward_ns", Nanos(s.forward)},
            {"backward_ns", Nanos(s.backward)},
            {"step_ns", Nanos(s.step)},
            {"peak_in_flight", s.peak_in_flight},
            {"waits", waits}};
  // JSON has no NaN; stages without a loss leave it out.
  if (std::isfinite(s.loss)) j["loss"] = s.loss;
  return j.dump();
}

absl::StatusOr<StageIterationStats> DecodeStats(absl::string_view text) {
  constexpr absl::string_view kWhat = "done";
  PSWITCH_ASSIGN_OR_RETURN(json j, Parse(text, kWhat));
  StageIterationStats s;
  PSWITCH_ASSIGN_OR_RETURN(int64_t stage, Int(j, "stage", kWhat));
  PSWITCH_ASSIGN_OR_RETURN(int64_t peak, Int(j, "peak_in_flight", kWhat));
  s.stage = static_cast<int>(stage);
  s.peak_in_flight = static_cast<int>(peak);
  PSWITCH_ASSIGN_OR_RETURN(s.finish, NonNegativeNanos(j, "finish_ns", kWhat));
  PSWITCH_ASSIGN_OR_RETURN(s.forward, NonNegativeNanos(j, "forward_ns", kWhat));
  PSWITCH_ASSIGN_OR_RETURN(s.backward, NonNegativeNanos(j, "backward_ns", kWhat));
  PSWITCH_ASSIGN_OR_RETURN(s.step, NonNegativeNanos(j, "step_ns", kWhat));
  s.loss = std::numeric_limits<double>::quiet_NaN();
  if (auto loss = j.find("loss"); loss != j.end()) {
    if (!loss->is_number()) return absl::InvalidArgumentError("done control message: bad loss");
    s.loss = loss->get<double>();
  }
  auto waits = j.find("waits");
  if (waits == j.end() || !waits->is_array()) {
    return absl::InvalidArgumentError("done control message: missing 'waits'");
  }
  for (const json& w : *waits) {
    if (!w.is_object()) return absl::InvalidArgumentError("done control message: bad wait");
    MeasuredWait m;
    PSWITCH_ASSIGN_OR_RETURN(int64_t before, Int(w, "before_op", kWhat));
    m.before_op = static_cast<int>(before);
    PSWITCH_ASSIGN_OR_RETURN(m.start, NonNegativeNanos(w, "start_ns", kWhat));
    PSWITCH_ASSIGN_OR_RETURN(m.duration, NonNegativeNanos(w, "duration_ns", kWhat));
    PSWITCH_ASSIGN_OR_RETURN(m.expected, NonNegativeNanos(w, "expected_ns", kWhat));
    s.waits.push_back(m);
  }
  return s;
}

std::string EncodeError(const absl::Status& status) {
  return json{{"code", static_cast<int>(status.code())}, {"message", std::string(status.message())}}
      .dump();
}

absl::Status DecodeError(absl::string_view text) {
  absl::StatusOr<json> j = Parse(text, "error");
  if (!j.ok()) return absl::InternalError("stage sent an unreadable error report");
  auto code = j->find("code");
  auto message = j->find("message");
  if (code == j->end() || !code->is_number_integer() || message == j->end() ||
      !message->is_string()) {
    return absl::InternalError("stage sent an unreadable error report");
  }
  const int value = code->get<int>();
  absl::StatusCode status_code =
      value > 0 && value <= 16 ? static_cast<absl::StatusCode>(value) : absl::StatusCode::kInternal;
  return absl::Status(status_code, message->get<std::string>());
}

}  // namespace pswitch::pipeline::internal
