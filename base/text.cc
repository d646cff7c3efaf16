#include "base/text.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace pswitch::base {

bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const uint8_t c = static_cast<uint8_t>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    uint32_t min, code;
    if ((c & 0xe0) == 0xc0) {
      length = 2, min = 0x80, code = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      length = 3, min = 0x800, code = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      length = 4, min = 0x10000, code = c & 0x07;
    } else {
      return false;  // a continuation byte or 0xf8..0xff where a sequence should start
    }
    if (n - i < length) return false;
    for (size_t k = 1; k < length; ++k) {
      const uint8_t next = static_cast<uint8_t>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      code = (code << 6) | (next & 0x3f);
    }
    if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return false;
    i += length;
  }
  return true;
}

absl::Status CheckText(absl::string_view text, absl::string_view what, size_t max_bytes) {
  if (text.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", text.size(), " bytes, over the limit of ", max_bytes));
  }
  if (!IsValidUtf8(text)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid UTF-8"));
  }
  for (char c : text) {
    if (static_cast<uint8_t>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(what, " contains a control character"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pswitch::base
