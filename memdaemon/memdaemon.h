// The memory daemon: owns the device arena for its lifetime, the weight store, the lease table
// and the transmitter, and serves workers on a Unix socket. pswitchd embeds one per GPU; the
// controller drives it through the accessors below.
#ifndef PSWITCH_MEMDAEMON_MEMDAEMON_H_
#define PSWITCH_MEMDAEMON_MEMDAEMON_H_

#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/device.h"
#include "memdaemon/lease_table.h"
#include "memdaemon/transmitter.h"
#include "memdaemon/weight_store.h"
#include "memdaemon/worker_server.h"

namespace pswitch::memdaemon {

struct MemDaemonOptions {
  gpu::DeviceOptions device;
  // Arena size. 0 = the default: on CUDA, free device memory minus `arena_reserve_bytes` (for
  // the workers' CUDA contexts); on the host backend, kDefaultHostArenaBytes.
  uint64_t arena_bytes = 0;
  // Not yet measured on a GPU (issue 12, defect 9): validate.sh samples each process's memory
  // with nvidia-smi so the default can be sized from 3 workers' real needs.
  uint64_t arena_reserve_bytes = 4ull << 30;
  // Unix socket for workers; empty = no server (in-process use, tests, benchmarks).
  std::string socket_path;
};

inline constexpr uint64_t kDefaultHostArenaBytes = 2ull << 30;

// Thread-safe (each component is). Destruction stops the server, then the copy engine.
class MemDaemon {
 public:
  static absl::StatusOr<std::unique_ptr<MemDaemon>> Create(const MemDaemonOptions& options);
  ~MemDaemon();
  MemDaemon(const MemDaemon&) = delete;
  MemDaemon& operator=(const MemDaemon&) = delete;

  gpu::Device& device() { return *device_; }
  gpu::Arena& arena() { return *arena_; }
  gpu::FlagArray& ready_flags() { return *ready_flags_; }
  gpu::FlagArray& drain_flags() { return *drain_flags_; }
  LeaseTable& leases() { return *leases_; }
  WeightStore& weights() { return *weights_; }
  Transmitter& transmitter() { return *transmitter_; }
  gpu::CopyEngine& copy_engine() { return *copy_engine_; }
  // What creating the arena took (a CUDA VMM arena makes one allocation per 2 MiB chunk).
  absl::Duration arena_create_time() const { return arena_create_time_; }
  // Empty when no server runs.
  // Nothing of worker slot `slot` is in flight any more (it died, or pswitchd is stopping):
  // releases every wait on its drain flag up to `promised`, the latest drain value a Stop to
  // that slot asked for. Only forward, so a later Stop's value still means something.
  void ReleaseDrain(uint32_t slot, uint32_t promised) {
    (void)drain_flags_->Advance(slot, promised);
  }
  // A training run stopped: copies `model`'s trained weights (and buffers) from its region at
  // `region_offset` back to its pinned store, so the next run, here or on another GPU, starts
  // from them. Call only once nothing writes the region.
  // `*generation` (when given) gets the pinned weights' new generation, which the region holds
  // after a copy that succeeded.
  absl::Status CheckpointWeights(uint64_t region_offset, const StoredModel& model,
                                 uint64_t* generation = nullptr) {
    // Even a failed copy may have written part of the bytes: either way they are new.
    absl::Status copied = arena_->CopyToHost(
        region_offset, std::span<std::byte>(model.host_bytes(), model.total_bytes()));
    const uint64_t now = model.NewGeneration();
    if (generation != nullptr) *generation = now;
    return copied;
  }
  std::string socket_path() const { return server_ ? server_->socket_path() : std::string(); }
  // A one-time secret with which one worker about to be spawned may attach the arena
  // (WorkerServer::IssueAttachSecret). FailedPrecondition when no server runs.
  absl::StatusOr<std::string> IssueAttachSecret() {
    if (server_ == nullptr) return absl::FailedPreconditionError("no memdaemon socket");
    return server_->IssueAttachSecret();
  }
  int device_ordinal() const { return device_ordinal_; }

 private:
  MemDaemon() = default;

  // Declaration order is destruction order reversed: users of the arena go first.
  int device_ordinal_ = 0;
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<gpu::Arena> arena_;
  absl::Duration arena_create_time_;
  std::unique_ptr<gpu::FlagArray> ready_flags_;
  std::unique_ptr<gpu::FlagArray> drain_flags_;
  std::unique_ptr<gpu::CopyEngine> copy_engine_;
  std::unique_ptr<LeaseTable> leases_;
  std::unique_ptr<WeightStore> weights_;
  std::unique_ptr<Transmitter> transmitter_;
  std::unique_ptr<WorkerServer> server_;
};

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_MEMDAEMON_H_
