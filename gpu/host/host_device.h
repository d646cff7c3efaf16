// The host backend: device memory is a memfd mapping shared by fd passing, pinned buffers are
// mlock'd pages, flags are atomics in the shared mapping with futex waits, and the copy engine is
// a thread that can pace itself to a PCIe-like bandwidth. Same protocol as the CUDA backend, so
// everything above gpu/ runs unchanged on machines without a GPU.
#ifndef PSWITCH_GPU_HOST_HOST_DEVICE_H_
#define PSWITCH_GPU_HOST_HOST_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace pswitch::gpu {

absl::StatusOr<std::unique_ptr<Device>> OpenHostDevice(const DeviceOptions& options);

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_HOST_HOST_DEVICE_H_
