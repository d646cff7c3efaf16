// A directory only this user can enter, for sockets that hand out capabilities (the memdaemon's
// worker socket passes the arena's fd): created 0700 if missing, and refused unless it is a real
// directory (not a symlink) owned by this user with no group or other access.
#ifndef PSWITCH_BASE_PRIVATE_DIR_H_
#define PSWITCH_BASE_PRIVATE_DIR_H_

#include <string>

#include "absl/status/statusor.h"

namespace pswitch::base {

// Creates `path` (mode 0700) unless it exists, then verifies it as above. FailedPrecondition
// naming what is wrong (owner, mode, a symlink).
absl::Status EnsurePrivateDir(const std::string& path);

// The default home of this user's runtime sockets: $XDG_RUNTIME_DIR/pswitch, else /run/pswitch
// for root, else a fresh /tmp/pswitch-XXXXXX (`*created_temp` set: the caller removes it).
absl::StatusOr<std::string> DefaultRuntimeDir(bool* created_temp);

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_PRIVATE_DIR_H_
