#include "frontend/unix_socket_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::frontend {
namespace {

constexpr size_t kMaxSocketPath = sizeof(sockaddr_un{}.sun_path) - 1;

std::string Octal(mode_t mode) {
  char text[16];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

absl::StatusOr<sockaddr_un> SocketAddress(const std::string& path) {
  if (path.size() > kMaxSocketPath) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket path '", path, "' is too long"));
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

// The directory must be one no one but us (or root) can change entries of: otherwise whoever
// can write it could replace the socket with theirs, and clients would trust it.
absl::Status CheckDirectory(int dir_fd, const std::string& dir) {
  struct stat st;
  if (::fstat(dir_fd, &st) != 0) return ErrnoStatus(absl::StrCat("stat '", dir, "'"));
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the unix socket's directory '", dir, "' belongs to uid ", st.st_uid,
                     ", neither to pswitchd's user (uid ", ::geteuid(),
                     ") nor to root: its owner could replace the socket"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the unix socket's directory '", dir, "' may be written by other users (mode ",
                     Octal(st.st_mode), ") and is not sticky: they could replace the socket"));
  }
  return absl::OkStatus();
}

// Whether some process accepts connections on the socket at `path` now.
bool Served(const std::string& path) {
  absl::StatusOr<sockaddr_un> address = SocketAddress(path);
  if (!address.ok()) return false;
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!probe.valid()) return false;
  if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) == 0) {
    return true;
  }
  // EAGAIN: a listener whose backlog is full is still someone's.
  return errno == EAGAIN || errno == EINPROGRESS;
}

}  // namespace

absl::StatusOr<UnixSocketFile> CreateUnixSocketFile(const std::string& path, mode_t mode) {
  PSWITCH_RETURN_IF_ERROR(SocketAddress(path).status());
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("unix socket path '", path, "' names no file"));
  }
  UniqueFd dir_fd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid())
    return ErrnoStatus(absl::StrCat("open the unix socket's directory '", dir, "'"));
  PSWITCH_RETURN_IF_ERROR(CheckDirectory(dir_fd.get(), dir));
  // Everything below is relative to the directory checked, never to its path again (through
  // /proc's link to the open directory where /proc is there, which also keeps socket paths short).
  std::string base = absl::StrCat("/proc/self/fd/", dir_fd.get());
  if (::access(base.c_str(), F_OK) != 0) base = dir;

  // A fresh directory of ours (0700), where no one else can reach the socket before its mode is
  // set, nor swap it for a link under the chmod.
  std::string staging = absl::StrCat(base, "/.sock-XXXXXX");
  if (::mkdtemp(staging.data()) == nullptr) {
    return ErrnoStatus(absl::StrCat("create a private directory beside '", path, "'"));
  }
  const std::string staging_name = staging.substr(base.size() + 1);
  const std::string staged = staging + "/s";
  bool renamed = false;
  absl::Cleanup remove_staging = [&] {
    if (!renamed) ::unlink(staged.c_str());
    ::unlinkat(dir_fd.get(), staging_name.c_str(), AT_REMOVEDIR);
  };
  PSWITCH_ASSIGN_OR_RETURN(sockaddr_un staged_address, SocketAddress(staged));
  UnixSocketFile file;
  file.fd = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!file.fd.valid()) return ErrnoStatus("socket(AF_UNIX)");
  if (::bind(file.fd.get(), reinterpret_cast<const sockaddr*>(&staged_address),
             sizeof(staged_address)) != 0) {
    return ErrnoStatus(absl::StrCat("bind a unix socket beside '", path, "'"));
  }
  if (::chmod(staged.c_str(), mode) != 0) {
    return ErrnoStatus(absl::StrCat("chmod ", Octal(mode), " the unix socket"));
  }
  // Listening before it appears at the path: a client that connects at once is not refused.
  if (::listen(file.fd.get(), SOMAXCONN) != 0) {
    return ErrnoStatus(absl::StrCat("listen on a unix socket for '", path, "'"));
  }

  struct stat st;
  bool replace = false;
  if (::fstatat(dir_fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "' exists and is not a socket: not replacing it"));
    }
    if (st.st_uid != ::geteuid()) {
      return absl::FailedPreconditionError(absl::StrCat("'", path, "' is a socket of uid ",
                                                        st.st_uid, ", not ours: not replacing it"));
    }
    // A socket someone still serves is theirs; one nobody answers is a stale one of ours.
    if (Served(absl::StrCat(base, "/", name))) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "' is served by another process (another pswitchd?)"));
    }
    replace = true;
  } else if (errno != ENOENT) {
    return ErrnoStatus(absl::StrCat("stat '", path, "'"));
  }
  const std::string staged_relative = staging_name + "/s";
  // Atomic either way: a stale socket of ours is replaced in one step; otherwise whatever
  // appeared at the path meanwhile is never overwritten.
  const int moved =
      replace ? ::renameat(dir_fd.get(), staged_relative.c_str(), dir_fd.get(), name.c_str())
              : ::renameat2(dir_fd.get(), staged_relative.c_str(), dir_fd.get(), name.c_str(),
                            RENAME_NOREPLACE);
  if (moved != 0) {
    return ErrnoStatus(absl::StrCat("put the unix socket at '", path, "'"));
  }
  renamed = true;
  if (::fstatat(dir_fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoStatus(absl::StrCat("stat '", path, "'"));
  }
  file.dev = st.st_dev;
  file.ino = st.st_ino;
  return file;
}

void RemoveUnixSocketFile(const std::string& path, const UnixSocketFile& created) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (st.st_dev != created.dev || st.st_ino != created.ino) return;  // not ours any more
  ::unlink(path.c_str());
}

}  // namespace pswitch::frontend
