#include "base/json.h"

#include "absl/strings/str_cat.h"

namespace pswitch::base {

int JsonNestingDepth(absl::string_view text, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        deepest = std::max(deepest, ++depth);
        if (deepest > stop_above) return deepest;
        break;
      case ']':
      case '}':
        --depth;
        break;
      default:
        break;
    }
  }
  return deepest;
}

absl::Status CheckJsonLimits(absl::string_view text, absl::string_view what,
                             const JsonLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", text.size(),
                                                   " bytes of JSON, over the limit of ",
                                                   limits.max_bytes));
  }
  if (JsonNestingDepth(text, limits.max_depth) > limits.max_depth) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": JSON nested deeper than ",
                                                   limits.max_depth, " levels"));
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> ParseUntrustedJson(absl::string_view text, absl::string_view what,
                                                  const JsonLimits& limits) {
  if (absl::Status within = CheckJsonLimits(text, what, limits); !within.ok()) return within;
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() quotes the offending token: only the position goes out.
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": malformed JSON (or ill-formed UTF-8) at byte ", e.byte));
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": malformed JSON"));
  }
}

}  // namespace pswitch::base
