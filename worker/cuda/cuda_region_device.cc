#include "worker/cuda/cuda_region_device.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"
#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/driver_api.h"

namespace pswitch::worker::cuda {
namespace {

// Makes `device` the calling thread's current CUDA device while it lives.
class DeviceScope {
 public:
  static absl::StatusOr<DeviceScope> Enter(int device) {
    int previous = 0;
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaGetDevice(&previous)));
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device)));
    return DeviceScope(previous);
  }
  DeviceScope(DeviceScope&& other) noexcept : previous_(other.previous_) { other.previous_ = -1; }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  DeviceScope& operator=(DeviceScope&&) = delete;
  ~DeviceScope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);  // it was current a moment ago
  }

 private:
  explicit DeviceScope(int previous) : previous_(previous) {}
  int previous_;
};

void LogRelease(const absl::Status& status) {
  if (!status.ok()) {
    base::Log(base::LogLevel::kWarn, "region_release_failed")
        .Field("error", std::string(status.message()));
  }
}

class HostRegistration final : public DeviceAttachment {
 public:
  explicit HostRegistration(void* base) : base_(base) {}
  ~HostRegistration() override { LogRelease(PSWITCH_CUDA(cudaHostUnregister(base_))); }
  std::byte* device_data() const override { return nullptr; }

 private:
  void* const base_;
};

class IpcMapping final : public DeviceAttachment {
 public:
  explicit IpcMapping(void* data) : data_(data) {}
  ~IpcMapping() override { LogRelease(PSWITCH_CUDA(cudaIpcCloseMemHandle(data_))); }
  std::byte* device_data() const override { return static_cast<std::byte*>(data_); }

 private:
  void* const data_;
};

// The size of the device allocation at `ptr`, through the driver entry point cudart resolves
// (gpu/cuda/driver_api.h explains why libcuda is not linked): cudart has no equivalent.
absl::StatusOr<size_t> AllocationBytes(void* ptr) {
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  // Resolved once; a driver without it fails each call alike.
  static const auto* const resolved =
      new absl::StatusOr<GetAddressRange>([]() -> absl::StatusOr<GetAddressRange> {
        GetAddressRange fn = nullptr;
        PSWITCH_RETURN_IF_ERROR(gpu::cuda::ResolveDriverSymbol("cuMemGetAddressRange", &fn));
        return fn;
      }());
  PSWITCH_ASSIGN_OR_RETURN(const GetAddressRange get_range, *resolved);
  CUdeviceptr base = 0;
  size_t bytes = 0;
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CU(get_range(&base, &bytes, reinterpret_cast<CUdeviceptr>(ptr))));
  // The handle names its allocation's start; what lies before `ptr` is not the region's.
  return bytes - static_cast<size_t>(reinterpret_cast<CUdeviceptr>(ptr) - base);
}

class CudaRegionDevice final : public RegionDevice {
 public:
  explicit CudaRegionDevice(int device_ordinal) : device_ordinal_(device_ordinal) {}

  absl::StatusOr<std::unique_ptr<DeviceAttachment>> RegisterHostMemory(std::byte* base,
                                                                       uint64_t bytes,
                                                                       bool read_only) override {
    PSWITCH_ASSIGN_OR_RETURN(DeviceScope scope, DeviceScope::Enter(device_ordinal_));
    // Portable: the registration holds for every context, not only the one current now.
    unsigned int flags = cudaHostRegisterPortable;
    if (read_only) flags |= cudaHostRegisterReadOnly;
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaHostRegister(base, bytes, flags)));
    return std::unique_ptr<DeviceAttachment>(std::make_unique<HostRegistration>(base));
  }

  absl::StatusOr<std::unique_ptr<DeviceAttachment>> OpenCudaIpc(absl::string_view handle,
                                                                int device,
                                                                uint64_t bytes) override {
    cudaIpcMemHandle_t ipc;
    if (handle.size() != sizeof(ipc)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a CUDA IPC handle has ", sizeof(ipc), " bytes, not ", handle.size()));
    }
    std::memcpy(&ipc, handle.data(), sizeof(ipc));
    // Opened in this worker's context; an allocation of another GPU is reached by peer access.
    PSWITCH_ASSIGN_OR_RETURN(DeviceScope scope, DeviceScope::Enter(device_ordinal_));
    void* data = nullptr;
    PSWITCH_RETURN_IF_ERROR(
        PSWITCH_CUDA(cudaIpcOpenMemHandle(&data, ipc, cudaIpcMemLazyEnablePeerAccess)));
    auto mapping = std::make_unique<IpcMapping>(data);
    PSWITCH_ASSIGN_OR_RETURN(const size_t available, AllocationBytes(data));
    if (available < bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA shared memory of ", bytes, " bytes was declared, but the allocation of device ",
          device, " behind the handle holds ", available));
    }
    return std::unique_ptr<DeviceAttachment>(std::move(mapping));
  }

 private:
  const int device_ordinal_;
};

}  // namespace

std::unique_ptr<RegionDevice> CreateCudaRegionDevice(int device_ordinal) {
  return std::make_unique<CudaRegionDevice>(device_ordinal);
}

}  // namespace pswitch::worker::cuda
