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

// One driver entry point by name, with its CUDA 12 semantics, for a caller that resolves it on
// its own (once, in a static); FailedPrecondition when the driver lacks it.
absl::Status ResolveDriverSymbol(const char* symbol, void** fn);
template <typename Fn>
absl::Status ResolveDriverSymbol(const char* symbol, Fn** fn) {
  return ResolveDriverSymbol(symbol, reinterpret_cast<void**>(fn));
}

// The virtual memory management calls behind a VMM arena (gpu/cuda/vmm_memory.h): physical
// memory exported as a file descriptor and mapped per range in each process. Resolved apart from
// DriverApi, so a driver without them fails only the arena that needs them.
struct VmmApi {
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*export_handle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                            unsigned long long) = nullptr;
  CUresult (*import_handle)(CUmemGenericAllocationHandle*, void*,
                            CUmemAllocationHandleType) = nullptr;
  CUresult (*address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                              unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*,
                          CUmemAllocationGranularity_flags) = nullptr;
};

absl::StatusOr<const VmmApi*> GetVmmApi();

}  // namespace pswitch::gpu::cuda

#endif  // PSWITCH_GPU_CUDA_DRIVER_API_H_
