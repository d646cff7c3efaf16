// The CUDA executor where this libtorch has no CUDA (Debian's 1.13): workers run on the host
// backend only, and saying so is the whole of it.
#include "worker/executor.h"

namespace pswitch::worker {

absl::Status CudaExecutionBuilt() {
  return absl::UnimplementedError(
      "workers cannot execute on the CUDA backend in this build: its libtorch is CPU-only (build "
      "against pip's CUDA torch, see tools/gpu/build.sh); use --backend host");
}

absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const ExecutorOptions&) {
  return CudaExecutionBuilt();
}

}  // namespace pswitch::worker
