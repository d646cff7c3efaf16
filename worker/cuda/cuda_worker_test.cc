// CUDA worker tests: built against a CUDA libtorch, run on a machine with a GPU, skipped (with
// the reason) elsewhere. The lease allocator is process-wide and must be installed before the
// first CUDA allocation, so one shared fixture sets up the device, the arena and the allocator.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gpu/device.h"
#include "gtest/gtest.h"
#include "memdaemon/weight_layout.h"
#include "memdaemon/weight_store.h"
#include "models/registry.h"
#include "worker/cuda/arena_device.h"
#include "worker/cuda/compute_stream.h"
#include "worker/cuda/cuda_lease_allocator.h"
#include "worker/host_tensors.h"
#include "worker/model_binding.h"

namespace pswitch::worker::cuda {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kArenaBytes = 256 << 20;
// [0, 16 MiB): flags and model weights; [16 MiB, 208 MiB): the activation lease, which must hold
// libtorch's cuBLASLt workspace (32 MiB on Hopper, seen on the H100) beside the activations.
constexpr uint64_t kLeaseOffset = 16 << 20;
constexpr uint64_t kLeaseBytes = 192 << 20;

struct Gpu {
  std::string skip;  // why the tests cannot run here
  std::unique_ptr<gpu::Device> device;
  std::unique_ptr<gpu::Arena> arena;
  CudaLeaseAllocator* allocator = nullptr;
  bool InLease(const void* p) const {
    auto* b = static_cast<const std::byte*>(p);
    return b >= arena->base() + kLeaseOffset && b < arena->base() + kLeaseOffset + kLeaseBytes;
  }
};

Gpu& Get() {
  static Gpu* gpu = [] {
    auto* g = new Gpu();
    gpu::DeviceOptions options;
    options.backend = gpu::Backend::kCuda;
    auto device = gpu::Device::Open(options);
    if (!device.ok()) {
      g->skip = "no usable GPU: " + device.status().ToString();
      return g;
    }
    g->device = std::move(*device);
    auto arena = g->device->CreateArena(kArenaBytes);
    if (!arena.ok()) {
      g->skip = "cannot create an arena: " + arena.status().ToString();
      return g;
    }
    g->arena = std::move(*arena);
    auto allocator = CudaLeaseAllocator::Install(g->arena->base() + kLeaseOffset, kLeaseBytes, 0);
    if (!allocator.ok()) {
      g->skip = "cannot install the allocator: " + allocator.status().ToString();
      return g;
    }
    g->allocator = *allocator;
    return g;
  }();
  return *gpu;
}

class CudaWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu::CudaBackendBuilt()) GTEST_SKIP() << "built without the CUDA backend";
    if (!Get().skip.empty()) GTEST_SKIP() << Get().skip;
  }
};

TEST_F(CudaWorkerTest, ServesTensorsFromTheLeaseAndFailsClearlyBeyondIt) {
  Gpu& g = Get();
  const uint64_t before = g.allocator->in_use_bytes();
  {
    at::Tensor a = at::empty({1 << 20}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
    EXPECT_TRUE(g.InLease(a.data_ptr()));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 512, 0u);
    EXPECT_GE(g.allocator->in_use_bytes(), before + (4u << 20));
    try {
      at::Tensor too_big = at::empty({static_cast<int64_t>(kLeaseBytes)},
                                     at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
      ADD_FAILURE() << "allocation beyond the lease succeeded";
    } catch (const c10::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("activation lease exhausted"));
    }
    g.allocator->set_limit(before + (5u << 20));
    try {
      at::Tensor capped =
          at::empty({2 << 20}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
      ADD_FAILURE() << "allocation beyond the task memory cap succeeded";
    } catch (const c10::Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("task memory cap"));
    }
    g.allocator->set_limit(0);
  }
  EXPECT_EQ(g.allocator->in_use_bytes(), before);
}

// Issue 27: a block another owner touched comes back zeroed on the device (cudaMemsetAsync on
// the compute stream), never holding the earlier owner's bytes; the same owner's blocks are not
// cleared. Prints what the clearing cost against the same owner's allocation, same run.
TEST_F(CudaWorkerTest, BlocksAnotherOwnerTouchedComeBackZeroedOnTheDevice) {
  Gpu& g = Get();
  constexpr int64_t kElements = 16 << 20;  // 64 MiB of floats
  auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  auto timed_empty = [&options](double* ms) {
    c10::cuda::getCurrentCUDAStream().synchronize();
    const auto start = std::chrono::steady_clock::now();
    at::Tensor t = at::empty({kElements}, options);
    c10::cuda::getCurrentCUDAStream().synchronize();
    *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
    return t;
  };
  {
    at::Tensor secret = at::full({kElements}, 7.0f, options);
    c10::cuda::getCurrentCUDAStream().synchronize();
  }
  double same_ms = 0, other_ms = 0;
  {
    at::Tensor again = timed_empty(&same_ms);  // the same owner: its own bytes, not cleared
    EXPECT_EQ(again.max().item<float>(), 7.0f) << "a block is cleared for its own owner";
  }
  g.allocator->NewOwner();
  EXPECT_GE(g.allocator->dirty_bytes(), static_cast<uint64_t>(kElements) * 4);
  {
    at::Tensor next = timed_empty(&other_ms);
    EXPECT_EQ(next.abs().max().item<float>(), 0.0f) << "another owner's bytes leaked";
  }
  std::printf("lease clear, 64 MiB: same owner %.3f ms, another owner %.3f ms (+%.3f ms)\n",
              same_ms, other_ms, other_ms - same_ms);
}

