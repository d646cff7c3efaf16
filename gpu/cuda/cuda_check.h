// Turns CUDA runtime and driver results into absl::Status naming the call. Every CUDA call in
// gpu/cuda goes through one of these; no return code is ignored.
#ifndef PSWITCH_GPU_CUDA_CUDA_CHECK_H_
#define PSWITCH_GPU_CUDA_CUDA_CHECK_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pswitch::gpu::cuda {

absl::Status CudaStatus(cudaError_t result, absl::string_view call);
absl::Status DriverStatus(CUresult result, absl::string_view call);

}  // namespace pswitch::gpu::cuda

#define PSWITCH_CUDA(call) ::pswitch::gpu::cuda::CudaStatus((call), #call)
#define PSWITCH_CU(call) ::pswitch::gpu::cuda::DriverStatus((call), #call)

#endif  // PSWITCH_GPU_CUDA_CUDA_CHECK_H_
