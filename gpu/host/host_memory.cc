#include "gpu/host/host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "gpu/shared_flags.h"

namespace pswitch::gpu::host {
namespace {

absl::StatusOr<std::byte*> MapShared(int fd, uint64_t bytes) {
  // Populated up front, as cudaMalloc commits device memory: page faults would otherwise land
  // on the first switch (about 4 ms per 100 MB), in whichever process touches a page first.
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap arena of ", bytes, " bytes"));
  return static_cast<std::byte*>(base);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostArena>> HostArena::Create(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("arena size must be positive");
  UniqueFd fd(::memfd_create("pswitch-arena", MFD_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(absl::StrCat("ftruncate arena to ", bytes, " bytes"));
  }
  PSWITCH_ASSIGN_OR_RETURN(std::byte * base, MapShared(fd.get(), bytes));
  return std::unique_ptr<HostArena>(new HostArena(std::move(fd), base, bytes, /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<HostArena>> HostArena::Import(ArenaHandle handle) {
  if (handle.backend != Backend::kHost) {
    return absl::InvalidArgumentError("host backend cannot import a CUDA arena handle");
  }
  if (!handle.fd.valid()) return absl::InvalidArgumentError("host arena handle carries no fd");
  struct stat st;
  if (::fstat(handle.fd.get(), &st) != 0) return ErrnoStatus("fstat arena fd");
  if (static_cast<uint64_t>(st.st_size) != handle.size_bytes || handle.size_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena fd holds ", st.st_size, " bytes, handle says ", handle.size_bytes));
  }
  PSWITCH_ASSIGN_OR_RETURN(std::byte * base, MapShared(handle.fd.get(), handle.size_bytes));
  return std::unique_ptr<HostArena>(
      new HostArena(std::move(handle.fd), base, handle.size_bytes, /*owner=*/false));
}

HostArena::~HostArena() { ::munmap(base_, size_bytes_); }

uint64_t HostArena::access_granularity() const {
  return static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

absl::Status HostArena::RestrictAccess() {
  if (owner_) return absl::FailedPreconditionError("the arena's owner keeps access to all of it");
  if (::mprotect(base_, size_bytes_, PROT_NONE) != 0) return ErrnoStatus("mprotect arena");
  restricted_ = true;
  return absl::OkStatus();
}

absl::Status HostArena::SetAccess(uint64_t offset, uint64_t bytes, Access access) {
  if (!restricted_) {
    return absl::FailedPreconditionError("access to an unrestricted arena is already total");
  }
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, bytes));
  if (bytes == 0) return absl::OkStatus();
  const uint64_t page = access_granularity();
  const uint64_t begin = offset / page * page;
  // Widened to whole pages, but never past the mapping's end.
  const uint64_t end = std::min(size_bytes_, (offset + bytes + page - 1) / page * page);
  const int prot = access == Access::kNone   ? PROT_NONE
                   : access == Access::kRead ? PROT_READ
                                             : PROT_READ | PROT_WRITE;
  if (::mprotect(base_ + begin, end - begin, prot) != 0) {
    return ErrnoStatus(absl::StrCat("mprotect arena [", begin, ", ", end, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ArenaHandle> HostArena::Export() const {
  if (!owner_) return absl::FailedPreconditionError("only the arena's creator can export it");
  ArenaHandle handle;
  handle.backend = Backend::kHost;
  handle.size_bytes = size_bytes_;
  handle.fd.Reset(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (!handle.fd.valid()) return ErrnoStatus("dup arena fd");
  return handle;
}

absl::Status HostArena::Fill(uint64_t offset, uint64_t bytes, uint8_t value) {
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, bytes));
  std::memset(base_ + offset, value, bytes);
  return absl::OkStatus();
}

absl::Status HostArena::CopyToHost(uint64_t offset, std::span<std::byte> out) {
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, out.size()));
  std::memcpy(out.data(), base_ + offset, out.size());
  return absl::OkStatus();
}

absl::Status HostArena::CopyFromHost(uint64_t offset, std::span<const std::byte> in) {
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, in.size()));
  std::memcpy(base_ + offset, in.data(), in.size());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<FlagArray>> HostArena::Flags(uint64_t offset, uint32_t count) {
  PSWITCH_RETURN_IF_ERROR(CheckFlagPlacement(offset, count));
  return std::make_unique<SharedFlagArray>(reinterpret_cast<uint32_t*>(base_ + offset), count,
                                           offset, /*device_writes=*/false);
}

absl::StatusOr<std::unique_ptr<PinnedHostBuffer>> PinnedHostBuffer::Allocate(uint64_t bytes,
                                                                             bool lock) {
  if (bytes == 0) return absl::InvalidArgumentError("pinned buffer size must be positive");
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap ", bytes, " pinned bytes"));
  if (lock && ::mlock(data, bytes) != 0) {
    int err = errno;
    ::munmap(data, bytes);
    return ErrnoStatus(absl::StrCat("mlock ", bytes,
                                    " bytes (raise RLIMIT_MEMLOCK, e.g. "
                                    "`ulimit -l unlimited`, or run without host memory locking)"),
                       err);
  }
  return std::unique_ptr<PinnedHostBuffer>(
      new PinnedHostBuffer(static_cast<std::byte*>(data), bytes));
}

PinnedHostBuffer::~PinnedHostBuffer() { ::munmap(data_, size_bytes_); }

}  // namespace pswitch::gpu::host
