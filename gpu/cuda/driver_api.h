// The few CUDA driver API entry points pswitch uses (stream memory operations), resolved at run
// time through cudart's cudaGetDriverEntryPointByVersion. Linking libcuda directly would make
// every binary that contains the CUDA backend fail to start on machines without the NVIDIA
// driver (CI, host-backend nodes); resolving lazily keeps one binary for both backends, as
// PyTorch does for the same reason.
#ifndef PSWITCH_GPU_CUDA_DRIVER_API_H_
#define PSWITCH_GPU_CUDA_DRIVER_API_H_

#include <cuda.h>

#include "absl/status/statusor.h"

namespace pswitch::gpu::cuda {

struct DriverApi {
  CUresult (*stream_wait_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*stream_write_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
};

// Resolved once per process; FailedPrecondition naming the missing symbol otherwise.
absl::StatusOr<const DriverApi*> GetDriverApi();

}  // namespace pswitch::gpu::cuda

#endif  // PSWITCH_GPU_CUDA_DRIVER_API_H_
