// JSON from outside the process (a client's bubble cycle, a safetensors header, a plan or
// profile file): parsed within a size and a nesting limit, and never echoed back. nlohmann's
// parser is iterative, but printing or walking a deeply nested value recurses, so depth is
// refused before anything is built. Errors say where (a byte offset) and why, never what the
// text held.
#ifndef PSWITCH_BASE_JSON_H_
#define PSWITCH_BASE_JSON_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace pswitch::base {

struct JsonLimits {
  size_t max_bytes = 16 << 20;
  int max_depth = 32;  // arrays and objects inside each other
};

// InvalidArgument naming `what` for text over the limits, malformed JSON or ill-formed UTF-8.
absl::StatusOr<nlohmann::json> ParseUntrustedJson(absl::string_view text, absl::string_view what,
                                                  const JsonLimits& limits = {});

// Only the size and nesting limits (for a caller with its own parse and error reporting).
absl::Status CheckJsonLimits(absl::string_view text, absl::string_view what,
                             const JsonLimits& limits = {});

// The deepest nesting of arrays and objects in `text` (strings skipped), stopping early once it
// passes `stop_above`. Text that is not JSON yields some number; the parser judges it.
int JsonNestingDepth(absl::string_view text, int stop_above);

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_JSON_H_
