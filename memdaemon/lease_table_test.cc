#include "memdaemon/lease_table.h"

#include "gtest/gtest.h"

namespace pswitch::memdaemon {
namespace {

class LeaseTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = gpu::Device::Open(gpu::DeviceOptions{});
    ASSERT_TRUE(device.ok());
    device_ = std::move(*device);
    auto arena = device_->CreateArena(1 << 20);
    ASSERT_TRUE(arena.ok());
    arena_ = std::move(*arena);
    table_ = std::make_unique<LeaseTable>(arena_.get(), 4096, 1 << 20, 256);
  }
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<gpu::Arena> arena_;
  std::unique_ptr<LeaseTable> table_;
};

TEST_F(LeaseTableTest, AcquiresAlignedDisjointLeasesAndCoalescesOnRelease) {
  auto a = table_->Acquire("worker-0", 1000);
  auto b = table_->Acquire("worker-1", 300000);
  auto c = table_->Acquire("worker-2", 10);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->offset, 4096u);
  EXPECT_EQ(a->bytes, 1024u);
  EXPECT_EQ(b->offset, 4096u + 1024u);
  EXPECT_EQ(c->offset % 256, 0u);
  EXPECT_EQ(table_->List().size(), 3u);
  ASSERT_TRUE(table_->Release(a->offset, "worker-0").ok());
  ASSERT_TRUE(table_->Release(b->offset, "worker-1").ok());
  // a and b coalesced: a lease of both sizes fits where they were.
  auto big = table_->Acquire("worker-3", 1024 + 300000);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->offset, 4096u);
  ASSERT_TRUE(table_->Release(big->offset, "worker-3").ok());
  ASSERT_TRUE(table_->Release(c->offset, "worker-2").ok());
  EXPECT_EQ(table_->largest_free_bytes(), table_->capacity_bytes());
}

TEST_F(LeaseTableTest, ExhaustionAndOwnershipErrorsAreClear) {
  auto too_big = table_->Acquire("w", 2 << 20);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("largest free"), absl::string_view::npos);
  EXPECT_EQ(table_->Acquire("", 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table_->Acquire("w", 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto lease = table_->Acquire("owner", 512);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(table_->Release(lease->offset, "thief").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(table_->Release(lease->offset + 256, "owner").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(table_->Release(lease->offset, "owner").ok());
  EXPECT_EQ(table_->Release(lease->offset, "owner").code(), absl::StatusCode::kNotFound);
}

TEST_F(LeaseTableTest, TransferHasOneOwnerAndScrubsWhenAsked) {
  auto lease = table_->Acquire("tenant-a", 4096);
  ASSERT_TRUE(lease.ok());
  std::vector<std::byte> secret(4096, std::byte{0x42});
  ASSERT_TRUE(arena_->CopyFromHost(lease->offset, secret).ok());

  auto kept = table_->Transfer(lease->offset, "tenant-a", "tenant-b", /*scrub=*/false);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->owner, "tenant-b");
  std::vector<std::byte> seen(4096);
  ASSERT_TRUE(arena_->CopyToHost(lease->offset, seen).ok());
  EXPECT_EQ(seen, secret);
  // The previous owner lost it.
  EXPECT_EQ(table_->Transfer(lease->offset, "tenant-a", "tenant-c", false).status().code(),
            absl::StatusCode::kPermissionDenied);

  ASSERT_TRUE(table_->Transfer(lease->offset, "tenant-b", "tenant-c", /*scrub=*/true).ok());
  ASSERT_TRUE(arena_->CopyToHost(lease->offset, seen).ok());
  EXPECT_EQ(seen, std::vector<std::byte>(4096));
}

}  // namespace
}  // namespace pswitch::memdaemon
