// CUDA backend tests: run on a machine with a GPU, skipped (with the reason) elsewhere.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/synchronization/notification.h"
#include "base/clock.h"
#include "gpu/device.h"
#include "gtest/gtest.h"

namespace pswitch::gpu {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  // The arena the device creates: cudaMalloc shared by IPC handle (the default) or VMM chunks.
  virtual bool vmm_arena() const { return false; }
  void SetUp() override {
    if (!CudaBackendBuilt()) GTEST_SKIP() << "built without the CUDA backend";
    DeviceOptions options;
    options.backend = Backend::kCuda;
    options.cuda_vmm_arena = vmm_arena();
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
  auto timings = (*ticket)->Wait(absl::Seconds(60));
  ASSERT_TRUE(timings.ok()) << timings.status();
  EXPECT_TRUE((*flags)->WaitReady(31, 5, absl::Seconds(10)).ok());
  ASSERT_TRUE((*stream)->Synchronize(absl::Seconds(10)).ok());
  std::vector<std::byte> out(16 << 20);
  ASSERT_TRUE((*arena)->CopyToHost(8 << 20, out).ok());
  EXPECT_EQ(std::memcmp(out.data(), (*pinned)->data(), out.size()), 0);
  auto handle = (*arena)->Export();
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(handle->ipc_handle.size(), 64u) << "cudaMalloc shared by IPC handle (the default)";
  EXPECT_EQ(handle->chunk_bytes, 0u);
  EXPECT_EQ((*arena)->access_granularity(), 0u) << "every importer maps it whole";
  EXPECT_TRUE(handle->fd.valid()) << "the flag window travels with the handle";
}

class CudaVmmTest : public CudaDeviceTest {
 protected:
  bool vmm_arena() const override { return true; }
};

// --cuda-vmm-arena: chunks of the mapping granularity, each its own allocation.
TEST_F(CudaVmmTest, TheArenaIsChunksWhoseFdsTheOwnerExports) {
  auto arena = device_->CreateArena(9 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const uint64_t g = (*arena)->access_granularity();
  ASSERT_GT(g, 0u);
  auto handle = (*arena)->Export();
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(handle->chunk_bytes, g);
  EXPECT_TRUE(handle->ipc_handle.empty());
  auto fds = (*arena)->ExportChunks(0, 2);
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_TRUE((*fds)[0].valid() && (*fds)[1].valid());
  EXPECT_EQ((*arena)->ExportChunks((9 << 20) / g + 1, 1).status().code(),
            absl::StatusCode::kOutOfRange);
  // The owner's mapping is whole and contiguous: a fill and a copy across chunk boundaries.
  std::vector<std::byte> pattern(3 * g);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = std::byte(i * 31 + 7);
  ASSERT_TRUE((*arena)->CopyFromHost(g / 2, pattern).ok());
  std::vector<std::byte> seen(pattern.size());
  ASSERT_TRUE((*arena)->CopyToHost(g / 2, seen).ok());
  EXPECT_EQ(std::memcmp(seen.data(), pattern.data(), seen.size()), 0);
}

// Issue 29 item 2 on CUDA: an importer restricted to what it is granted has nothing else mapped,
// granule by granule, as its driver reports it; a grant shows the owner's bytes (the same
// memory), and taking part of a mapping back keeps the rest as it was.
TEST_F(CudaVmmTest, ARestrictedImportReachesOnlyWhatItIsGranted) {
  auto arena = device_->CreateArena(64 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ((*arena)->RestrictAccess().code(), absl::StatusCode::kFailedPrecondition);
  auto handle = (*arena)->Export();
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto imported = device_->ImportArena(std::move(*handle));
  ASSERT_TRUE(imported.ok()) << imported.status();
  Arena& view = **imported;
  const uint64_t g = view.access_granularity();
  ASSERT_GT(g, 0u);
  ASSERT_LE(8 * g, 64u << 20);
  EXPECT_EQ(view.SetAccess(0, g, Arena::Access::kRead).code(),
            absl::StatusCode::kFailedPrecondition);
  auto at = [&](uint64_t offset) {
    absl::StatusOr<Arena::Access> access = view.AccessAt(offset);
    EXPECT_TRUE(access.ok()) << access.status();
    return access.value_or(Arena::Access::kReadWrite);
  };
  EXPECT_EQ(at(5 * g), Arena::Access::kNone) << "an import maps nothing until granted";
  ASSERT_TRUE(view.RestrictAccess().ok());
  EXPECT_EQ(at(0), Arena::Access::kNone);
  EXPECT_EQ(at(5 * g), Arena::Access::kNone);
  // A grant widens to whole granules and no further.
  const Arena::Access read =
      view.read_only_access() ? Arena::Access::kRead : Arena::Access::kReadWrite;
  EXPECT_TRUE(view.read_only_access()) << "this driver maps device memory read-write only";
  ASSERT_TRUE(view.SetAccess(5 * g + 100, 10, Arena::Access::kRead).ok());
  EXPECT_EQ(at(5 * g), read);
  EXPECT_EQ(at(6 * g - 1), read);
  EXPECT_EQ(at(5 * g - 1), Arena::Access::kNone);
  EXPECT_EQ(at(6 * g), Arena::Access::kNone);
  ASSERT_TRUE(view.SetAccess(5 * g, g, Arena::Access::kReadWrite).ok());
  EXPECT_EQ(at(5 * g), Arena::Access::kReadWrite);
  std::vector<std::byte> pattern(4096);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = std::byte(i * 7 + 3);
  ASSERT_TRUE((*arena)->CopyFromHost(5 * g, pattern).ok());
  ASSERT_TRUE((*arena)->CopyFromHost(4 * g, pattern).ok());
  std::vector<std::byte> seen(pattern.size());
  ASSERT_TRUE(view.CopyToHost(5 * g, seen).ok());
  EXPECT_EQ(std::memcmp(seen.data(), pattern.data(), seen.size()), 0);
  ASSERT_TRUE(view.SetAccess(5 * g, g, Arena::Access::kNone).ok());
  EXPECT_EQ(at(5 * g), Arena::Access::kNone);
  // One mapping of three granules, its middle taken back: both ends stay, bytes and all.
  ASSERT_TRUE(view.SetAccess(4 * g, 3 * g, Arena::Access::kRead).ok());
  ASSERT_TRUE(view.SetAccess(5 * g, g, Arena::Access::kNone).ok());
  EXPECT_EQ(at(4 * g), read);
  EXPECT_EQ(at(5 * g), Arena::Access::kNone);
  EXPECT_EQ(at(6 * g), read);
  std::fill(seen.begin(), seen.end(), std::byte{0});
  ASSERT_TRUE(view.CopyToHost(4 * g, seen).ok());
  EXPECT_EQ(std::memcmp(seen.data(), pattern.data(), seen.size()), 0);
  EXPECT_EQ(view.SetAccess((64 << 20) - 10, 20, Arena::Access::kRead).code(),
            absl::StatusCode::kOutOfRange);
}

// What the restriction is for: the device itself refuses a write to a read-only grant and a
// read of what was not granted. Each may end the CUDA context, so it runs in a child process.
TEST_F(CudaVmmTest, TheDeviceRefusesAWriteToAReadOnlyGrantAndAReadOfWhatWasNotGranted) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto attempt = [this](bool write) {
    auto arena = device_->CreateArena(16 << 20);
    if (!arena.ok()) std::_Exit(3);
    auto handle = (*arena)->Export();
    if (!handle.ok()) std::_Exit(3);
    auto imported = device_->ImportArena(std::move(*handle));
    if (!imported.ok() || !(*imported)->RestrictAccess().ok()) std::_Exit(3);
    Arena& view = **imported;
    const uint64_t g = view.access_granularity();
    if (!view.read_only_access() || !view.SetAccess(2 * g, g, Arena::Access::kRead).ok()) {
      std::_Exit(3);
    }
    std::vector<std::byte> out(4096);
    const absl::Status done = write ? view.Fill(2 * g, 4096, 0x5a)  // granted read-only
                                    : view.CopyToHost(4 * g, out);  // never granted
    std::_Exit(done.ok() ? 1 : 0);
  };
  EXPECT_EXIT(attempt(/*write=*/true), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(attempt(/*write=*/false), ::testing::ExitedWithCode(0), "");
}

// Compaction (WeightsCache::PlanMove): a job whose source is the arena itself copies on the
// device, group by group, publishing its flags like a copy from pinned memory.
TEST_F(CudaDeviceTest, AJobWhoseSourceIsTheArenaMovesBytesOnTheDevice) {
  auto arena = device_->CreateArena(64 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto flags = (*arena)->Flags(0, 8);
  auto engine = device_->CreateCopyEngine(**arena);
  ASSERT_TRUE(flags.ok() && engine.ok());
  std::vector<std::byte> bytes(8 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7 + 3);
  ASSERT_TRUE((*arena)->CopyFromHost(8 << 20, bytes).ok());
  CopyJob job;
  job.epoch = 9;
  job.ready_flags = flags->get();
  const std::byte* source = (*arena)->base() + (8 << 20);
  for (int g = 0; g < 4; ++g) {
    job.groups.push_back(
        CopyGroup{{CopySpan{source + (g << 21), (32u << 20) + (g << 21), 2u << 20}}});
  }
  auto ticket = (*engine)->Submit(std::move(job));
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_TRUE((*ticket)->Wait(absl::Seconds(60)).ok());
  for (uint32_t g = 0; g < 4; ++g) EXPECT_TRUE((*flags)->WaitReady(g, 9, absl::Seconds(1)).ok());
  std::vector<std::byte> out(8 << 20);
  ASSERT_TRUE((*arena)->CopyToHost(32 << 20, out).ok());
  EXPECT_EQ(out, bytes);
}

// Defects 3 and 11: a stream waiting on a flag no one writes never hangs a host-side
// synchronize, and the CPU releases it with a plain store (no stream in between).
TEST_F(CudaDeviceTest, AStreamWaitingOnAnUnwrittenFlagIsBoundedAndReleasedFromTheCpu) {
  auto arena = device_->CreateArena(16 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto flags = (*arena)->Flags(0, 4);
  auto stream = device_->CreateStream();
  ASSERT_TRUE(flags.ok() && stream.ok());
  ASSERT_TRUE((*stream)->WaitFlag(**flags, 0, 7, absl::Seconds(1)).ok());
  ASSERT_TRUE((*stream)->WriteFlag(**flags, 1, 7).ok());
  const absl::Time start = absl::Now();
  EXPECT_EQ((*stream)->Synchronize(absl::Milliseconds(50)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ASSERT_TRUE((*flags)->Store(0, 7).ok());
  ASSERT_TRUE((*stream)->Synchronize(absl::Seconds(10)).ok());
  EXPECT_EQ(*(*flags)->Load(1), 7u) << "the device write reached the host-resident flag";
}

// Defect 3: a tenant that never drains fails the copy job in bounded time; releasing its drain
// flag from the CPU (what killing it does) lets the next job run.
TEST_F(CudaDeviceTest, UndrainedTenantFailsTheJobInBoundedTime) {
  auto arena = device_->CreateArena(16 << 20);
  auto pinned = device_->AllocatePinned(1 << 20);
  ASSERT_TRUE(arena.ok() && pinned.ok());
  auto ready = (*arena)->Flags(0, 8);
  auto drain = (*arena)->Flags(64, 2);
  auto engine = device_->CreateCopyEngine(**arena);
  ASSERT_TRUE(ready.ok() && drain.ok() && engine.ok());
  CopyJob job;
  job.epoch = 1;
  job.ready_flags = ready->get();
  job.groups.push_back(CopyGroup{{CopySpan{(*pinned)->data(), 1 << 20, 1 << 20}}});
  job.drain_flags = drain->get();
  job.drain_index = 0;
  job.drain_value = 3;
  job.drain_timeout = absl::Milliseconds(100);
  auto stuck = (*engine)->Submit(job);
  ASSERT_TRUE(stuck.ok());
  EXPECT_EQ((*stuck)->Wait(absl::Seconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE((*drain)->Store(0, 3).ok());
  job.epoch = 3;
  job.drain_timeout = absl::Seconds(10);
  auto next = (*engine)->Submit(job);
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE((*next)->Wait(absl::Seconds(30)).ok());
  EXPECT_EQ(*(*ready)->Load(0), 3u);
}

// Issue 26, item 2: a job that timed out with its drain wait and copies still queued on the
// stream is reported stalled, not finished, so its owner neither retires its flags (a late
// write of its epoch would land on top) nor frees its sources; it finishes once the stream ran
// what it held.
TEST_F(CudaDeviceTest, ATimedOutJobFinishesOnlyOnceItsQueuedWorkHasRun) {
  auto arena = device_->CreateArena(16 << 20);
  auto pinned = device_->AllocatePinned(1 << 20);
  ASSERT_TRUE(arena.ok() && pinned.ok());
  auto ready = (*arena)->Flags(0, 8);
  auto drain = (*arena)->Flags(64, 2);
  auto engine = device_->CreateCopyEngine(**arena);
  ASSERT_TRUE(ready.ok() && drain.ok() && engine.ok());
  absl::Notification stalled;
  CopyJob job;
  job.epoch = 5;
  job.ready_flags = ready->get();
  job.groups.push_back(CopyGroup{{CopySpan{(*pinned)->data(), 1 << 20, 1 << 20}}});
  job.drain_flags = drain->get();
  job.drain_index = 0;
  job.drain_value = 3;
  job.drain_timeout = absl::Milliseconds(50);
  job.on_stalled = [&](const absl::Status& why) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(why)) << why;
    stalled.Notify();
  };
  auto stuck = (*engine)->Submit(job);
  ASSERT_TRUE(stuck.ok());
  ASSERT_TRUE(stalled.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE((*stuck)->stalled());
  EXPECT_FALSE((*stuck)->finished()) << "its copy and flag write are still queued";
  EXPECT_EQ(*(*ready)->Load(0), 0u);
  ASSERT_TRUE((*drain)->Store(0, 3).ok());  // what killing the tenant does
  auto ended = (*stuck)->Wait(absl::Seconds(30));
  EXPECT_TRUE((*stuck)->finished());
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*(*ready)->Load(0), 5u) << "the late write landed before the job counted as ended";
}

// Issue 26, item 4: a device-side wait honours its own timeout: a synchronize with a longer
// bound fails as soon as the wait is past its timeout, naming the flag.
TEST_F(CudaDeviceTest, AWaitPastItsTimeoutFailsTheSynchronizeEarly) {
  auto arena = device_->CreateArena(16 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto flags = (*arena)->Flags(0, 4);
  auto stream = device_->CreateStream();
  ASSERT_TRUE(flags.ok() && stream.ok());
  ASSERT_TRUE((*stream)->WaitFlag(**flags, 2, 9, absl::Milliseconds(20)).ok());
  const absl::Time start = absl::Now();
  absl::Status synced = (*stream)->Synchronize(absl::Seconds(30));
  EXPECT_EQ(synced.code(), absl::StatusCode::kDeadlineExceeded) << synced;
  EXPECT_NE(synced.message().find("flag 2"), absl::string_view::npos) << synced;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_TRUE((*flags)->Store(2, 9).ok());
  ASSERT_TRUE((*stream)->Synchronize(absl::Seconds(10)).ok());
}

// Defect 1: group times are anchored on the start event, not on when group 0 was seen.
TEST_F(CudaDeviceTest, SingleGroupTimesAreNotShiftedByTheGroupsOwnCopy) {
  constexpr uint64_t kBytes = 256ull << 20;
  auto arena = device_->CreateArena(kBytes + (2 << 20));
  auto pinned = device_->AllocatePinned(kBytes);
  ASSERT_TRUE(arena.ok() && pinned.ok());
  auto flags = (*arena)->Flags(0, 4);
  auto engine = device_->CreateCopyEngine(**arena);
  ASSERT_TRUE(flags.ok() && engine.ok());
  CopyJob job;
  job.epoch = 1;
  job.ready_flags = flags->get();
  job.groups.push_back(CopyGroup{{CopySpan{(*pinned)->data(), 2 << 20, kBytes}}});
  const int64_t submitted = base::MonotonicNowNs();
  auto ticket = (*engine)->Submit(job);
  ASSERT_TRUE(ticket.ok());
  auto timings = (*ticket)->Wait(absl::Seconds(30));
  const int64_t returned = base::MonotonicNowNs();
  ASSERT_TRUE(timings.ok()) << timings.status();
  const GroupTiming& t = (*timings)[0];
  // The copy starts after the submission and ends before the wait returned; the old anchoring
  // put the end about one copy duration after the wait returned.
  EXPECT_GE(t.copy_start_ns, submitted - 100'000);
  EXPECT_LE(t.ready_ns, returned);
  EXPECT_GT(t.ready_ns - t.copy_start_ns, 0);
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