TEST_F(CudaWorkerTest, BindsAModelAtArenaOffsetsAndRunsItOnTheGpu) {
  Gpu& g = Get();
  auto device = ArenaTensorDevice(g.arena->base(), 0);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(*device, c10::Device(c10::kCUDA, 0));
  std::vector<float> host(64);
  EXPECT_EQ(ArenaTensorDevice(host.data(), 0).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // The controller's side: the model's registered layout and its bytes, copied into the arena.
  auto reference = models::CreateModel("tiny_cnn");
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto weights = CollectWeights(**reference, "tiny_cnn");
  ASSERT_TRUE(weights.ok()) << weights.status();
  std::vector<memdaemon::LayerSpec> specs = memdaemon::LayerSpecsOf(weights->bytes);
  auto layout = memdaemon::ComputeWeightLayout(specs);
  ASSERT_TRUE(layout.ok()) << layout.status();
  constexpr uint64_t kRegion = 1 << 20;
  ASSERT_LE(kRegion + layout->total_bytes, kLeaseOffset);
  for (size_t l = 0; l < weights->bytes.layers.size(); ++l) {
    for (size_t t = 0; t < weights->bytes.layers[l].tensors.size(); ++t) {
      ASSERT_TRUE(g.arena
                      ->CopyFromHost(kRegion + layout->placements[l][t].offset,
                                     weights->bytes.layers[l].tensors[t].bytes)
                      .ok());
    }
  }

  auto bound =
      BoundModel::Create(models::ModelSource{"tiny_cnn", nullptr, ""}, "tiny_cnn",
                         g.arena->base() + kRegion, static_cast<uint32_t>(specs.size()),
                         layout->total_bytes, *device);
  ASSERT_TRUE(bound.ok()) << bound.status();
  for (const at::Tensor& p : (*bound)->model().parameters()) {
    EXPECT_TRUE(p.is_cuda());
    auto* b = static_cast<const std::byte*>(p.data_ptr());
    EXPECT_TRUE(b >= g.arena->base() + kRegion &&
                b < g.arena->base() + kRegion + layout->total_bytes);
  }
  (*bound)->model().eval();
  (*reference)->eval();
  torch::NoGradGuard no_grad;
  // Parity at 1e-4 needs full fp32 on the GPU: cuDNN convolutions default to TF32 on Hopper
  // (10-bit mantissa, ~1e-3 relative error). The server keeps libtorch's defaults (TF32 in
  // cuDNN, not in cuBLAS matmuls); this test checks the binding, not TF32's accuracy.
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  models::ModelInput input = (*reference)->ExampleInput(2, 7);
  at::Tensor expected = (*reference)->Forward(input).output;
  at::Tensor got = (*bound)->model().Forward(ModelInputOn(input, *device)).output;
  EXPECT_TRUE(got.is_cuda());
  EXPECT_TRUE(g.InLease(got.data_ptr()));  // intermediate and output tensors come from the lease
  EXPECT_TRUE(at::allclose(got.cpu(), expected, 1e-4, 1e-5));
}

TEST_F(CudaWorkerTest, KernelsOnTheComputeStreamWaitForTheReadyFlag) {
  Gpu& g = Get();
  auto flags = g.arena->Flags(0, 4);
  auto stream = g.device->CreateStream();
  ASSERT_TRUE(flags.ok() && stream.ok());
  ASSERT_TRUE((*flags)->Store(0, 0).ok());
  auto scope = ComputeStreamScope::Enter(**stream, 0);
  ASSERT_TRUE(scope.ok()) << scope.status();
  EXPECT_EQ(static_cast<void*>(c10::cuda::getCurrentCUDAStream(0).stream()),
            (*stream)->native_handle());

  // This test's kernels once before any wait: CUDA loads a kernel's module lazily at its first
  // launch, and that load synchronises the context, so a first launch behind a stream wait that
  // only this thread will release deadlocks (seen on the H100). Workers warm their models for
  // the same reason.
  {
    at::Tensor warm = at::ones({1024}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
    warm.add_(1);
    ASSERT_EQ(warm.sum().item<float>(), 2048.0f);
  }
  // The gate's wait, then a layer's kernels, all enqueued without the CPU waiting.
  ASSERT_TRUE((*stream)->WaitFlag(**flags, 0, 1, absl::Seconds(10)).ok());
  at::Tensor x = at::ones({1024}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  x.add_(1);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(c10::cuda::getCurrentCUDAStream(0).query()) << "kernels ran before the flag";
  EXPECT_EQ((*flags)->Load(0).value_or(99), 0u);

  absl::Status stuck = (*scope)->Synchronize("test task", absl::Milliseconds(20));
  EXPECT_EQ(stuck.code(), absl::StatusCode::kDeadlineExceeded) << stuck;

  ASSERT_TRUE((*flags)->Store(0, 1).ok());  // the copy engine's write, from the CPU here
  ASSERT_TRUE((*scope)->Synchronize("test task", absl::Seconds(10)).ok());
  EXPECT_EQ(x.sum().item<float>(), 2048.0f);
  scope->reset();
  EXPECT_NE(static_cast<void*>(c10::cuda::getCurrentCUDAStream(0).stream()),
            (*stream)->native_handle());
}

TEST(CudaWorkerHostTest, TheComputeStreamNeedsACudaStream) {
  gpu::DeviceOptions options;
  options.backend = gpu::Backend::kHost;
  options.lock_host_memory = false;
  auto device = gpu::Device::Open(options);
  ASSERT_TRUE(device.ok()) << device.status();
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ(ComputeStreamScope::Enter(**stream, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::worker::cuda
