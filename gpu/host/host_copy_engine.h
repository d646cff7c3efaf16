// The host backend's copy engine: one thread that memcpy's groups into the arena in order,
// optionally paced to a bandwidth (token-bucket style, measured from the job's start), and
// publishes each group's ready flag as soon as its bytes are in.
#ifndef PSWITCH_GPU_HOST_HOST_COPY_ENGINE_H_
#define PSWITCH_GPU_HOST_HOST_COPY_ENGINE_H_

#include <deque>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gpu/copy_engine.h"
#include "gpu/host/host_memory.h"
#include "gpu/internal/job_ticket.h"

namespace pswitch::gpu::host {

// Thread-safe. `*arena` must outlive the engine. Destruction cancels queued jobs.
class HostCopyEngine : public CopyEngine {
 public:
  HostCopyEngine(HostArena* arena, double bandwidth_bytes_per_s);
  ~HostCopyEngine() override;

  absl::StatusOr<std::shared_ptr<CopyTicket>> Submit(CopyJob job) override;

 private:
  struct Queued {
    CopyJob job;
    std::shared_ptr<internal::JobTicket> ticket;
  };
  void Run();
  absl::Status Execute(const CopyJob& job, internal::JobTicket& ticket);

  HostArena* const arena_;
  const double bandwidth_bytes_per_s_;

  absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;  // last: starts after everything it uses exists
};

}  // namespace pswitch::gpu::host

#endif  // PSWITCH_GPU_HOST_HOST_COPY_ENGINE_H_
