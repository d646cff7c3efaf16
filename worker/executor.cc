#include "worker/executor.h"

#include <c10/core/CPUAllocator.h>

#include "worker/lease_allocator.h"
#include "worker/region_map.h"

namespace pswitch::worker {
namespace {

// The CPU computes each op as it is called: no stream, no section.
class HostExecutor final : public Executor {
 public:
  explicit HostExecutor(LeaseAllocator* activations) : activations_(activations) {}
  c10::Device tensor_device() const override { return c10::Device(c10::kCPU); }
  void SetActivationLimit(uint64_t bytes) override {
    if (activations_ != nullptr) activations_->set_limit(bytes);
  }
  void MarkActivationsPersistent() override {}
  void NewActivationOwner() override {
    if (activations_ != nullptr) activations_->NewOwner();
  }
  uint64_t DirtyActivationBytes() const override {
    return activations_ != nullptr ? activations_->dirty_bytes() : 0;
  }
  LeaseAllocator* host_activations() const override { return activations_; }
  absl::StatusOr<std::unique_ptr<ComputeSection>> Enter(gpu::Stream&) override {
    return std::unique_ptr<ComputeSection>();
  }
  RegionDevice& region_device() override { return HostRegionDevice(); }

 private:
  LeaseAllocator* const activations_;  // process lifetime: tensors it served may outlive us
};

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> CreateExecutor(const ExecutorOptions& options) {
  if (options.backend == gpu::Backend::kCuda) return CreateCudaExecutor(options);
  LeaseAllocator* activations = nullptr;
  if (options.lease_base != nullptr) {
    activations = LeaseAllocator::Install(options.lease_base, options.lease_bytes,
                                          c10::GetDefaultCPUAllocator());
  }
  return std::make_unique<HostExecutor>(activations);
}

}  // namespace pswitch::worker
