#include "fill/bubble_cycle.h"

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status.h"

namespace pswitch::fill {
namespace {

int64_t Ns(absl::Duration d) { return absl::ToInt64Nanoseconds(d); }

bool IsFinite(absl::Duration d) {
  return d != absl::InfiniteDuration() && d != -absl::InfiniteDuration();
}

absl::Status ValidateBubble(const Bubble& bubble, size_t index, absl::Duration period) {
  const std::string name = absl::StrCat("bubble cycle: bubbles[", index, "]");
  if (!IsFinite(bubble.offset) || bubble.offset < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".offset_ns must be finite and >= 0, got ",
                                                   absl::FormatDuration(bubble.offset)));
  }
  if (!IsFinite(bubble.duration) || bubble.duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".duration_ns must be finite and > 0, got ", absl::FormatDuration(bubble.duration)));
  }
  if (bubble.free_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".free_bytes must be >= 0, got ", bubble.free_bytes));
  }
  if (bubble.end() > period) {
    return absl::InvalidArgumentError(absl::StrCat(name, " ends at ", Ns(bubble.end()),
                                                   " ns, after the period (", Ns(period), ")"));
  }
  return absl::OkStatus();
}

// Reads obj[key] as an int64; `where` names the object in errors ("bubbles[3]").
absl::StatusOr<int64_t> ReadInt(const nlohmann::json& obj, const char* key,
                                absl::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bubble cycle: ", where, " is missing '", key, "'"));
  }
  const bool fits =
      it->is_number_integer() &&
      !(it->is_number_unsigned() &&
        it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat("bubble cycle: ", where, ".", key,
                                                   " must be a 64-bit integer, got ", it->dump()));
  }
  return it->get<int64_t>();
}

// InvalidArgument naming the first key of `obj` outside `allowed`: a misspelt optional field
// would otherwise be silently ignored.
absl::Status RejectUnknownKeys(const nlohmann::json& obj,
                               std::initializer_list<const char*> allowed,
                               absl::string_view where) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const bool known = std::any_of(allowed.begin(), allowed.end(),
                                   [&](const char* key) { return it.key() == key; });
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("bubble cycle: ", where, " has unknown field '", it.key(), "'"));
    }
  }
  return absl::OkStatus();
}

// The lower median, so an even count never reports a value that was not observed.
template <typename T>
T LowerMedian(std::vector<T> values) {
  const size_t mid = (values.size() - 1) / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  return values[mid];
}

}  // namespace

absl::Status ValidateBubbleCycle(const BubbleCycle& cycle) {
  if (!IsFinite(cycle.period) || cycle.period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bubble cycle: period_ns must be finite and > 0, got ",
                     absl::FormatDuration(cycle.period)));
  }
  for (size_t i = 0; i < cycle.bubbles.size(); ++i) {
    const Bubble& bubble = cycle.bubbles[i];
    PSWITCH_RETURN_IF_ERROR(ValidateBubble(bubble, i, cycle.period));
    if (i > 0 && bubble.offset < cycle.bubbles[i - 1].end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("bubble cycle: bubbles[", i, "].offset_ns ", Ns(bubble.offset),
                       " is before the end of bubbles[", i - 1, "] (",
                       Ns(cycle.bubbles[i - 1].end()), "); bubbles must be sorted and disjoint"));
    }
  }
  return absl::OkStatus();
}

nlohmann::ordered_json BubbleCycleToJson(const BubbleCycle& cycle) {
  nlohmann::ordered_json bubbles = nlohmann::ordered_json::array();
  for (const Bubble& bubble : cycle.bubbles) {
    bubbles.push_back({{"offset_ns", Ns(bubble.offset)},
                       {"duration_ns", Ns(bubble.duration)},
                       {"free_bytes", bubble.free_bytes}});
  }
  nlohmann::ordered_json json;
  json["period_ns"] = Ns(cycle.period);
  json["bubbles"] = std::move(bubbles);
  return json;
}

absl::StatusOr<BubbleCycle> BubbleCycleFromJson(const nlohmann::json& json) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bubble cycle: must be a JSON object, got ", json.type_name()));
  }
  PSWITCH_RETURN_IF_ERROR(RejectUnknownKeys(json, {"period_ns", "bubbles"}, "top level"));
  BubbleCycle cycle;
  PSWITCH_ASSIGN_OR_RETURN(const int64_t period_ns, ReadInt(json, "period_ns", "top level"));
  cycle.period = absl::Nanoseconds(period_ns);

  auto bubbles = json.find("bubbles");
  if (bubbles == json.end()) {
    return absl::InvalidArgumentError("bubble cycle: top level is missing 'bubbles'");
  }
  if (!bubbles->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bubble cycle: 'bubbles' must be an array, got ", bubbles->type_name()));
  }
  for (size_t i = 0; i < bubbles->size(); ++i) {
    const nlohmann::json& entry = (*bubbles)[i];
    const std::string where = absl::StrCat("bubbles[", i, "]");
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("bubble cycle: ", where, " must be an object, got ", entry.type_name()));
    }
    PSWITCH_RETURN_IF_ERROR(
        RejectUnknownKeys(entry, {"offset_ns", "duration_ns", "free_bytes"}, where));
    PSWITCH_ASSIGN_OR_RETURN(const int64_t offset_ns, ReadInt(entry, "offset_ns", where));
    PSWITCH_ASSIGN_OR_RETURN(const int64_t duration_ns, ReadInt(entry, "duration_ns", where));
    PSWITCH_ASSIGN_OR_RETURN(const int64_t free_bytes, ReadInt(entry, "free_bytes", where));
    cycle.bubbles.push_back(
        {absl::Nanoseconds(offset_ns), absl::Nanoseconds(duration_ns), free_bytes});
  }
  PSWITCH_RETURN_IF_ERROR(ValidateBubbleCycle(cycle));
  return cycle;
}

