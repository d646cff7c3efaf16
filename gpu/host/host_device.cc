#include "gpu/host/host_device.h"

#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "gpu/host/host_copy_engine.h"
#include "gpu/host/host_memory.h"

namespace pswitch::gpu {
namespace {

// Host streams run work inline: a wait blocks the caller, a write happens at once.
class HostStream : public Stream {
 public:
  absl::Status WaitFlag(const FlagArray& flags, uint32_t index, uint32_t epoch,
                        absl::Duration timeout) override {
    return flags.WaitReady(index, epoch, timeout);
  }
  absl::Status WriteFlag(FlagArray& flags, uint32_t index, uint32_t value) override {
    return flags.Store(index, value);
  }
  absl::Status Synchronize(absl::Duration) override { return absl::OkStatus(); }
  absl::Status Mark() override {
    if (marks_.size() >= kMaxStreamMarks) return absl::ResourceExhaustedError("too many marks");
    marks_.push_back(base::MonotonicNowNs());
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<int64_t>> TakeMarks() override { return std::exchange(marks_, {}); }
  void* native_handle() const override { return nullptr; }

 private:
  std::vector<int64_t> marks_;
};

class HostDevice : public Device {
 public:
  explicit HostDevice(const DeviceOptions& options) : options_(options) {}

  Backend backend() const override { return Backend::kHost; }
  std::string description() const override {
    return options_.copy_bandwidth_bytes_per_s > 0
               ? absl::StrCat("host (copy capped at ", options_.copy_bandwidth_bytes_per_s / 1e9,
                              " GB/s)")
               : "host (uncapped copies)";
  }
  absl::StatusOr<uint64_t> FreeMemoryBytes() override {
    return static_cast<uint64_t>(::sysconf(_SC_AVPHYS_PAGES)) *
           static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  }
  absl::StatusOr<std::unique_ptr<Arena>> CreateArena(uint64_t bytes) override {
    return host::HostArena::Create(bytes);
  }
  absl::StatusOr<std::unique_ptr<Arena>> ImportArena(ArenaHandle handle) override {
    return host::HostArena::Import(std::move(handle));
  }
  absl::StatusOr<std::unique_ptr<HostBuffer>> AllocatePinned(uint64_t bytes) override {
    return host::PinnedHostBuffer::Allocate(bytes, options_.lock_host_memory);
  }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return std::make_unique<HostStream>();
  }
  absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCopyEngine(Arena& arena) override {
    auto* host_arena = dynamic_cast<host::HostArena*>(&arena);
    if (host_arena == nullptr) {
      return absl::InvalidArgumentError("host copy engine needs a host arena");
    }
    return std::make_unique<host::HostCopyEngine>(host_arena, options_.copy_bandwidth_bytes_per_s);
  }

 private:
  const DeviceOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> OpenHostDevice(const DeviceOptions& options) {
  if (!(options.copy_bandwidth_bytes_per_s >= 0)) {  // also rejects NaN
    return absl::InvalidArgumentError("copy bandwidth cap must be >= 0 bytes/s");
  }
  return std::make_unique<HostDevice>(options);
}

}  // namespace pswitch::gpu
