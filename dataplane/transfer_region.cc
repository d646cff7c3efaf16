#include "dataplane/transfer_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::dataplane {
namespace {

std::atomic<uint64_t> next_region_id{1};

// Never huge pages: a hugetlbfs file (MFD_HUGETLB) can lose its pages' reservation (a hole
// punched, the pool exhausted) whatever its seals, and fault whoever maps it.
absl::Status CheckShmem(int fd, const char* what) {
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) return ErrnoStatus(absl::StrCat("fstatfs of ", what));
  if (fs.f_type == HUGETLBFS_MAGIC) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " must be ordinary shared memory (memfd_create without MFD_HUGETLB, or a file "
              "under /dev/shm)"));
  }
  return absl::OkStatus();
}

// The file's size now; a region on a file that shrank past its end must not be touched.
absl::StatusOr<uint64_t> FileBytes(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoStatus("fstat of a transfer region");
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace

const char* RegionKindName(RegionKind kind) {
  switch (kind) {
    case RegionKind::kSealedMemfd:
      return "area";
    case RegionKind::kShmFile:
      return "system shared memory";
    case RegionKind::kStaging:
      return "staging";
    case RegionKind::kCudaIpc:
      return "CUDA shared memory";
  }
  return "region";
}

TransferRegion::TransferRegion(RegionKind kind, UniqueFd fd, uint64_t file_offset, uint64_t bytes,
                               std::string owner)
    : id_(next_region_id.fetch_add(1)),
      kind_(kind),
      fd_(std::move(fd)),
      file_offset_(file_offset),
      bytes_(bytes),
      owner_(std::move(owner)) {}

absl::StatusOr<std::shared_ptr<const TransferRegion>> TransferRegion::FromSealedMemfd(
    UniqueFd fd, uint64_t bytes, std::string owner) {
  if (bytes == 0) return absl::InvalidArgumentError("an area of 0 bytes");
  // F_GET_SEALS fails on anything but a memfd (or a tmpfs file created sealable).
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) {
    return absl::FailedPreconditionError(
        "an area must be a memfd (memfd_create with MFD_ALLOW_SEALING)");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::FailedPreconditionError(
        "an area must be sealed against shrinking (fcntl F_ADD_SEALS F_SEAL_SHRINK), so that no "
        "one can make its mappings fault");
  }
  PSWITCH_RETURN_IF_ERROR(CheckShmem(fd.get(), "an area"));
  PSWITCH_ASSIGN_OR_RETURN(uint64_t size, FileBytes(fd.get()));
  if (size < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an area of ", bytes, " bytes was declared but its memfd holds ", size));
  }
  return std::shared_ptr<const TransferRegion>(new TransferRegion(
      RegionKind::kSealedMemfd, std::move(fd), 0, bytes, std::move(owner)));
}

absl::StatusOr<std::shared_ptr<const TransferRegion>> TransferRegion::FromShmFile(
    UniqueFd fd, uint64_t file_offset, uint64_t bytes, std::string owner) {
  if (bytes == 0) return absl::InvalidArgumentError("a shared-memory region of 0 bytes");
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (file_offset % page != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a shared-memory region's offset (", file_offset,
                     ") must be a multiple of the page size (", page, ")"));
  }
  if (file_offset > UINT64_MAX - bytes) {
    return absl::InvalidArgumentError("a shared-memory region's offset + size overflows");
  }
  PSWITCH_RETURN_IF_ERROR(CheckShmem(fd.get(), "a shared-memory region"));
  auto region = std::shared_ptr<const TransferRegion>(
      new TransferRegion(RegionKind::kShmFile, std::move(fd), file_offset, bytes, std::move(owner)));
  // The whole region must exist now; it is checked again on every use.
  PSWITCH_RETURN_IF_ERROR(region->CheckSlice(0, bytes));
  return region;
}

absl::StatusOr<std::shared_ptr<const TransferRegion>> TransferRegion::NewStaging(
    uint64_t bytes, std::string owner) {
  if (bytes == 0) return absl::InvalidArgumentError("a staging region of 0 bytes");
  UniqueFd fd(::memfd_create("pswitch-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus("memfd_create for a staging region");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus("sizing a staging region");
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoStatus("sealing a staging region");
  }
  return std::shared_ptr<const TransferRegion>(
      new TransferRegion(RegionKind::kStaging, std::move(fd), 0, bytes, std::move(owner)));
}

absl::StatusOr<std::shared_ptr<const TransferRegion>> TransferRegion::FromCudaIpc(
    std::string handle, int device, uint64_t bytes, std::string owner) {
  constexpr size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
  if (handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a CUDA IPC handle has ", kCudaIpcHandleBytes,
                                                   " bytes, not ", handle.size()));
  }
  if (bytes == 0) return absl::InvalidArgumentError("a CUDA shared-memory region of 0 bytes");
  if (device < 0) return absl::InvalidArgumentError(absl::StrCat("bad CUDA device ", device));
  auto* region = new TransferRegion(RegionKind::kCudaIpc, UniqueFd(), 0, bytes, std::move(owner));
  region->cuda_ipc_handle_ = std::move(handle);
  region->device_ = device;
  return std::shared_ptr<const TransferRegion>(region);
}

absl::Status TransferRegion::CheckSlice(uint64_t offset, uint64_t length) const {
  if (offset > bytes_ || length > bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", +", length, ") lie outside ",
                                              RegionKindName(kind_), " region ", id_, " of ",
                                              bytes_, " bytes"));
  }
  if (kind_ == RegionKind::kShmFile) {
    PSWITCH_ASSIGN_OR_RETURN(uint64_t size, FileBytes(fd_.get()));
    const uint64_t end = file_offset_ + offset + length;  // <= file_offset_ + bytes_: no overflow
    if (end > size) {
      return absl::OutOfRangeError(absl::StrCat(RegionKindName(kind_), " region ", id_,
                                                "'s file shrank to ", size, " bytes; bytes up to ",
                                                end, " are needed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pswitch::dataplane
