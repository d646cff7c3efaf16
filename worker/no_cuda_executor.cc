// The CUDA executor where this libtorch has no CUDA (Debian's 1.13): workers run on the host
// backend only, and saying so is the whole of it.
#include "worker/backends.h"
#include "worker/executor.h"

namespace pswitch::worker {

absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const ExecutorOptions&) {
  return CheckWorkerBackend(gpu::Backend::kCuda);
}

}  // namespace pswitch::worker
