#include "base/private_dir.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::base {

absl::Status EnsurePrivateDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(absl::StrCat("create '", path, "'"));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus(absl::StrCat("stat '", path, "'"));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' must be a directory (not a symlink or file)"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", path, "' belongs to uid ", st.st_uid, ", not to this user (uid ", ::geteuid(), ")"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", path, "' is open to other users (mode ", absl::Hex(st.st_mode & 0777),
        " in hex); it must be 0700"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DefaultRuntimeDir(bool* created_temp) {
  *created_temp = false;
  if (const char* xdg = ::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && xdg[0] == '/') {
    std::string dir = absl::StrCat(xdg, "/pswitch");
    if (absl::Status ok = EnsurePrivateDir(dir); ok.ok()) return dir;
  }
  if (::geteuid() == 0) {
    const std::string dir = "/run/pswitch";
    if (absl::Status ok = EnsurePrivateDir(dir); ok.ok()) return dir;
  }
  char tmpl[] = "/tmp/pswitch-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return ErrnoStatus("mkdtemp /tmp/pswitch-XXXXXX");
  *created_temp = true;
  return std::string(tmpl);
}

}  // namespace pswitch::base