absl::StatusOr<BubbleCycle> ParseBubbleCycleJson(absl::string_view text) {
  PSWITCH_ASSIGN_OR_RETURN(nlohmann::json json, base::ParseUntrustedJson(text, "bubble cycle"));
  return BubbleCycleFromJson(json);
}

absl::Status BubbleCycleProfiler::StartIteration(absl::Time start) {
  if (!iterations_.empty()) {
    const Iteration& open = iterations_.back();
    if (start <= open.start) {
      return absl::InvalidArgumentError(
          absl::StrCat("bubble profiler: iteration ", iterations_.size(), " starts at ",
                       absl::FormatTime(start), ", not after iteration ", iterations_.size() - 1,
                       " (", absl::FormatTime(open.start), ")"));
    }
    if (!open.bubbles.empty() &&
        start < open.start + open.bubbles.back().offset + open.bubbles.back().duration) {
      return absl::InvalidArgumentError(
          absl::StrCat("bubble profiler: iteration ", iterations_.size(),
                       " starts inside the last bubble of iteration ", iterations_.size() - 1,
                       "; iteration boundaries must not fall inside a bubble"));
    }
  }
  iterations_.push_back({start, {}});
  return absl::OkStatus();
}

absl::Status BubbleCycleProfiler::RecordBubble(int position, absl::Time begin, absl::Time end,
                                               int64_t free_bytes) {
  if (iterations_.empty()) {
    return absl::FailedPreconditionError(
        "bubble profiler: a bubble was recorded before the first StartIteration");
  }
  Iteration& open = iterations_.back();
  const size_t iteration = iterations_.size() - 1;
  const size_t index = open.bubbles.size();
  const std::string name =
      absl::StrCat("bubble profiler: iteration ", iteration, " bubble ", index);
  if (!(begin < end)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must begin before it ends"));
  }
  if (free_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, " has negative free_bytes ", free_bytes));
  }
  if (begin < open.start) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " begins before its iteration; iteration boundaries must not fall inside a bubble"));
  }
  const absl::Duration offset = begin - open.start;
  if (!open.bubbles.empty() && offset < open.bubbles.back().offset + open.bubbles.back().duration) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " begins before the previous bubble ends"));
  }
  for (const ObservedBubble& seen : open.bubbles) {
    if (seen.position == position) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " repeats schedule position ", position, " in one iteration"));
    }
  }
  open.bubbles.push_back({position, offset, end - begin, free_bytes});
  return absl::OkStatus();
}

int BubbleCycleProfiler::complete_iterations() const {
  return iterations_.empty() ? 0 : static_cast<int>(iterations_.size()) - 1;
}

absl::StatusOr<BubbleCycle> BubbleCycleProfiler::Build() const {
  const int complete = complete_iterations();
  if (complete == 0) {
    return absl::FailedPreconditionError(
        "bubble profiler: no complete iteration (call StartIteration after the last one)");
  }
  std::vector<absl::Duration> periods;
  for (int i = 0; i < complete; ++i) {
    periods.push_back(iterations_[i + 1].start - iterations_[i].start);
  }
  BubbleCycle cycle;
  cycle.period = LowerMedian(periods);
  std::map<int, std::vector<const ObservedBubble*>> by_position;
  for (int i = 0; i < complete; ++i) {
    for (const ObservedBubble& seen : iterations_[i].bubbles) {
      by_position[seen.position].push_back(&seen);
    }
  }
  for (const auto& [position, seen] : by_position) {
    if (2 * seen.size() <= static_cast<size_t>(complete)) continue;  // comes and goes
    std::vector<absl::Duration> offsets;
    std::vector<absl::Duration> durations;
    int64_t free_bytes = std::numeric_limits<int64_t>::max();
    for (const ObservedBubble* b : seen) {
      offsets.push_back(b->offset);
      durations.push_back(b->duration);
      free_bytes = std::min(free_bytes, b->free_bytes);
    }
    cycle.bubbles.push_back({LowerMedian(offsets), LowerMedian(durations), free_bytes});
  }
  std::sort(cycle.bubbles.begin(), cycle.bubbles.end(),
            [](const Bubble& a, const Bubble& b) { return a.offset < b.offset; });
  if (absl::Status status = ValidateBubbleCycle(cycle); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bubble profiler: the medians do not form a cycle: ", status.message()));
  }
  return cycle;
}

}  // namespace pswitch::fill
