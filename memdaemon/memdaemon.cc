#include "memdaemon/memdaemon.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "memdaemon/arena_layout.h"

namespace pswitch::memdaemon {
namespace {

absl::StatusOr<uint64_t> ChooseArenaBytes(gpu::Device& device, const MemDaemonOptions& options) {
  if (options.arena_bytes != 0) {
    if (options.arena_bytes <= kControlBytes) {
      return absl::InvalidArgumentError(absl::StrCat("arena of ", options.arena_bytes,
                                                     " bytes is smaller than its ", kControlBytes,
                                                     "-byte control block"));
    }
    return options.arena_bytes;
  }
  if (device.backend() == gpu::Backend::kHost) return kDefaultHostArenaBytes;
  PSWITCH_ASSIGN_OR_RETURN(uint64_t free_bytes, device.FreeMemoryBytes());
  if (free_bytes <= options.arena_reserve_bytes + kControlBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "only ", free_bytes, " bytes free on ", device.description(), ", and ",
        options.arena_reserve_bytes,
        " must stay outside the arena for the workers' CUDA contexts and libraries (lower "
        "--arena-reserve-bytes, or set --arena-bytes explicitly)"));
  }
  // Round down to 2 MiB so the arena is large-page sized.
  return (free_bytes - options.arena_reserve_bytes) & ~((2ull << 20) - 1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemDaemon>> MemDaemon::Create(const MemDaemonOptions& options) {
  std::unique_ptr<MemDaemon> d(new MemDaemon());
  d->device_ordinal_ = options.device.device_ordinal;
  PSWITCH_ASSIGN_OR_RETURN(d->device_, gpu::Device::Open(options.device));
  PSWITCH_ASSIGN_OR_RETURN(uint64_t arena_bytes, ChooseArenaBytes(*d->device_, options));
  const absl::Time create_start = absl::Now();
  PSWITCH_ASSIGN_OR_RETURN(d->arena_, d->device_->CreateArena(arena_bytes));
  d->arena_create_time_ = absl::Now() - create_start;
  PSWITCH_ASSIGN_OR_RETURN(d->ready_flags_, d->arena_->Flags(kReadyFlagsOffset, kReadyFlagCount));
  PSWITCH_ASSIGN_OR_RETURN(d->drain_flags_, d->arena_->Flags(kDrainFlagsOffset, kDrainFlagCount));
  PSWITCH_ASSIGN_OR_RETURN(d->copy_engine_, d->device_->CreateCopyEngine(*d->arena_));
  // Leases (and the weights cache's regions, at the same alignment) in whole units of what a
  // worker is granted access in, so a grant of one reaches nothing of another.
  const uint64_t alignment = std::max(kLeaseAlignmentBytes, d->arena_->access_granularity());
  if (alignment % kLeaseAlignmentBytes != 0 || kControlBytes % alignment != 0) {
    return absl::FailedPreconditionError(absl::StrCat("the arena grants access in units of ",
                                                      alignment, " bytes, which do not divide its ",
                                                      kControlBytes, "-byte control block"));
  }
  d->leases_ = std::make_unique<LeaseTable>(d->arena_.get(), kControlBytes, arena_bytes, alignment);
  d->weights_ = std::make_unique<WeightStore>(d->device_.get(), arena_bytes - kControlBytes);
  d->transmitter_ =
      std::make_unique<Transmitter>(d->copy_engine_.get(), d->ready_flags_.get(),
                                    d->drain_flags_.get(), arena_bytes, d->arena_->base());
  if (!options.socket_path.empty()) {
    PSWITCH_ASSIGN_OR_RETURN(
        d->server_, WorkerServer::Start(options.socket_path, d->arena_.get(), d->leases_.get()));
  }
  return d;
}

MemDaemon::~MemDaemon() {
  server_.reset();
  transmitter_.reset();
  copy_engine_.reset();
}

}  // namespace pswitch::memdaemon
