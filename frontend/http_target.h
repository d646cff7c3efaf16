// A request target ("/v1/tasks?limit=5") split into its path and decoded query parameters.
#ifndef PSWITCH_FRONTEND_HTTP_TARGET_H_
#define PSWITCH_FRONTEND_HTTP_TARGET_H_

#include <map>
#include <string>

#include "absl/strings/string_view.h"

namespace pswitch::frontend {

// `*path` is the target up to '?'; each "k=v" after it (separated by '&') is added to `*query`
// with %XX and '+' decoded (a malformed escape is kept as it is; a repeated key: the last).
void SplitTarget(absl::string_view target, std::string* path,
                 std::map<std::string, std::string>* query);

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_HTTP_TARGET_H_
