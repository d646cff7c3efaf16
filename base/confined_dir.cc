#include "base/confined_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/files.h"
#include "base/status.h"

namespace pswitch::base {
namespace {

// A client-facing description of a failed open: never more than whether `name` is usable.
absl::Status OpenError(absl::string_view what, absl::string_view name, int error) {
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(absl::StrCat(what, " '", name, "' does not exist"));
    case ELOOP:
      return absl::InvalidArgumentError(
          absl::StrCat(what, " '", name, "' goes through a symlink (never followed)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(absl::StrCat(what, " '", name, "' is not accessible"));
    default:
      return ErrnoStatus(absl::StrCat(what, " '", name, "'"), error);
  }
}

// The directory `part` inside `parent`, never through a symlink. Errors describe `name`.
absl::StatusOr<UniqueFd> OpenSubdirectory(int parent, const std::string& part,
                                          absl::string_view what, absl::string_view name) {
  UniqueFd dir(::openat(parent, part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.valid()) return dir;
  int error = errno;
  // O_PATH|O_NOFOLLOW on a symlink fails as "not a directory": say what it is.
  struct stat st;
  if (::fstatat(parent, part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
    error = ELOOP;
  }
  return OpenError(what, name, error);
}

}  // namespace

absl::StatusOr<ConfinedDir> ConfinedDir::Open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("data root '", path, "'"));
  return ConfinedDir(std::move(fd), path);
}

absl::Status ConfinedDir::CheckName(absl::string_view name, absl::string_view what) {
  if (name.empty() || name.size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a name of 1 to 1024 bytes is needed"));
  }
  if (name.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", name, "' must be relative to the server's data root, not absolute"));
  }
  if (name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " contains a NUL byte"));
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part == "." || part == ".." || part.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " '", name, "': empty, '.' and '..' components are not allowed"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> ConfinedDir::OpenParent(absl::string_view name, absl::string_view what,
                                                 std::string* leaf) const {
  PSWITCH_RETURN_IF_ERROR(CheckName(name, what));
  std::vector<std::string> parts = absl::StrSplit(name, '/');
  *leaf = parts.back();
  parts.pop_back();
  UniqueFd dir(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (!dir.valid()) return ErrnoStatus("dup data root");
  for (const std::string& part : parts) {
    PSWITCH_ASSIGN_OR_RETURN(dir, OpenSubdirectory(dir.get(), part, what, name));
  }
  return dir;
}

absl::StatusOr<ConfinedDir> ConfinedDir::Sub(absl::string_view name,
                                             absl::string_view what) const {
  std::string leaf;
  PSWITCH_ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(name, what, &leaf));
  PSWITCH_ASSIGN_OR_RETURN(UniqueFd dir, OpenSubdirectory(parent.get(), leaf, what, name));
  return ConfinedDir(std::move(dir), absl::StrCat(path_, "/", name));
}

absl::StatusOr<std::vector<std::string>> ConfinedDir::SubdirectoryNames() const {
  // O_PATH fds cannot be read as directories: open it again, for reading, through itself.
  UniqueFd fd(::openat(fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("list '", path_, "'"));
  DIR* dir = ::fdopendir(fd.get());
  if (dir == nullptr) return ErrnoStatus(absl::StrCat("list '", path_, "'"));
  fd.Release();  // the DIR owns it now
  std::vector<std::string> names;
  while (struct dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(::dirfd(dir), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode)) {
      names.push_back(name);
    }
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<UniqueFd> ConfinedDir::OpenForRead(absl::string_view name, absl::string_view what,
                                                  uint64_t max_bytes) const {
  std::string leaf;
  PSWITCH_ASSIGN_OR_RETURN(UniqueFd dir, OpenParent(name, what, &leaf));
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  UniqueFd fd(::openat(dir.get(), leaf.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW));
  if (!fd.valid()) return OpenError(what, name, errno);
  PSWITCH_RETURN_IF_ERROR(CheckRegularFile(fd, absl::StrCat(what, " '", name, "'"), max_bytes));
  return fd;
}

absl::StatusOr<std::string> ConfinedDir::Read(absl::string_view name, absl::string_view what,
                                              uint64_t max_bytes) const {
  PSWITCH_ASSIGN_OR_RETURN(UniqueFd fd, OpenForRead(name, what, max_bytes));
  return ReadAll(fd, absl::StrCat(what, " '", name, "'"), max_bytes);
}

absl::Status ConfinedDir::CheckCreatable(absl::string_view name, absl::string_view what) const {
  std::string leaf;
  PSWITCH_ASSIGN_OR_RETURN(UniqueFd dir, OpenParent(name, what, &leaf));
  struct stat st;
  if (::fstatat(dir.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat(what, " '", name, "' already exists (outputs never replace a file)"));
  }
  if (errno != ENOENT) return OpenError(what, name, errno);
  return absl::OkStatus();
}

absl::Status ConfinedDir::Create(absl::string_view name, absl::string_view bytes,
                                 absl::string_view what) const {
  std::string leaf;
  PSWITCH_ASSIGN_OR_RETURN(UniqueFd dir, OpenParent(name, what, &leaf));
  // A fresh, unguessable temporary that only this call can have created.
  std::random_device random;
  const std::string tmp = absl::StrCat(".", leaf, ".pswitch-", random(), random(), ".tmp");
  UniqueFd out(::openat(dir.get(), tmp.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out.valid()) return OpenError(what, name, errno);
  auto fail = [&](absl::Status status) {
    ::unlinkat(dir.get(), tmp.c_str(), 0);
    return status;
  };
  const absl::Time deadline = absl::Now() + kFileIoTimeout;
  size_t done = 0;
  while (done < bytes.size()) {
    if (done > 0 && absl::Now() > deadline) {
      return fail(absl::DeadlineExceededError(absl::StrCat(
          "writing ", what, " '", name, "' took longer than ", absl::FormatDuration(kFileIoTimeout))));
    }
    ssize_t n = ::write(out.get(), bytes.data() + done,
                        std::min<size_t>(bytes.size() - done, kFileIoChunkBytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(ErrnoStatus(absl::StrCat("write ", what, " '", name, "'")));
    done += static_cast<size_t>(n);
  }
  if (::fsync(out.get()) != 0) {
    return fail(ErrnoStatus(absl::StrCat("sync ", what, " '", name, "'")));
  }
  // RENAME_NOREPLACE: never over anything, however it got there since CheckCreatable.
  if (::renameat2(dir.get(), tmp.c_str(), dir.get(), leaf.c_str(), RENAME_NOREPLACE) != 0) {
    const int error = errno;
    if (error == EEXIST) {
      return fail(absl::AlreadyExistsError(
          absl::StrCat(what, " '", name, "' already exists (outputs never replace a file)")));
    }
    return fail(ErrnoStatus(absl::StrCat("rename ", what, " '", name, "'"), error));
  }
  return absl::OkStatus();
}

}  // namespace pswitch::base
