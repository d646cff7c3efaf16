#include "gpu/cuda/cuda_memory.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gpu/cuda/cuda_check.h"
#include "proto/status.h"

namespace pswitch::gpu::cuda {
namespace {

class CudaFlagArray : public FlagArray {
 public:
  CudaFlagArray(CudaArena* arena, CudaStream* side, const DriverApi* api, uint64_t offset,
                uint32_t count)
      : arena_(arena), side_(side), api_(api), offset_(offset), count_(count) {}

  uint32_t size() const override { return count_; }
  uint64_t arena_offset() const override { return offset_; }
  CUdeviceptr Address(uint32_t index) const {
    return reinterpret_cast<CUdeviceptr>(arena_->base() + offset_) + index * sizeof(uint32_t);
  }

  absl::StatusOr<uint32_t> Load(uint32_t index) const override {
    PSWITCH_RETURN_IF_ERROR(Check(index));
    uint32_t value = 0;
    PSWITCH_RETURN_IF_ERROR(
        PSWITCH_CUDA(cudaMemcpyAsync(&value, arena_->base() + offset_ + index * sizeof(uint32_t),
                                     sizeof(value), cudaMemcpyDeviceToHost, side_->get())));
    PSWITCH_RETURN_IF_ERROR(side_->Synchronize());
    return value;
  }

  absl::Status Store(uint32_t index, uint32_t value) override {
    PSWITCH_RETURN_IF_ERROR(Check(index));
    PSWITCH_RETURN_IF_ERROR(PSWITCH_CU(api_->stream_write_value32(
        side_->get(), Address(index), value, CU_STREAM_WRITE_VALUE_DEFAULT)));
    return side_->Synchronize();
  }

  absl::StatusOr<uint32_t> WaitAtLeast(uint32_t index, uint32_t target,
                                       absl::Duration timeout) const override {
    // CPU-side waits are off the switch's critical path (the device waits on its own), so a
    // polling loop with a growing pause is enough here.
    absl::Time deadline = absl::Now() + timeout;
    absl::Duration pause = absl::Microseconds(2);
    while (true) {
      PSWITCH_ASSIGN_OR_RETURN(uint32_t seen, Load(index));
      if (EpochReached(seen, target)) return seen;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("flag ", index, " still at ", seen, " waiting for ", target));
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Microseconds(200));
    }
  }

 private:
  absl::Status Check(uint32_t index) const {
    if (index >= count_) {
      return absl::OutOfRangeError(absl::StrCat("flag index ", index, " >= ", count_));
    }
    return absl::OkStatus();
  }

  CudaArena* const arena_;
  CudaStream* const side_;
  const DriverApi* const api_;
  const uint64_t offset_;
  const uint32_t count_;
};

}  // namespace

absl::StatusOr<CUdeviceptr> FlagAddress(const FlagArray& flags, uint32_t index) {
  auto* cuda_flags = dynamic_cast<const CudaFlagArray*>(&flags);
  if (cuda_flags == nullptr) return absl::InvalidArgumentError("not a CUDA flag array");
  if (index >= flags.size()) return absl::OutOfRangeError(absl::StrCat("flag index ", index));
  return cuda_flags->Address(index);
}

absl::StatusOr<std::unique_ptr<CudaStream>> CudaStream::Create(const DriverApi* api) {
  cudaStream_t stream = nullptr;
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  return std::unique_ptr<CudaStream>(new CudaStream(stream, api));
}

CudaStream::~CudaStream() { (void)cudaStreamDestroy(stream_); }

absl::Status CudaStream::WaitFlag(const FlagArray& flags, uint32_t index, uint32_t epoch,
                                  absl::Duration /*timeout*/) {
  PSWITCH_ASSIGN_OR_RETURN(CUdeviceptr address, FlagAddress(flags, index));
  return PSWITCH_CU(api_->stream_wait_value32(reinterpret_cast<CUstream>(stream_), address, epoch,
                                              CU_STREAM_WAIT_VALUE_GEQ));
}

absl::Status CudaStream::WriteFlag(FlagArray& flags, uint32_t index, uint32_t value) {
  PSWITCH_ASSIGN_OR_RETURN(CUdeviceptr address, FlagAddress(flags, index));
  return PSWITCH_CU(api_->stream_write_value32(reinterpret_cast<CUstream>(stream_), address, value,
                                               CU_STREAM_WRITE_VALUE_DEFAULT));
}

