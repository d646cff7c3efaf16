// CUDA backend tests: run on a machine with a GPU, skipped (with the reason) elsewhere.
#include <cstring>
#include <vector>

#include "gpu/device.h"
#include "gtest/gtest.h"

namespace pswitch::gpu {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaBackendBuilt()) GTEST_SKIP() << "built without the CUDA backend";
    DeviceOptions options;
    options.backend = Backend::kCuda;
    auto device = Device::Open(options);
    if (!device.ok()) GTEST_SKIP() << "no usable GPU: " << device.status();
    device_ = std::move(*device);
  }
  std::unique_ptr<Device> device_;
};

TEST_F(CudaDeviceTest, CopiesGroupsAndReleasesAStreamWaitingOnTheirFlags) {
  auto arena = device_->CreateArena(64 << 20);
  auto pinned = device_->AllocatePinned(16 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  auto flags = (*arena)->Flags(0, 32);
  auto engine = device_->CreateCopyEngine(**arena);
  auto stream = device_->CreateStream();
  ASSERT_TRUE(flags.ok() && engine.ok() && stream.ok());
  for (size_t i = 0; i < (16u << 20); ++i) (*pinned)->data()[i] = std::byte(i * 13 + 1);

  CopyJob job;
  job.epoch = 5;
  job.ready_flags = flags->get();
  for (int g = 0; g < 16; ++g) {
    job.groups.push_back(
        CopyGroup{{CopySpan{(*pinned)->data() + (g << 20), (8u << 20) + (g << 20), 1 << 20}}});
  }
  // The compute stream waits on the device for the last group, then signals flag 31.
  ASSERT_TRUE((*stream)->WaitFlag(**flags, 15, 5, absl::Seconds(10)).ok());
  ASSERT_TRUE((*stream)->WriteFlag(**flags, 31, 5).ok());
  auto ticket = (*engine)->Submit(std::move(job));
  ASSERT_TRUE(ticket.ok());
  auto timings = (*ticket)->Wait();
  ASSERT_TRUE(timings.ok()) << timings.status();
  EXPECT_TRUE((*flags)->WaitReady(31, 5, absl::Seconds(10)).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  std::vector<std::byte> out(16 << 20);
  ASSERT_TRUE((*arena)->CopyToHost(8 << 20, out).ok());
  EXPECT_EQ(std::memcmp(out.data(), (*pinned)->data(), out.size()), 0);
  auto handle = (*arena)->Export();
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(handle->ipc_handle.size(), 64u);
}

TEST(CudaBackendTest, OpeningWithoutAGpuFailsClearly) {
  DeviceOptions options;
  options.backend = Backend::kCuda;
  auto device = Device::Open(options);
  if (device.ok()) GTEST_SKIP() << "a GPU is present: " << (*device)->description();
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition) << device.status();
}

}  // namespace
}  // namespace pswitch::gpu
