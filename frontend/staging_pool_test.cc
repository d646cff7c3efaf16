#include "frontend/staging_pool.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

class StagingPoolTest : public ::testing::Test {
 protected:
  std::shared_ptr<ByteBudget> budget_ = std::make_shared<ByteBudget>(
      ByteBudgetLimits{.total_bytes = 8 << 20, .per_client_bytes = 4 << 20});
  std::shared_ptr<StagingPool> pool_ = StagingPool::Create("alice", BudgetCharge(budget_, "c"));
};

TEST_F(StagingPoolTest, AReturnedRegionIsReusedWithItsMappingAndStaysCharged) {
  uint64_t id = 0;
  uint8_t* data = nullptr;
  {
    auto lease = pool_->Acquire(1'000'000);
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_GE((*lease)->bytes(), 1'000'000u);
    EXPECT_EQ((*lease)->region()->owner(), "alice");
    EXPECT_EQ(budget_->used_by("c"), (*lease)->bytes());  // charged before use
    id = (*lease)->region()->id();
    data = (*lease)->data();
    data[999'999] = 7;
  }
  EXPECT_EQ(pool_->idle(), 1u);
  auto again = pool_->Acquire(900'000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->region()->id(), id);
  EXPECT_EQ((*again)->data(), data);  // the same pages, faulted in already
  EXPECT_EQ(pool_->created(), 1u);
  EXPECT_EQ((*again)->data()[999'999], 7);
  again->reset();
  // A request far smaller takes it too: it is mapped and charged already.
  auto small = pool_->Acquire(1000);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ((*small)->region()->id(), id);
  EXPECT_EQ(pool_->created(), 1u);
}

TEST_F(StagingPoolTest, ARegionATaskStillHoldsIsNotReusedUntilItLetsGo) {
  std::shared_ptr<const dataplane::TransferRegion> task_holds;
  {
    auto lease = pool_->Acquire(4096);
    ASSERT_TRUE(lease.ok());
    task_holds = (*lease)->region();
  }
  EXPECT_EQ(pool_->idle(), 0u);
  auto other = pool_->Acquire(4096);
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*other)->region()->id(), task_holds->id());
  other->reset();
  task_holds.reset();
  auto reused = pool_->Acquire(4096);
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(pool_->created(), 2u);
}

TEST_F(StagingPoolTest, TheBudgetBoundsMappedBytesAndIdleRegionsMakeRoom) {
  auto a = pool_->Acquire(3 << 20);
  ASSERT_TRUE(a.ok());
  // 3 MiB in use: another 2 MiB exceeds the client's 4 MiB.
  auto b = pool_->Acquire(2 << 20);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  a->reset();  // idle now, still charged
  EXPECT_EQ(budget_->used_by("c"), 3u << 20);
  // Too small for it, too large to fit beside it: the idle region goes to make room.
  auto c = pool_->Acquire(7 << 19);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(budget_->used_by("c"), 7u << 19);
  EXPECT_EQ(pool_->idle(), 0u);
  c->reset();
  pool_->DropIdle();
  EXPECT_EQ(budget_->used_by("c"), 0u);
  EXPECT_EQ(pool_->mapped_bytes(), 0u);
}

// A client whose requests vary in size reuses the region it has rather than mapping a new one
// per size: the smallest idle region that fits serves a smaller request, however much larger.
TEST_F(StagingPoolTest, ASmallerRequestReusesTheSmallestIdleRegionThatFits) {
  auto big = pool_->Acquire(3 << 20);
  auto mid = pool_->Acquire(1 << 20);
  ASSERT_TRUE(big.ok() && mid.ok());
  const uint8_t* big_data = (*big)->data();
  const uint8_t* mid_data = (*mid)->data();
  big->reset();
  mid->reset();
  auto small = pool_->Acquire(64 << 10);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ((*small)->data(), mid_data);  // not a new one, and not the larger idle one
  auto large = pool_->Acquire(2 << 20);
  ASSERT_TRUE(large.ok());
  EXPECT_EQ((*large)->data(), big_data);
  EXPECT_EQ(pool_->created(), 2u);
}

TEST_F(StagingPoolTest, AtMostMaxIdleRegionsStayMapped) {
  std::vector<std::shared_ptr<StagingPool::Lease>> leases;
  for (int i = 0; i < 4; ++i) {
    auto lease = pool_->Acquire(64 << 10);
    ASSERT_TRUE(lease.ok());
    leases.push_back(*std::move(lease));
  }
  leases.clear();
  EXPECT_EQ(pool_->idle(), 2u);
  EXPECT_EQ(budget_->used_by("c"), 2u * (64 << 10));
}

// A staging region a principal's request filled (its tensors, the gaps between them, its
// outputs) is never handed to another principal's request: bob's region is all zeros wherever
// alice wrote, and is bob's. Alice's idle region is still hers to reuse.
TEST_F(StagingPoolTest, AnotherPrincipalNeverGetsARegionWithThePreviousHoldersBytes) {
  uint64_t alices = 0;
  {
    auto lease = pool_->Acquire(200'000, "alice");
    ASSERT_TRUE(lease.ok()) << lease.status();
    alices = (*lease)->region()->id();
    std::memset((*lease)->data(), 0xAB, (*lease)->bytes());  // inputs, slack, outputs
  }
  ASSERT_EQ(pool_->idle(), 1u);
  {
    auto bobs = pool_->Acquire(200'000, "bob");
    ASSERT_TRUE(bobs.ok()) << bobs.status();
    EXPECT_NE((*bobs)->region()->id(), alices);
    EXPECT_EQ((*bobs)->region()->owner(), "bob");
    const uint8_t* data = (*bobs)->data();
    EXPECT_TRUE(std::all_of(data, data + (*bobs)->bytes(), [](uint8_t b) { return b == 0; }))
        << "bob sees bytes alice's request left";
    std::memset((*bobs)->data(), 0xCD, (*bobs)->bytes());
  }
  // Each idle region goes back to its own principal only.
  auto alice_again = pool_->Acquire(200'000, "alice");
  ASSERT_TRUE(alice_again.ok());
  EXPECT_EQ((*alice_again)->region()->id(), alices);
  EXPECT_EQ((*alice_again)->data()[0], 0xAB);
  auto owner_default = pool_->Acquire(200'000);  // the pool's owner: alice
  ASSERT_TRUE(owner_default.ok());
  EXPECT_EQ((*owner_default)->region()->owner(), "alice");
  EXPECT_EQ((*owner_default)->data()[0], 0) << "bob's idle region is not alice's";
}

}  // namespace
}  // namespace pswitch::frontend
