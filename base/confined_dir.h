// A directory clients may name files under (pswitchd's --data-root). Names are relative and
// resolved one component at a time from the directory's fd, never following a symlink, so
// neither "..", an absolute path nor a symlink (planted or swapped in meanwhile) leads out of
// it, and errors about what lies outside cannot exist. Files are read only when regular and
// within a size limit (a FIFO is refused without blocking). Files are written new: to a
// private temporary beside the target (O_EXCL, mode 0600), then renamed into place only where
// nothing exists yet, so no existing file, the daemon's or anyone else's, is ever replaced.
#ifndef PSWITCH_BASE_CONFINED_DIR_H_
#define PSWITCH_BASE_CONFINED_DIR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_fd.h"

namespace pswitch::base {

// Thread-safe (const methods only).
class ConfinedDir {
 public:
  // `path` must be an existing directory (symlinks to one are fine: the operator chose it).
  static absl::StatusOr<ConfinedDir> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // InvalidArgument unless `name` is relative, without "." or ".." components or NUL bytes, at
  // most 1024 bytes: what every method checks first.
  static absl::Status CheckName(absl::string_view name, absl::string_view what);

  // The subdirectory `name`, itself confined (resolved the same way: no symlink, no "..").
  absl::StatusOr<ConfinedDir> Sub(absl::string_view name, absl::string_view what) const;
  // The names of the subdirectories directly in it (not symlinks), sorted.
  absl::StatusOr<std::vector<std::string>> SubdirectoryNames() const;

  // A regular file of at most `max_bytes`, opened for reading. Errors name `what` and `name`.
  absl::StatusOr<UniqueFd> OpenForRead(absl::string_view name, absl::string_view what,
                                       uint64_t max_bytes) const;
  // OpenForRead, then all of it.
  absl::StatusOr<std::string> Read(absl::string_view name, absl::string_view what,
                                   uint64_t max_bytes) const;
  // OK when `name` could be created now: its directory exists and nothing is at `name`.
  // AlreadyExists otherwise (a later Create may still find it taken).
  absl::Status CheckCreatable(absl::string_view name, absl::string_view what) const;
  // Writes `bytes` to a new file `name` (mode 0600). AlreadyExists when anything is there.
  absl::Status Create(absl::string_view name, absl::string_view bytes,
                      absl::string_view what) const;

 private:
  ConfinedDir(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  // The directory holding `name` (opened without following symlinks) and its last component.
  absl::StatusOr<UniqueFd> OpenParent(absl::string_view name, absl::string_view what,
                                      std::string* leaf) const;

  UniqueFd fd_;
  std::string path_;
};

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_CONFINED_DIR_H_
