#include "gpu/host/host_device.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <thread>

#include "base/clock.h"
#include "gtest/gtest.h"
#include "proto/frame_channel.h"

namespace pswitch::gpu {
namespace {

std::unique_ptr<Device> OpenHost(double bandwidth = 0) {
  DeviceOptions options;
  options.backend = Backend::kHost;
  options.copy_bandwidth_bytes_per_s = bandwidth;
  auto device = Device::Open(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return std::move(*device);
}

std::vector<std::byte> Pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>(seed + i * 7 + i / 251));
  return v;
}

TEST(HostDeviceTest, ArenaExportedToForkedChildIsTheSameMemory) {
  auto device = OpenHost();
  auto arena = device->CreateArena(1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto flags = (*arena)->Flags(0, 4);
  ASSERT_TRUE(flags.ok());
  std::vector<std::byte> parent_bytes = Pattern(4096, 3);
  ASSERT_TRUE((*arena)->CopyFromHost(8192, parent_bytes).ok());
  auto handle = (*arena)->Export();
  ASSERT_TRUE(handle.ok());

  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Child: receive the fd, import, check the parent's bytes, answer with its own and a flag.
    ::close(sv[0]);
    proto::FrameChannel channel{UniqueFd(sv[1])};
    auto frame = channel.Receive(absl::Seconds(10));
    if (!frame.ok() || !frame->fd.valid()) _exit(10);
    ArenaHandle imported;
    imported.backend = Backend::kHost;
    std::memcpy(&imported.size_bytes, frame->payload.data(), sizeof(uint64_t));
    imported.fd = std::move(frame->fd);
    auto child_device = OpenHost();
    auto mapped = child_device->ImportArena(std::move(imported));
    if (!mapped.ok() || (*mapped)->owner()) _exit(11);
    std::vector<std::byte> seen(4096);
    if (!(*mapped)->CopyToHost(8192, seen).ok() || seen != Pattern(4096, 3)) _exit(12);
    if (!(*mapped)->CopyFromHost(65536, Pattern(4096, 99)).ok()) _exit(13);
    auto child_flags = (*mapped)->Flags(0, 4);
    if (!child_flags.ok() || !(*child_flags)->Store(2, 7).ok()) _exit(14);
    if ((*mapped)->Export().ok()) _exit(15);  // only the owner exports
    _exit(0);
  }
  ::close(sv[1]);
  proto::FrameChannel channel{UniqueFd(sv[0])};
  uint64_t size = handle->size_bytes;
  ASSERT_TRUE(channel
                  .Send(std::span<const uint8_t>(reinterpret_cast<uint8_t*>(&size), sizeof(size)),
                        handle->fd.get())
                  .ok());
  // The child's flag store wakes this futex wait across the process boundary.
  EXPECT_TRUE((*flags)->WaitReady(2, 7, absl::Seconds(10)).ok());
  std::vector<std::byte> from_child(4096);
  ASSERT_TRUE((*arena)->CopyToHost(65536, from_child).ok());
  EXPECT_EQ(from_child, Pattern(4096, 99));
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
}

// What the kernel lets this process read at `at` / write there: a pipe's copy from or to user
// memory fails with EFAULT where the mapping forbids it, without a signal.
bool Readable(const std::byte* at) {
  int p[2];
  if (::pipe(p) != 0) return false;
  const bool ok = ::write(p[1], at, 1) == 1;
  ::close(p[0]);
  ::close(p[1]);
  return ok;
}
bool Writable(std::byte* at) {
  int p[2];
  if (::pipe(p) != 0) return false;
  const char one = 1;
  bool ok = ::write(p[1], &one, 1) == 1 && ::read(p[0], at, 1) == 1;
  ::close(p[0]);
  ::close(p[1]);
  return ok;
}

// Issue 29 item 2: an importer restricted to what it is granted reads and writes nothing else,
// page by page; the owner (it copies into every region) cannot be restricted.
TEST(HostDeviceTest, ARestrictedImportTouchesOnlyWhatItIsGranted) {
  auto device = OpenHost();
  auto arena = device->CreateArena(1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ((*arena)->RestrictAccess().code(), absl::StatusCode::kFailedPrecondition);
  auto handle = (*arena)->Export();
  ASSERT_TRUE(handle.ok());
  auto imported = device->ImportArena(std::move(*handle));
  ASSERT_TRUE(imported.ok()) << imported.status();
  Arena& view = **imported;
  const uint64_t page = view.access_granularity();
  ASSERT_GE(page, 4096u);
  EXPECT_EQ(view.SetAccess(0, page, Arena::Access::kRead).code(),
            absl::StatusCode::kFailedPrecondition)
      << "a grant before any restriction would be meaningless";
  std::byte* base = view.base();
  ASSERT_TRUE(Readable(base + 5 * page) && Writable(base + 5 * page));
  ASSERT_TRUE(view.RestrictAccess().ok());
  EXPECT_FALSE(Readable(base));
  EXPECT_FALSE(Readable(base + 5 * page));
  // A grant widens to whole pages and no further.
  ASSERT_TRUE(view.SetAccess(5 * page + 100, 10, Arena::Access::kRead).ok());
  EXPECT_TRUE(Readable(base + 5 * page));
  EXPECT_TRUE(Readable(base + 6 * page - 1));
  EXPECT_FALSE(Writable(base + 5 * page + 100));
  EXPECT_FALSE(Readable(base + 4 * page + page - 1));
  EXPECT_FALSE(Readable(base + 6 * page));
  ASSERT_TRUE(view.SetAccess(5 * page, page, Arena::Access::kReadWrite).ok());
  EXPECT_TRUE(Writable(base + 5 * page + 100));
  // The owner's bytes show through the grant: the same memory, not a copy.
  std::vector<std::byte> pattern = Pattern(64, 9);
  ASSERT_TRUE((*arena)->CopyFromHost(5 * page, pattern).ok());
  EXPECT_EQ(std::memcmp(base + 5 * page, pattern.data(), pattern.size()), 0);
  ASSERT_TRUE(view.SetAccess(5 * page, page, Arena::Access::kNone).ok());
  EXPECT_FALSE(Readable(base + 5 * page));
  EXPECT_EQ(view.SetAccess((1 << 20) - 10, 20, Arena::Access::kRead).code(),
            absl::StatusCode::kOutOfRange);
}

TEST(HostDeviceTest, ImportRejectsWrongSizeAndMissingFd) {
  auto device = OpenHost();
  auto arena = device->CreateArena(4096);
  ASSERT_TRUE(arena.ok());
  auto handle = (*arena)->Export();
  ASSERT_TRUE(handle.ok());
  handle->size_bytes = 8192;
  EXPECT_EQ(device->ImportArena(std::move(*handle)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ArenaHandle empty;
  empty.size_bytes = 4096;
  EXPECT_EQ(device->ImportArena(std::move(empty)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->CreateArena(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostDeviceTest, EpochsNeverMistakeAStaleFlagForANewOne) {
  auto device = OpenHost();
  auto arena = device->CreateArena(4096);
  ASSERT_TRUE(arena.ok());
  auto flags = (*arena)->Flags(64, 8);
  ASSERT_TRUE(flags.ok());
  FlagArray& f = **flags;
  ASSERT_TRUE(f.Store(0, 4).ok());
  // Flag holds epoch 4 (last switch): a wait for epoch 5 must not pass.
  EXPECT_EQ(f.WaitReady(0, 5, absl::Milliseconds(20)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(f.WaitReady(0, 4, absl::Milliseconds(20)).ok());
  // A newer epoch releases an older wait but reports it superseded.
  EXPECT_EQ(f.WaitReady(0, 3, absl::Milliseconds(20)).code(), absl::StatusCode::kAborted);
  // Cyclic order across the 32-bit wrap.
  ASSERT_TRUE(f.Store(1, 2).ok());
  EXPECT_EQ(f.WaitReady(1, 0xfffffffeu, absl::Milliseconds(20)).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(f.WaitReady(1, 3, absl::Milliseconds(20)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(f.Store(8, 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*arena)->Flags(4094, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*arena)->Flags(4092, 2).status().code(), absl::StatusCode::kOutOfRange);
}

// Defect 4: the retire value epoch + 1 releases a >= wait exactly like the epoch does, so the
// check after a task must insist on equality for every group.
TEST(HostDeviceTest, GroupsCheckRejectsARetiredOrStaleGroup) {
  auto device = OpenHost();
  auto arena = device->CreateArena(4096);
  ASSERT_TRUE(arena.ok());
  auto flags = (*arena)->Flags(0, 8);
  ASSERT_TRUE(flags.ok());
  FlagArray& f = **flags;
  for (uint32_t g = 0; g < 4; ++g) ASSERT_TRUE(f.Store(2 + g, 7).ok());
  EXPECT_TRUE(CheckGroupsHoldEpoch(f, 2, 4, 7).ok());
  ASSERT_TRUE(f.Store(4, 8).ok());  // group 2 retired: its transmission failed there
  ASSERT_TRUE(EpochReached(8, 7)) << "a device wait would have passed";
  absl::Status retired = CheckGroupsHoldEpoch(f, 2, 4, 7);
  EXPECT_EQ(retired.code(), absl::StatusCode::kAborted) << retired;
  EXPECT_NE(retired.message().find("group 2"), absl::string_view::npos) << retired;
  ASSERT_TRUE(f.Store(4, 5).ok());  // a stale epoch from an earlier switch
  EXPECT_EQ(CheckGroupsHoldEpoch(f, 2, 4, 7).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(CheckGroupsHoldEpoch(f, 8, 1, 7).code(), absl::StatusCode::kOutOfRange);
}

TEST(HostDeviceTest, AdvanceNeverMovesANewerEpochBack) {
  auto device = OpenHost();
  auto arena = device->CreateArena(4096);
  ASSERT_TRUE(arena.ok());
  auto flags = (*arena)->Flags(0, 2);
  ASSERT_TRUE(flags.ok());
  FlagArray& f = **flags;
  ASSERT_TRUE(f.Store(0, 9).ok());  // the next switch (epoch 9) already published
  ASSERT_TRUE(f.Advance(0, 8).ok());  // a late retire of epoch 7
  EXPECT_EQ(*f.Load(0), 9u);
  ASSERT_TRUE(f.Advance(1, 8).ok());
  EXPECT_EQ(*f.Load(1), 8u);
  EXPECT_EQ(f.Advance(2, 1).code(), absl::StatusCode::kOutOfRange);
}

TEST(HostDeviceTest, FlagsMustLieInTheFlagWindow) {
  auto device = OpenHost();
  auto arena = device->CreateArena(kFlagWindowBytes + 8192);
  ASSERT_TRUE(arena.ok());
  EXPECT_TRUE((*arena)->Flags(kFlagWindowBytes - 8, 2).ok());
  EXPECT_EQ((*arena)->Flags(kFlagWindowBytes - 4, 2).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(HostDeviceTest, CopyEnginePublishesGroupsInOrderWithTheirBytes) {
  auto device = OpenHost();
  auto arena = device->CreateArena(8 << 20);
  auto pinned = device->AllocatePinned(4 << 20);
  ASSERT_TRUE(arena.ok() && pinned.ok());
  auto flags = (*arena)->Flags(0, 16);
  auto engine = device->CreateCopyEngine(**arena);
  ASSERT_TRUE(flags.ok() && engine.ok());
  auto src = Pattern(4 << 20, 11);
  std::memcpy((*pinned)->data(), src.data(), src.size());

  CopyJob job;
  job.epoch = 1;
  job.ready_flags = flags->get();
  job.ready_flag_base = 3;
  const uint64_t kDst = 1 << 20;
  for (int g = 0; g < 4; ++g) {
    CopyGroup group;
    // Two spans per group, as a layer group has several tensors.
    for (int s = 0; s < 2; ++s) {
      uint64_t off = (g * 2 + s) * (512 << 10);
      group.spans.push_back(CopySpan{(*pinned)->data() + off, kDst + off, 512 << 10});
    }
    job.groups.push_back(std::move(group));
  }
  auto ticket = (*engine)->Submit(std::move(job));
  ASSERT_TRUE(ticket.ok());
  for (uint32_t g = 0; g < 4; ++g) {
    EXPECT_TRUE((*flags)->WaitReady(3 + g, 1, absl::Seconds(10)).ok());
  }
  auto timings = (*ticket)->Wait(absl::Seconds(60));
  ASSERT_TRUE(timings.ok()) << timings.status();
  ASSERT_EQ(timings->size(), 4u);
  for (size_t g = 0; g < 4; ++g) {
    EXPECT_EQ((*timings)[g].bytes, 1u << 20);
    EXPECT_LE((*timings)[g].copy_start_ns, (*timings)[g].ready_ns);
    if (g > 0) {
      EXPECT_LE((*timings)[g - 1].ready_ns, (*timings)[g].copy_start_ns);
    }
  }
  std::vector<std::byte> out(4 << 20);
  ASSERT_TRUE((*arena)->CopyToHost(kDst, out).ok());
  EXPECT_EQ(out, src);
  EXPECT_EQ(*(*flags)->Load(2), 0u);  // untouched neighbour
  EXPECT_EQ(*(*flags)->Load(7), 0u);
}

TEST(HostDeviceTest, CopyWaitsForTheDrainFlagAndFailsWhenItNeverComes) {
  auto device = OpenHost();
  auto arena = device->CreateArena(1 << 20);
  auto pinned = device->AllocatePinned(4096);
  ASSERT_TRUE(arena.ok() && pinned.ok());
  auto ready = (*arena)->Flags(0, 4);
  auto drain = (*arena)->Flags(64, 4);
  auto engine = device->CreateCopyEngine(**arena);
  ASSERT_TRUE(ready.ok() && drain.ok() && engine.ok());
  std::memset((*pinned)->data(), 0x5a, 4096);

  auto make_job = [&](uint32_t epoch, absl::Duration timeout) {
    CopyJob job;
    job.epoch = epoch;
    job.ready_flags = ready->get();
    job.groups.push_back(CopyGroup{{CopySpan{(*pinned)->data(), 8192, 4096}}});
    job.drain_flags = drain->get();
    job.drain_index = 1;
    job.drain_value = epoch;
    job.drain_timeout = timeout;
    return job;
  };
  // Nobody drains: the job fails and writes nothing.
  auto stuck = (*engine)->Submit(make_job(1, absl::Milliseconds(50)));
  ASSERT_TRUE(stuck.ok());
  EXPECT_EQ((*stuck)->Wait(absl::Seconds(60)).status().code(), absl::StatusCode::kDeadlineExceeded);
  std::vector<std::byte> probe(4096);
  ASSERT_TRUE((*arena)->CopyToHost(8192, probe).ok());
  EXPECT_EQ(probe, std::vector<std::byte>(4096));
  EXPECT_EQ(*(*ready)->Load(0), 0u);

  // The old tenant drains later; the copy starts only after that store.
  auto job = (*engine)->Submit(make_job(2, absl::Seconds(10)));
  ASSERT_TRUE(job.ok());
  int64_t drained_ns = 0;
  std::thread tenant([&] {
    // The tenant's last kernel finishing, modelled by a store from another thread.
    absl::SleepFor(absl::Milliseconds(30));
    drained_ns = base::MonotonicNowNs();
    ASSERT_TRUE((*drain)->Store(1, 2).ok());
  });
  auto timings = (*job)->Wait(absl::Seconds(60));
  tenant.join();
  ASSERT_TRUE(timings.ok()) << timings.status();
  EXPECT_GE((*timings)[0].copy_start_ns, drained_ns);
  ASSERT_TRUE((*arena)->CopyToHost(8192, probe).ok());
  EXPECT_EQ(probe, std::vector<std::byte>(4096, std::byte{0x5a}));
}

TEST(HostDeviceTest, BandwidthCapIsHonouredWithinTenPercent) {
  const double kBandwidth = 256e6;
  const uint64_t kBytes = 64ull << 20;  // 262 ms at the cap
  auto device = OpenHost(kBandwidth);
  auto arena = device->CreateArena(kBytes + 4096);
  auto pinned = device->AllocatePinned(kBytes);
  ASSERT_TRUE(arena.ok() && pinned.ok());
  auto flags = (*arena)->Flags(0, 8);
  auto engine = device->CreateCopyEngine(**arena);
  ASSERT_TRUE(flags.ok() && engine.ok());
  CopyJob job;
  job.epoch = 1;
  job.ready_flags = flags->get();
  for (int g = 0; g < 8; ++g) {
    uint64_t part = kBytes / 8;
    job.groups.push_back(
        CopyGroup{{CopySpan{(*pinned)->data() + g * part, 4096 + g * part, part}}});
  }
  auto ticket = (*engine)->Submit(std::move(job));
  ASSERT_TRUE(ticket.ok());
  auto timings = (*ticket)->Wait(absl::Seconds(60));
  ASSERT_TRUE(timings.ok());
  double seconds = (timings->back().ready_ns - timings->front().copy_start_ns) / 1e9;
  double achieved = static_cast<double>(kBytes) / seconds;
  EXPECT_NEAR(achieved / kBandwidth, 1.0, 0.10) << achieved / 1e6 << " MB/s";
}

TEST(HostDeviceTest, CancelStopsAJobAndRejectsBadJobs) {
  auto device = OpenHost(/*bandwidth=*/64e6);
  auto arena = device->CreateArena(32 << 20);
  auto pinned = device->AllocatePinned(16 << 20);
  ASSERT_TRUE(arena.ok() && pinned.ok());
  auto flags = (*arena)->Flags(0, 64);
  auto engine = device->CreateCopyEngine(**arena);
  ASSERT_TRUE(flags.ok() && engine.ok());
  CopyJob job;
  job.epoch = 9;
  job.ready_flags = flags->get();
  for (int g = 0; g < 16; ++g) {
    job.groups.push_back(
        CopyGroup{{CopySpan{(*pinned)->data() + (g << 20), 1024 + (uint64_t(g) << 20), 1 << 20}}});
  }
  auto ticket = (*engine)->Submit(job);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE((*flags)->WaitReady(0, 9, absl::Seconds(10)).ok());
  (*ticket)->Cancel();
  EXPECT_EQ((*ticket)->Wait(absl::Seconds(60)).status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT((*ticket)->groups_done(), 16u);
  EXPECT_NE(*(*flags)->Load(15), 9u);

  CopyJob outside = job;
  outside.groups[3].spans[0].arena_offset = (32 << 20) - 10;
  EXPECT_EQ((*engine)->Submit(outside).status().code(), absl::StatusCode::kOutOfRange);
  CopyJob too_many_flags = job;
  too_many_flags.ready_flag_base = 60;
  EXPECT_EQ((*engine)->Submit(too_many_flags).status().code(), absl::StatusCode::kOutOfRange);
  CopyJob no_epoch = job;
  no_epoch.epoch = 0;
  EXPECT_EQ((*engine)->Submit(no_epoch).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostDeviceTest, BackendNamesParse) {
  EXPECT_EQ(*ParseBackend("host"), Backend::kHost);
  EXPECT_EQ(*ParseBackend("cuda"), Backend::kCuda);
  EXPECT_EQ(ParseBackend("rocm").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::gpu
