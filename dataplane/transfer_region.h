// A transfer region: memory a client shares with pswitchd's workers so a request's tensors are
// never copied through a socket (docs/dataplane.md). pswitchd holds the region's file and hands
// it to the workers that run the region's tasks; it never maps a client's region itself (it
// never touches the bytes). Staging regions are pswitchd's own, written by its TCP and HTTP
// ports as a request's bytes arrive.
#ifndef PSWITCH_DATAPLANE_TRANSFER_REGION_H_
#define PSWITCH_DATAPLANE_TRANSFER_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace pswitch::dataplane {

enum class RegionKind {
  kSealedMemfd,  // a Unix-socket client's area: a memfd sealed against shrinking
  kShmFile,      // Triton system shared memory: a regular file under /dev/shm, may shrink
  kStaging,      // pswitchd's own memfd, filled from a socket
  kCudaIpc,      // Triton CUDA shared memory: a client's device allocation
};
const char* RegionKindName(RegionKind kind);

// Immutable after creation: thread-safe. Holding a shared_ptr keeps the file (and so the memory)
// alive: tasks hold the regions their tensors lie in until they end.
class TransferRegion {
 public:
  // A memfd passed over the Unix socket. FailedPrecondition unless it is a memfd with
  // F_SEAL_SHRINK set (so no one can make a mapping of it fault), InvalidArgument unless it holds
  // at least `bytes` (> 0).
  static absl::StatusOr<std::shared_ptr<const TransferRegion>> FromSealedMemfd(UniqueFd fd,
                                                                              uint64_t bytes,
                                                                              std::string owner);
  // `bytes` at `file_offset` of an already-opened shared-memory file (the caller checked who may
  // map it). The file may shrink later: CheckSlice looks at its size on every use.
  static absl::StatusOr<std::shared_ptr<const TransferRegion>> FromShmFile(UniqueFd fd,
                                                                          uint64_t file_offset,
                                                                          uint64_t bytes,
                                                                          std::string owner);
  // A new memfd of `bytes` of pswitchd's own, sealed against shrinking and growing.
  static absl::StatusOr<std::shared_ptr<const TransferRegion>> NewStaging(uint64_t bytes,
                                                                         std::string owner);
  // A client's device allocation, named by its CUDA IPC handle (64 bytes) on device `device`.
  static absl::StatusOr<std::shared_ptr<const TransferRegion>> FromCudaIpc(std::string handle,
                                                                          int device,
                                                                          uint64_t bytes,
                                                                          std::string owner);
  TransferRegion(const TransferRegion&) = delete;
  TransferRegion& operator=(const TransferRegion&) = delete;

  // Unique for pswitchd's lifetime (never reused), never 0.
  uint64_t id() const { return id_; }
  RegionKind kind() const { return kind_; }
  const std::string& owner() const { return owner_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t file_offset() const { return file_offset_; }
  // -1 for kCudaIpc.
  int fd() const { return fd_.get(); }
  const std::string& cuda_ipc_handle() const { return cuda_ipc_handle_; }
  int device() const { return device_; }

  // OK when [offset, offset + length) lies inside the region, and (a file that may shrink) inside
  // the file as it is now. OutOfRange naming both otherwise; never overflows.
  absl::Status CheckSlice(uint64_t offset, uint64_t length) const;

 private:
  TransferRegion(RegionKind kind, UniqueFd fd, uint64_t file_offset, uint64_t bytes,
                 std::string owner);

  const uint64_t id_;
  const RegionKind kind_;
  const UniqueFd fd_;
  const uint64_t file_offset_;
  const uint64_t bytes_;
  const std::string owner_;
  std::string cuda_ipc_handle_;
  int device_ = -1;
};

}  // namespace pswitch::dataplane

#endif  // PSWITCH_DATAPLANE_TRANSFER_REGION_H_