absl::Status CudaStream::Synchronize() { return PSWITCH_CUDA(cudaStreamSynchronize(stream_)); }

absl::StatusOr<std::unique_ptr<CudaArena>> CudaArena::Create(int device, uint64_t bytes,
                                                             const DriverApi* api) {
  if (bytes == 0) return absl::InvalidArgumentError("arena size must be positive");
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device)));
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> side, CudaStream::Create(api));
  void* base = nullptr;
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaMalloc(&base, bytes)));
  std::unique_ptr<CudaArena> arena(
      new CudaArena(device, static_cast<std::byte*>(base), bytes, /*owner=*/true, std::move(side)));
  PSWITCH_RETURN_IF_ERROR(arena->Fill(0, bytes, 0));
  return arena;
}

absl::StatusOr<std::unique_ptr<CudaArena>> CudaArena::Import(int device, const ArenaHandle& handle,
                                                             const DriverApi* api) {
  if (handle.backend != Backend::kCuda || handle.ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a CUDA IPC arena handle (", handle.ipc_handle.size(), " handle bytes)"));
  }
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaSetDevice(device)));
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> side, CudaStream::Create(api));
  cudaIpcMemHandle_t ipc;
  std::memcpy(&ipc, handle.ipc_handle.data(), sizeof(ipc));
  void* base = nullptr;
  PSWITCH_RETURN_IF_ERROR(
      PSWITCH_CUDA(cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess)));
  return std::unique_ptr<CudaArena>(new CudaArena(
      device, static_cast<std::byte*>(base), handle.size_bytes, /*owner=*/false, std::move(side)));
}

CudaArena::~CudaArena() {
  (void)cudaSetDevice(device_);
  if (owner_) {
    (void)cudaFree(base_);
  } else {
    (void)cudaIpcCloseMemHandle(base_);
  }
}

absl::StatusOr<ArenaHandle> CudaArena::Export() const {
  if (!owner_) return absl::FailedPreconditionError("only the arena's creator can export it");
  cudaIpcMemHandle_t ipc;
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaIpcGetMemHandle(&ipc, base_)));
  ArenaHandle handle;
  handle.backend = Backend::kCuda;
  handle.device_ordinal = device_;
  handle.size_bytes = size_bytes_;
  handle.ipc_handle.assign(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
  return handle;
}

absl::Status CudaArena::Fill(uint64_t offset, uint64_t bytes, uint8_t value) {
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, bytes));
  PSWITCH_RETURN_IF_ERROR(
      PSWITCH_CUDA(cudaMemsetAsync(base_ + offset, value, bytes, side_stream_->get())));
  return side_stream_->Synchronize();
}

absl::Status CudaArena::CopyToHost(uint64_t offset, std::span<std::byte> out) {
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, out.size()));
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaMemcpyAsync(
      out.data(), base_ + offset, out.size(), cudaMemcpyDeviceToHost, side_stream_->get())));
  return side_stream_->Synchronize();
}

absl::Status CudaArena::CopyFromHost(uint64_t offset, std::span<const std::byte> in) {
  PSWITCH_RETURN_IF_ERROR(CheckRange(offset, in.size()));
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaMemcpyAsync(
      base_ + offset, in.data(), in.size(), cudaMemcpyHostToDevice, side_stream_->get())));
  return side_stream_->Synchronize();
}

absl::StatusOr<std::unique_ptr<FlagArray>> CudaArena::Flags(uint64_t offset, uint32_t count) {
  PSWITCH_RETURN_IF_ERROR(CheckFlagPlacement(offset, count));
  PSWITCH_ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  return std::make_unique<CudaFlagArray>(this, side_stream_.get(), api, offset, count);
}

absl::StatusOr<std::unique_ptr<CudaHostBuffer>> CudaHostBuffer::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("pinned buffer size must be positive");
  void* data = nullptr;
  PSWITCH_RETURN_IF_ERROR(PSWITCH_CUDA(cudaHostAlloc(&data, bytes, cudaHostAllocPortable)));
  return std::unique_ptr<CudaHostBuffer>(new CudaHostBuffer(static_cast<std::byte*>(data), bytes));
}

CudaHostBuffer::~CudaHostBuffer() { (void)cudaFreeHost(data_); }

}  // namespace pswitch::gpu::cuda
