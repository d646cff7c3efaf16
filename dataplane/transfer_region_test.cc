#include "dataplane/transfer_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace pswitch::dataplane {
namespace {

UniqueFd Memfd(uint64_t bytes, int seals) {
  UniqueFd fd(::memfd_create("test-area", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  if (seals != 0) EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  return fd;
}

TEST(TransferRegionTest, AreaMustBeASealedMemfdHoldingItsDeclaredBytes) {
  EXPECT_EQ(TransferRegion::FromSealedMemfd(Memfd(4096, 0), 4096, "alice").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(TransferRegion::FromSealedMemfd(Memfd(4096, F_SEAL_SHRINK), 8192, "alice")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  char path[] = "/tmp/pswitch-region-XXXXXX";
  UniqueFd file(::mkstemp(path));
  ::unlink(path);
  EXPECT_EQ(TransferRegion::FromSealedMemfd(std::move(file), 1, "alice").status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto area = TransferRegion::FromSealedMemfd(Memfd(4096, F_SEAL_SHRINK), 4096, "alice");
  ASSERT_TRUE(area.ok()) << area.status();
  EXPECT_EQ((*area)->owner(), "alice");
  EXPECT_NE((*area)->id(), 0u);
}

TEST(TransferRegionTest, AHugePageMemfdIsRefused) {
  // Its pages' reservation can be taken away whatever its seals (a hole punched, the pool
  // exhausted): whoever maps it could fault.
  UniqueFd fd(::memfd_create("huge-area", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB));
  if (!fd.valid()) GTEST_SKIP() << "no hugetlbfs memfds here";
  ASSERT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto area = TransferRegion::FromSealedMemfd(std::move(fd), 1, "mallory");
  ASSERT_FALSE(area.ok());
  EXPECT_EQ(area.status().code(), absl::StatusCode::kFailedPrecondition) << area.status();
}

TEST(TransferRegionTest, SlicesAreCheckedWithoutOverflow) {
  auto area = TransferRegion::FromSealedMemfd(Memfd(4096, F_SEAL_SHRINK), 4096, "alice");
  ASSERT_TRUE(area.ok());
  EXPECT_TRUE((*area)->CheckSlice(0, 4096).ok());
  EXPECT_TRUE((*area)->CheckSlice(4096, 0).ok());
  EXPECT_EQ((*area)->CheckSlice(4095, 2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*area)->CheckSlice(UINT64_MAX, 2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*area)->CheckSlice(8, UINT64_MAX - 4).code(), absl::StatusCode::kOutOfRange);
}

TEST(TransferRegionTest, AShmFileThatShrinksFailsItsNextUse) {
  UniqueFd fd = Memfd(3 * 4096, 0);  // an unsealed file stands in for /dev/shm
  int raw = ::dup(fd.get());
  auto region = TransferRegion::FromShmFile(std::move(fd), 4096, 8192, "bob");
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_TRUE((*region)->CheckSlice(0, 8192).ok());
  ASSERT_EQ(::ftruncate(raw, 4096 + 100), 0);
  EXPECT_TRUE((*region)->CheckSlice(0, 100).ok());
  EXPECT_EQ((*region)->CheckSlice(0, 101).code(), absl::StatusCode::kOutOfRange);
  ::close(raw);
  EXPECT_EQ(TransferRegion::FromShmFile(Memfd(4096, 0), 100, 10, "bob").status().code(),
            absl::StatusCode::kInvalidArgument);  // not page-aligned
  EXPECT_EQ(TransferRegion::FromShmFile(Memfd(4096, 0), 0, 8192, "bob").status().code(),
            absl::StatusCode::kOutOfRange);  // larger than the file
}

TEST(TransferRegionTest, StagingIsSealedBothWays) {
  auto staging = TransferRegion::NewStaging(1 << 20, "pswitchd");
  ASSERT_TRUE(staging.ok()) << staging.status();
  EXPECT_NE(::ftruncate((*staging)->fd(), 10), 0);
  EXPECT_NE(::ftruncate((*staging)->fd(), 2 << 20), 0);
  EXPECT_NE((*staging)->id(), 0u);
}

TEST(TransferRegionTest, CudaIpcHandlesHaveTheirSize) {
  EXPECT_FALSE(TransferRegion::FromCudaIpc(std::string(10, 'x'), 0, 10, "a").ok());
  auto r = TransferRegion::FromCudaIpc(std::string(64, 'x'), 0, 10, "a");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->fd(), -1);
  EXPECT_EQ((*r)->kind(), RegionKind::kCudaIpc);
}

}  // namespace
}  // namespace pswitch::dataplane
