// libtorch's side of a worker's compute stream. The gate hook enqueues each group's ready-flag
// wait (cuStreamWaitValue32) on the worker's gpu::Stream; for that wait to order the layers
// behind it, libtorch must enqueue the layers' kernels on the same stream. While a
// ComputeStreamScope lives, that stream is libtorch's current CUDA stream on the calling thread,
// so no CPU round trip sits between a group's arrival and the kernels that use it. Autograd runs
// each backward op on its forward op's stream, so training's backward pass follows too.
#ifndef PSWITCH_WORKER_CUDA_COMPUTE_STREAM_H_
#define PSWITCH_WORKER_CUDA_COMPUTE_STREAM_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/device.h"

namespace pswitch::worker::cuda {

// Not thread-safe: use it on the thread that runs the task, and destroy it there.
class ComputeStreamScope {
 public:
  // Makes `stream` (a CUDA-backend stream on device `device_ordinal`, which must outlive the
  // scope) the current CUDA stream and device for libtorch on this thread. InvalidArgument for a
  // stream without a CUDA handle (host backend).
  static absl::StatusOr<std::unique_ptr<ComputeStreamScope>> Enter(const gpu::Stream& stream,
                                                                   int device_ordinal);
  // Restores the stream and device that were current before.
  ~ComputeStreamScope();
  ComputeStreamScope(const ComputeStreamScope&) = delete;
  ComputeStreamScope& operator=(const ComputeStreamScope&) = delete;

  // The task's synchronisation point: returns once every kernel enqueued on the stream (forward,
  // backward, optimizer step, the copies of its outputs) has finished, so the arena holds the
  // task's final weights for a checkpoint read by another process and nothing of it is in flight
  // when the worker reports a drain. Errors of asynchronous kernels surface here, naming the
  // task `what`. DeadlineExceeded after `timeout`: a ready flag that is never written (a
  // transmission cancelled without forcing its flags forward) leaves the stream waiting forever.
  absl::Status Synchronize(const std::string& what, absl::Duration timeout) const;

 private:
  struct Guard;  // c10::cuda::CUDAStreamGuard, kept out of this header (no CUDA headers above gpu/)
  explicit ComputeStreamScope(std::unique_ptr<Guard> guard);
  std::unique_ptr<Guard> guard_;
};

}  // namespace pswitch::worker::cuda

#endif  // PSWITCH_WORKER_CUDA_COMPUTE_STREAM_H_
