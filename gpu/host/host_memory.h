// Host-backend memory objects: the memfd arena with its futex flags, and pinned buffers.
#ifndef PSWITCH_GPU_HOST_HOST_MEMORY_H_
#define PSWITCH_GPU_HOST_HOST_MEMORY_H_

#include <memory>

#include "gpu/device.h"
#include "base/unique_fd.h"

namespace pswitch::gpu::host {

// A shared mapping of a memfd. The creating process is the owner and can export the fd.
class HostArena : public Arena {
 public:
  static absl::StatusOr<std::unique_ptr<HostArena>> Create(uint64_t bytes);
  static absl::StatusOr<std::unique_ptr<HostArena>> Import(ArenaHandle handle);
  ~HostArena() override;

  uint64_t size_bytes() const override { return size_bytes_; }
  std::byte* base() const override { return base_; }
  bool owner() const override { return owner_; }
  absl::StatusOr<ArenaHandle> Export() const override;
  absl::Status Fill(uint64_t offset, uint64_t bytes, uint8_t value) override;
  absl::Status CopyToHost(uint64_t offset, std::span<std::byte> out) override;
  absl::Status CopyFromHost(uint64_t offset, std::span<const std::byte> in) override;
  absl::StatusOr<std::unique_ptr<FlagArray>> Flags(uint64_t offset, uint32_t count) override;
  // Pages: the mapping's protection (mprotect), over pages populated at import, so a grant
  // changes page-table bits and faults nothing in.
  uint64_t access_granularity() const override;
  absl::Status RestrictAccess() override;
  absl::Status SetAccess(uint64_t offset, uint64_t bytes, Access access) override;

 private:
  HostArena(UniqueFd fd, std::byte* base, uint64_t size_bytes, bool owner)
      : fd_(std::move(fd)), base_(base), size_bytes_(size_bytes), owner_(owner) {}

  UniqueFd fd_;
  std::byte* const base_;
  const uint64_t size_bytes_;
  const bool owner_;
  bool restricted_ = false;
};

// mmap'd (and, if asked, mlock'd) anonymous memory.
class PinnedHostBuffer : public HostBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<PinnedHostBuffer>> Allocate(uint64_t bytes, bool lock);
  ~PinnedHostBuffer() override;
  std::byte* data() const override { return data_; }
  uint64_t size_bytes() const override { return size_bytes_; }

 private:
  PinnedHostBuffer(std::byte* data, uint64_t bytes) : data_(data), size_bytes_(bytes) {}
  std::byte* const data_;
  const uint64_t size_bytes_;
};

}  // namespace pswitch::gpu::host

#endif  // PSWITCH_GPU_HOST_HOST_MEMORY_H_
