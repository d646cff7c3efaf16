#include "base/status.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace pswitch {

absl::Status ErrnoStatus(absl::string_view what, int errno_value) {
  std::string message = absl::StrCat(what, ": ", std::strerror(errno_value));
  return absl::Status(absl::ErrnoToStatusCode(errno_value), message);
}

}  // namespace pswitch
