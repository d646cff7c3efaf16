// The CUDA backend's side of mapped transfer regions (worker/region_map.h): a mapping that can
// never fault is page-locked once (cudaHostRegister), so host<->device copies with it are
// asynchronous DMA on the compute stream; a client's device allocation (Triton CUDA shared
// memory) is opened from its IPC handle. Both are undone when the region is unmapped.
#ifndef PSWITCH_WORKER_CUDA_CUDA_REGION_DEVICE_H_
#define PSWITCH_WORKER_CUDA_CUDA_REGION_DEVICE_H_

#include <memory>

#include "worker/region_map.h"

namespace pswitch::worker::cuda {

// The RegionDevice of the worker computing on CUDA device `device_ordinal`. Thread-safe as the
// CUDA runtime is; it sets the calling thread's current device for each call and restores it.
std::unique_ptr<RegionDevice> CreateCudaRegionDevice(int device_ordinal);

}  // namespace pswitch::worker::cuda

#endif  // PSWITCH_WORKER_CUDA_CUDA_REGION_DEVICE_H_
