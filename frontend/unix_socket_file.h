// The file of pswitchd's client Unix socket (--unix-socket, docs/dataplane.md "Identity on the
// local path"): who may connect is decided by the socket file's mode and its directory's, so the
// file must have its mode from the moment it appears, must not be swapped for someone else's,
// and must never be replaced or removed when it is not ours.
//
// How: the directory must be a real one owned by pswitchd's user or root that no one else may
// write (or sticky, like /tmp). The socket is bound inside a fresh 0700 directory of ours beside
// the path, given its mode there (no one else can reach it), and renamed onto the path: clients
// never see it with another mode, and no symlink can be slipped under the chmod. No umask change
// (pswitchd has threads by then). An existing socket at the path is replaced only when it is
// ours and nobody serves it; anything else there is refused.
#ifndef PSWITCH_FRONTEND_UNIX_SOCKET_FILE_H_
#define PSWITCH_FRONTEND_UNIX_SOCKET_FILE_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace pswitch::frontend {

// A listening Unix stream socket and the file it was created as.
struct UnixSocketFile {
  UniqueFd fd;  // listening, close-on-exec, blocking
  dev_t dev = 0;
  ino_t ino = 0;
};

// Creates and listens on `path` with `mode` (e.g. 0660) as above. FailedPrecondition naming
// what is wrong (the directory's owner or mode, a symlink, a file or live socket at the path, a
// socket of another user); InvalidArgument for a path too long for a socket address.
absl::StatusOr<UnixSocketFile> CreateUnixSocketFile(const std::string& path, mode_t mode);

// Removes `path` only if it is still the file `created` (not one someone put there since).
void RemoveUnixSocketFile(const std::string& path, const UnixSocketFile& created);

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_UNIX_SOCKET_FILE_H_
