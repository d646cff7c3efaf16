#include "base/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::base {

absl::StatusOr<UniqueFd> OpenRegularFile(int dir_fd, const std::string& name,
                                         absl::string_view what, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  UniqueFd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("open ", what));
  PSWITCH_RETURN_IF_ERROR(CheckRegularFile(fd, what, max_bytes));
  return fd;
}

absl::Status CheckRegularFile(const UniqueFd& fd, absl::string_view what, uint64_t max_bytes) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat ", what));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": file of ", st.st_size,
                                                   " bytes exceeds the limit of ", max_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CheckReadableRegularFile(int fd, absl::string_view what,
                                                  uint64_t max_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(absl::StrCat("stat ", what));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a regular file"));
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": file of ", st.st_size, " bytes exceeds the limit of ", max_bytes));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return ErrnoStatus(absl::StrCat("fcntl ", what));
  // O_PATH descriptors carry no read right; a write-only one is not the client's to read.
  if ((flags & O_PATH) != 0 || (flags & O_ACCMODE) == O_WRONLY) {
    return absl::InvalidArgumentError(absl::StrCat(what, " was not opened for reading"));
  }
  return static_cast<uint64_t>(st.st_size);
}

absl::Status CheckLocalFileSystemType(int64_t f_type, absl::string_view what) {
  // statfs(2)'s magic numbers (linux/magic.h and the file systems' own sources).
  struct Remote {
    uint32_t magic;
    const char* name;
  };
  static constexpr Remote kRemote[] = {
      {0x65735546, "FUSE"}, {0x6969, "NFS"},          {0x517B, "SMB"},
      {0xFF534D42, "CIFS"}, {0xFE534D42, "SMB2"},     {0x00C36400, "Ceph"},
      {0x01021997, "9P"},   {0x5346414F, "AFS"},      {0x6B414653, "AFS"},
      {0x73757245, "Coda"}, {0x564C, "NCP"},          {0x0BD00BD0, "Lustre"},
      {0x47504653, "GPFS"}, {0x19830326, "OrangeFS"}, {0x7461636F, "OCFS2"},
      {0x01161970, "GFS2"}, {0xAAD7AAEA, "PanFS"},    {0x013111A8, "IBRIX"},
  };
  // f_type's width and sign differ between ABIs: compare its low 32 bits.
  const uint32_t magic = static_cast<uint32_t>(f_type);
  for (const Remote& remote : kRemote) {
    if (remote.magic == magic) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is on a network or FUSE file system (",
                                                     remote.name, "); copy it to local storage"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLocalFile(int fd, absl::string_view what) {
  struct statfs fs;
  if (::fstatfs(fd, &fs) != 0) return ErrnoStatus(absl::StrCat("statfs ", what));
  return CheckLocalFileSystemType(static_cast<int64_t>(fs.f_type), what);
}

absl::Status WriteAllAt(int fd, absl::string_view bytes, uint64_t offset, absl::string_view what) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        ::pwrite(fd, bytes.data() + done, std::min<size_t>(bytes.size() - done, kFileIoChunkBytes),
                 static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(absl::StrCat("write ", what));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAll(const UniqueFd& fd, absl::string_view what,
                                    uint64_t max_bytes, absl::Duration timeout) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat ", what));
  const uint64_t size = std::min<uint64_t>(static_cast<uint64_t>(st.st_size), max_bytes);
  std::string bytes(size, '\0');
  const absl::Time deadline = absl::Now() + timeout;
  size_t done = 0;
  while (done < size) {
    if (done > 0 && absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "reading ", what, " took longer than ", absl::FormatDuration(timeout)));
    }
    ssize_t n = ::read(fd.get(), bytes.data() + done,
                       std::min<size_t>(size - done, kFileIoChunkBytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(absl::StrCat("read ", what));
    if (n == 0) break;  // it shrank meanwhile
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, absl::string_view what,
                                            uint64_t max_bytes) {
  PSWITCH_ASSIGN_OR_RETURN(UniqueFd fd, OpenRegularFile(AT_FDCWD, path, what, max_bytes));
  return ReadAll(fd, what, max_bytes);
}

absl::StatusOr<UniqueFd> SealedMemoryFile(const char* name, absl::string_view bytes) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus("memfd_create");
  PSWITCH_RETURN_IF_ERROR(WriteAllAt(fd.get(), bytes, 0, "a memory file"));
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    return ErrnoStatus("sealing a memory file");
  }
  return fd;
}

absl::StatusOr<UniqueFd> SealedCopyOfFile(int fd, absl::string_view what, uint64_t max_bytes,
                                          absl::Duration timeout) {
  PSWITCH_ASSIGN_OR_RETURN(const uint64_t size, CheckReadableRegularFile(fd, what, max_bytes));
  UniqueFd copy(::memfd_create("pswitch-file-copy", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!copy.valid()) return ErrnoStatus("memfd_create");
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t done = 0;
  bool by_kernel = true;
  std::string buffer;
  while (done < size) {
    // A file on a slow or hostile file system must not hold the calling thread for ever.
    if (done > 0 && absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("copying ", what, " took longer than ",
                                                      absl::FormatDuration(timeout)));
    }
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size - done, kFileIoChunkBytes));
    ssize_t n;
    if (by_kernel) {
      off_t from = static_cast<off_t>(done);  // sendfile reads at `from`, leaving fd's offset
      n = ::sendfile(copy.get(), fd, &from, chunk);
      if (n < 0 && (errno == EINVAL || errno == ENOSYS) && done == 0) {
        by_kernel = false;  // a file system sendfile cannot read from: copy through a buffer
        continue;
      }
    } else {
      buffer.resize(chunk);
      n = ::pread(fd, buffer.data(), chunk, static_cast<off_t>(done));
      if (n > 0) {
        PSWITCH_RETURN_IF_ERROR(WriteAllAt(copy.get(),
                                           absl::string_view(buffer.data(), static_cast<size_t>(n)),
                                           done, "a memory file"));
      }
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(absl::StrCat("read ", what));
    if (n == 0) break;  // it shrank meanwhile: what was there is what it holds
    done += static_cast<uint64_t>(n);
  }
  if (::fcntl(copy.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) !=
      0) {
    return ErrnoStatus("sealing a memory file");
  }
  return copy;
}

absl::StatusOr<uint64_t> CheckSealedMemoryFile(const UniqueFd& fd, absl::string_view what,
                                               uint64_t max_bytes) {
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a sealed memory file"));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat ", what));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", size, " bytes, over the limit of ", max_bytes));
  }
  return size;
}

absl::StatusOr<std::string> ReadSealedMemoryFile(const UniqueFd& fd, absl::string_view what,
                                                 uint64_t max_bytes) {
  PSWITCH_ASSIGN_OR_RETURN(const uint64_t size, CheckSealedMemoryFile(fd, what, max_bytes));
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd.get(), bytes.data() + done,
                        std::min<size_t>(size - done, kFileIoChunkBytes), static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(absl::StrCat("read ", what));
    if (n == 0) return absl::InternalError(absl::StrCat(what, ": shorter than its size"));
    done += static_cast<size_t>(n);
  }
  return bytes;
}

absl::Status RemoveTree(const std::string& path) {
  // Depth first (FTW_DEPTH: a folder after its contents), physical (FTW_PHYS: links not
  // followed), staying on one file system (FTW_MOUNT).
  static constexpr auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) {
    return ::remove(p) == 0 || errno == ENOENT ? 0 : -1;
  };
  if (::nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0 &&
      errno != ENOENT) {
    return absl::InternalError(
        absl::StrCat("removing '", path, "' and its contents: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace pswitch::base
