#include "worker/backends.h"

namespace pswitch::worker {

absl::Status CheckWorkerBackend(gpu::Backend backend) {
  if (backend == gpu::Backend::kHost || PSWITCH_WORKER_CUDA) return absl::OkStatus();
  return absl::UnimplementedError(
      "workers cannot execute on the CUDA backend in this build: its libtorch is CPU-only (build "
      "against pip's CUDA torch, see tools/gpu/build.sh); use --backend host");
}

}  // namespace pswitch::worker
