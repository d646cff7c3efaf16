// The CUDA executor: task tensors on the arena's device, their memory from the activation lease
// (CudaLeaseAllocator), their kernels on the worker's stream behind the gates' flag waits.
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "worker/cuda/arena_device.h"
#include "worker/cuda/compute_stream.h"
#include "worker/cuda/cuda_lease_allocator.h"
#include "worker/cuda/cuda_region_device.h"
#include "worker/executor.h"

namespace pswitch::worker {
namespace {

class CudaSection final : public ComputeSection {
 public:
  explicit CudaSection(std::unique_ptr<cuda::ComputeStreamScope> scope)
      : scope_(std::move(scope)) {}
  absl::Status Synchronize(const std::string& what, absl::Duration timeout) override {
    return scope_->Synchronize(what, timeout);
  }

 private:
  std::unique_ptr<cuda::ComputeStreamScope> scope_;
};

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(cuda::CudaLeaseAllocator* activations, c10::Device device)
      : activations_(activations),
        device_(device),
        regions_(cuda::CreateCudaRegionDevice(device.index())) {}
  c10::Device tensor_device() const override { return device_; }
  void SetActivationLimit(uint64_t bytes) override { activations_->set_limit(bytes); }
  void MarkActivationsPersistent() override { activations_->MarkPersistent(); }
  void NewActivationOwner() override { activations_->NewOwner(); }
  uint64_t DirtyActivationBytes() const override { return activations_->dirty_bytes(); }
  LeaseAllocator* host_activations() const override { return nullptr; }
  absl::StatusOr<std::unique_ptr<ComputeSection>> Enter(gpu::Stream& stream) override {
    PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<cuda::ComputeStreamScope> scope,
                             cuda::ComputeStreamScope::Enter(stream, device_.index()));
    return std::unique_ptr<ComputeSection>(std::make_unique<CudaSection>(std::move(scope)));
  }
  RegionDevice& region_device() override { return *regions_; }

 private:
  cuda::CudaLeaseAllocator* const activations_;  // process lifetime
  const c10::Device device_;
  const std::unique_ptr<RegionDevice> regions_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const ExecutorOptions& options) {
  if (options.lease_base == nullptr || options.lease_bytes == 0) {
    // The memdaemon holds (almost) all device memory: libtorch's own allocator would fail.
    return absl::InvalidArgumentError("CUDA workers need an activation lease (activation_bytes)");
  }
  // Before anything initialises libtorch's CUDA state (ArenaTensorDevice does).
  PSWITCH_ASSIGN_OR_RETURN(cuda::CudaLeaseAllocator * activations,
                           cuda::CudaLeaseAllocator::Install(options.lease_base,
                                                             options.lease_bytes,
                                                             options.device_ordinal));
  // Asked of the lease: the only part of the arena a restricted worker always has mapped.
  PSWITCH_ASSIGN_OR_RETURN(c10::Device device,
                           cuda::ArenaTensorDevice(options.lease_base, options.device_ordinal));
  return std::unique_ptr<Executor>(std::make_unique<CudaExecutor>(activations, device));
}

}  // namespace pswitch::worker
