// Strings that arrive from outside (model names, file names in requests): well-formed UTF-8
// without control characters, within a length, or refused before anything echoes them.
#ifndef PSWITCH_BASE_TEXT_H_
#define PSWITCH_BASE_TEXT_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pswitch::base {

// Well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
bool IsValidUtf8(absl::string_view text);

// InvalidArgument naming `what` unless `text` is valid UTF-8 of at most `max_bytes` without
// control characters (C0, DEL). The message never includes `text` itself.
absl::Status CheckText(absl::string_view text, absl::string_view what, size_t max_bytes);

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_TEXT_H_
