#include "gpu/cuda/driver_api.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "gpu/cuda/cuda_check.h"
#include "base/status.h"

namespace pswitch::gpu::cuda {
namespace {

// Stream memory operations with their CUDA 12 semantics (on by default, no module parameter).
constexpr unsigned int kDriverApiVersion = 12000;

absl::StatusOr<DriverApi> Load() {
  DriverApi api;
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuStreamWaitValue32", &api.stream_wait_value32));
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuStreamWriteValue32", &api.stream_write_value32));
  return api;
}

absl::StatusOr<VmmApi> LoadVmm() {
  VmmApi api;
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuMemCreate", &api.create));
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuMemRelease", &api.release));
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuMemExportToShareableHandle", &api.export_handle));
  PSWITCH_RETURN_IF_ERROR(
      ResolveDriverSymbol("cuMemImportFromShareableHandle", &api.import_handle));
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuMemAddressReserve", &api.address_reserve));
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuMemAddressFree", &api.address_free));
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuMemMap", &api.map));
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuMemUnmap", &api.unmap));
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuMemSetAccess", &api.set_access));
  PSWITCH_RETURN_IF_ERROR(ResolveDriverSymbol("cuMemGetAllocationGranularity", &api.granularity));
  return api;
}

}  // namespace

absl::Status ResolveDriverSymbol(const char* symbol, void** fn) {
  cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
  PSWITCH_RETURN_IF_ERROR(CudaStatus(
      cudaGetDriverEntryPointByVersion(symbol, fn, kDriverApiVersion, cudaEnableDefault, &query),
      absl::StrCat("cudaGetDriverEntryPointByVersion(", symbol, ")")));
  if (query != cudaDriverEntryPointSuccess || *fn == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA driver has no entry point ", symbol, " (driver too old?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const VmmApi*> GetVmmApi() {
  static const absl::StatusOr<VmmApi>* const api = new absl::StatusOr<VmmApi>(LoadVmm());
  if (!api->ok()) return api->status();
  return &**api;
}

absl::StatusOr<const DriverApi*> GetDriverApi() {
  static const absl::StatusOr<DriverApi>* const api = new absl::StatusOr<DriverApi>(Load());
  if (!api->ok()) return api->status();
  return &**api;
}

absl::Status CudaStatus(cudaError_t result, absl::string_view call) {
  if (result == cudaSuccess) return absl::OkStatus();
  absl::StatusCode code = result == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted
                          : (result == cudaErrorNoDevice || result == cudaErrorInsufficientDriver)
                              ? absl::StatusCode::kFailedPrecondition
                              : absl::StatusCode::kInternal;
  return absl::Status(
      code, absl::StrCat(call, ": ", cudaGetErrorName(result), ": ", cudaGetErrorString(result)));
}

absl::Status DriverStatus(CUresult result, absl::string_view call) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  absl::StatusCode code = result == CUDA_ERROR_OUT_OF_MEMORY ? absl::StatusCode::kResourceExhausted
                                                             : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(call, ": CUresult ", static_cast<int>(result)));
}

}  // namespace pswitch::gpu::cuda
