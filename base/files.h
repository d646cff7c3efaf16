// Reading files named from outside without being steered by them: regular files only (a FIFO
// or device is refused without blocking), size-checked before a byte is read, no symlink
// followed in the last component.
#ifndef PSWITCH_BASE_FILES_H_
#define PSWITCH_BASE_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"

namespace pswitch::base {

// Opens `name` relative to directory `dir_fd` (AT_FDCWD: the working directory) for reading.
// InvalidArgument naming `what` when it is not a regular file or exceeds `max_bytes`.
absl::StatusOr<UniqueFd> OpenRegularFile(int dir_fd, const std::string& name,
                                         absl::string_view what, uint64_t max_bytes);
// InvalidArgument naming `what` unless `fd` is a regular file of at most `max_bytes`.
absl::Status CheckRegularFile(const UniqueFd& fd, absl::string_view what, uint64_t max_bytes);
// InvalidArgument naming `what` unless `fd` is a regular file (memfds are) of at most `max_bytes`
// opened for reading (not O_PATH, not write-only); returns its size. Only fstat and fcntl: it
// never blocks on the file's contents.
absl::StatusOr<uint64_t> CheckReadableRegularFile(int fd, absl::string_view what,
                                                  uint64_t max_bytes);
// InvalidArgument naming `what` when `f_type` (statfs(2)'s) is that of a network or FUSE file
// system (NFS, SMB/CIFS, Ceph, 9P, AFS, Lustre, FUSE, ...): a read there can stall in the kernel
// for ever, holding the thread that copies the file, and no timeout of ours can interrupt it.
absl::Status CheckLocalFileSystemType(int64_t f_type, absl::string_view what);
// CheckLocalFileSystemType for the file system `fd` lies on (fstatfs).
absl::Status CheckLocalFile(int fd, absl::string_view what);
// Writes all of `bytes` into `fd` at `offset` with pwrite, in chunks of kFileIoChunkBytes (fd's
// own offset is neither used nor moved). `what` names the file in errors.
absl::Status WriteAllAt(int fd, absl::string_view bytes, uint64_t offset, absl::string_view what);
// How long one whole read or write of a file named from outside may take (a slow network or
// FUSE file system must not hold a registration or fill-job thread for ever). Checked between
// chunks of kFileIoChunkBytes: one read(2) stuck in the kernel is not interrupted.
inline constexpr absl::Duration kFileIoTimeout = absl::Seconds(60);
inline constexpr size_t kFileIoChunkBytes = 4 << 20;

// Reads all of an fd from OpenRegularFile (at most `max_bytes`); DeadlineExceeded past
// `timeout`.
absl::StatusOr<std::string> ReadAll(const UniqueFd& fd, absl::string_view what,
                                    uint64_t max_bytes, absl::Duration timeout = kFileIoTimeout);
// OpenRegularFile + ReadAll.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, absl::string_view what,
                                            uint64_t max_bytes);

// An anonymous in-memory file holding `bytes`, sealed so that no one (this process included) can
// change or resize it: handed to other processes by fd (SCM_RIGHTS), it reads the same for all.
absl::StatusOr<UniqueFd> SealedMemoryFile(const char* name, absl::string_view bytes);
// A SealedMemoryFile holding a copy of regular file `fd` (at most `max_bytes`), copied by the
// kernel (sendfile, no buffer here) from offset 0 with positional reads, so fd's own offset is
// neither used nor moved. A file that shrinks meanwhile yields what it still held; one that grows
// is copied up to its size at the start. InvalidArgument naming `what` unless fd is a regular file
// (memfds are) of at most `max_bytes` opened for reading; DeadlineExceeded past `timeout`.
absl::StatusOr<UniqueFd> SealedCopyOfFile(int fd, absl::string_view what, uint64_t max_bytes,
                                          absl::Duration timeout = kFileIoTimeout);
// The size of a SealedMemoryFile received from another process, without reading it: as
// ReadSealedMemoryFile checks it.
absl::StatusOr<uint64_t> CheckSealedMemoryFile(const UniqueFd& fd, absl::string_view what,
                                               uint64_t max_bytes);
// The contents of a SealedMemoryFile received from another process. InvalidArgument unless the
// fd is one (sealed against writes and resizing) of at most `max_bytes`. Reads with pread, so
// processes sharing the open file do not race on its offset.
absl::StatusOr<std::string> ReadSealedMemoryFile(const UniqueFd& fd, absl::string_view what,
                                                 uint64_t max_bytes);

// Removes `path` and everything under it, following no symlink (a link is removed, never its
// target). Not std::filesystem::remove_all: pip torch's libtorch_cpu.so exports its own copy of
// std::filesystem, which binaries linked against it bind to, and its remove_all crashed
// (SIGSEGV) in bench-switch on the GPU machine. NotFound is not an error.
absl::Status RemoveTree(const std::string& path);

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_FILES_H_
