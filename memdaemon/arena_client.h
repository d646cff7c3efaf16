// The worker's side of the memdaemon socket: attach once (import the arena, map its flags),
// then request and release leases. One per worker process.
#ifndef PSWITCH_MEMDAEMON_ARENA_CLIENT_H_
#define PSWITCH_MEMDAEMON_ARENA_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/device.h"
#include "memdaemon/lease_table.h"
#include "proto/frame_channel.h"

namespace pswitch::memdaemon {

// Thread-safe: one request and its replies at a time (a worker's grant may fetch chunks on
// its control thread). `*device` must outlive the client.
class ArenaClient {
 public:
  // Connects to `socket_path`, imports the arena on `device` and maps the flag arrays.
  // `attach_secret` is the one-time secret pswitchd issued for this worker (empty: none, which
  // only pswitchd's own process may use); PermissionDenied when the memdaemon refuses it.
  static absl::StatusOr<std::unique_ptr<ArenaClient>> Attach(const std::string& socket_path,
                                                             gpu::Device* device,
                                                             uint32_t worker_id,
                                                             const std::string& attach_secret = {});
  ArenaClient(const ArenaClient&) = delete;
  ArenaClient& operator=(const ArenaClient&) = delete;

  gpu::Arena& arena() { return *arena_; }
  gpu::FlagArray& ready_flags() { return *ready_flags_; }
  gpu::FlagArray& drain_flags() { return *drain_flags_; }
  uint64_t weight_alignment_bytes() const { return alignment_; }
  // What the memdaemon aligns leases and weights regions to (0 from an older memdaemon).
  uint64_t lease_alignment_bytes() const { return lease_alignment_; }

  // From now on this process reads the ready flags, writes the drain flags, and touches nothing
  // else but what it grants itself (a worker: its lease, the model region and optimizer state of
  // the task it runs; issue 29 item 2). FailedPrecondition where the arena cannot restrict
  // access (Arena::access_granularity 0), or where the drain words do not start a page (a
  // write grant to them would reach ready words). Where the flags live outside the memory access
  // is granted to (CUDA's registered host page), they stay as they are: the device can write
  // ready words there too.
  absl::Status RestrictToFlags();

  absl::StatusOr<Lease> RequestLease(const std::string& owner, uint64_t bytes);
  // A VMM arena's chunk fds [first, first + count), in order, count at most
  // kMaxChunksPerRequest (the arena's ArenaChunkSource). A reply out of step (a timeout, a
  // wrong or missing chunk) leaves the connection unusable: every later request then fails with
  // Unavailable naming why.
  absl::StatusOr<std::vector<UniqueFd>> FetchChunks(uint64_t first, uint64_t count);
  absl::Status ReleaseLease(const std::string& owner, uint64_t offset);

 private:
  ArenaClient() = default;
  template <typename Fn>
  absl::StatusOr<proto::ReceivedFrame> Call(Fn build_request);

  // `status` as it is, after marking the channel out of step when it failed.
  absl::Status Broken(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(channel_mu_);

  // One request and its replies at a time: a grant on the control thread may fetch chunks.
  // Declared before arena_, which is destroyed first: its chunk source calls into this client.
  absl::Mutex channel_mu_;
  std::unique_ptr<proto::FrameChannel> channel_;
  uint64_t next_request_id_ = 1;
  absl::Status broken_ ABSL_GUARDED_BY(channel_mu_);
  std::unique_ptr<gpu::Arena> arena_;
  std::unique_ptr<gpu::FlagArray> ready_flags_;
  std::unique_ptr<gpu::FlagArray> drain_flags_;
  uint64_t alignment_ = 0;
  uint64_t lease_alignment_ = 0;
  uint64_t flags_offset_ = 0;
  uint64_t ready_bytes_ = 0;  // the ready words, then the drain words
  uint64_t flags_bytes_ = 0;
};

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_ARENA_CLIENT_H_
