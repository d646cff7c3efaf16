// The CUDA backend: a cudaMalloc arena shared by IPC handle, cudaHostAlloc pinned buffers, a
// copy engine on a dedicated non-blocking stream, and ready/drain flags written and awaited on
// the device with cuStreamWriteValue32 / cuStreamWaitValue32 so no CPU round trip sits between
// a group's copy and the compute that needs it.
#ifndef PSWITCH_GPU_CUDA_CUDA_DEVICE_H_
#define PSWITCH_GPU_CUDA_CUDA_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace pswitch::gpu {

// FailedPrecondition when no driver or device is present.
absl::StatusOr<std::unique_ptr<Device>> OpenCudaDevice(const DeviceOptions& options);

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_CUDA_CUDA_DEVICE_H_
