#include "frontend/byte_budget.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<ByteBudget> Budget(size_t total, size_t per_client, size_t unauthenticated) {
  return std::make_shared<ByteBudget>(ByteBudgetLimits{.total_bytes = total,
                                                       .per_client_bytes = per_client,
                                                       .unauthenticated_bytes = unauthenticated});
}

TEST(ByteBudgetTest, AClientHoldsAtMostItsShareAndTheRestStaysForOthers) {
  auto budget = Budget(1000, 400, 100);
  EXPECT_TRUE(budget->TryCharge("alice", 400).ok());
  absl::Status over = budget->TryCharge("alice", 1);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("--max-client-bytes"));
  EXPECT_EQ(budget->used_by("alice"), 400u);  // nothing charged on refusal
  EXPECT_TRUE(budget->TryCharge("bob", 400).ok());
  EXPECT_EQ(budget->used(), 800u);
}

TEST(ByteBudgetTest, AllClientsTogetherHoldAtMostTheTotal) {
  auto budget = Budget(1000, 400, 100);
  ASSERT_TRUE(budget->TryCharge("a", 400).ok());
  ASSERT_TRUE(budget->TryCharge("b", 400).ok());
  absl::Status over = budget->TryCharge("c", 201);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("--max-buffered-bytes"));
  EXPECT_EQ(budget->used_by("c"), 0u);
  EXPECT_TRUE(budget->TryCharge("c", 200).ok());
  EXPECT_EQ(budget->used(), 1000u);
  EXPECT_FALSE(budget->TryCharge("a", 1).ok());  // a is within its share, the total is not
  budget->Release("a", 400);
  EXPECT_TRUE(budget->TryCharge("c", 200).ok());
  EXPECT_EQ(budget->used(), 800u);
}

// Connections that have not authenticated share one small pool: together they cannot take
// what authenticated clients need.
TEST(ByteBudgetTest, UnauthenticatedConnectionsShareOneSmallPool) {
  auto budget = Budget(1000, 400, 100);
  EXPECT_TRUE(budget->TryCharge(kUnauthenticatedClient, 60).ok());
  absl::Status over = budget->TryCharge(kUnauthenticatedClient, 60);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("authenticate first"));
  EXPECT_TRUE(budget->TryCharge("alice", 400).ok());
}

TEST(ByteBudgetTest, ReleasingMoreThanHeldReleasesOnlyWhatIsHeld) {
  auto budget = Budget(1000, 400, 100);
  ASSERT_TRUE(budget->TryCharge("a", 100).ok());
  ASSERT_TRUE(budget->TryCharge("b", 100).ok());
  budget->Release("a", 150);
  budget->Release("nobody", 50);
  EXPECT_EQ(budget->used_by("a"), 0u);
  EXPECT_EQ(budget->used(), 100u);
}

TEST(ByteBudgetTest, ChargesLargerThanAnyLimitAreRefusedWithoutOverflow) {
  auto budget = Budget(1000, 400, 100);
  ASSERT_TRUE(budget->TryCharge("a", 300).ok());
  EXPECT_FALSE(budget->TryCharge("a", SIZE_MAX).ok());
  EXPECT_FALSE(budget->TryCharge("b", SIZE_MAX - 100).ok());
  EXPECT_EQ(budget->used(), 300u);
}

TEST(BudgetChargeTest, ResizeGrowsAndShrinksAndTheDestructorReleases) {
  auto budget = Budget(1000, 400, 100);
  {
    BudgetCharge charge(budget, "alice");
    ASSERT_TRUE(charge.Resize(300).ok());
    EXPECT_EQ(budget->used_by("alice"), 300u);
    absl::Status over = charge.Resize(401);
    EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(charge.bytes(), 300u);  // unchanged on error
    ASSERT_TRUE(charge.Grow(100).ok());
    ASSERT_TRUE(charge.Resize(50).ok());
    EXPECT_EQ(budget->used_by("alice"), 50u);
  }
  EXPECT_EQ(budget->used(), 0u);
}

TEST(BudgetChargeTest, MovingTransfersTheHoldingOnce) {
  auto budget = Budget(1000, 400, 100);
  BudgetCharge a(budget, "alice");
  ASSERT_TRUE(a.Resize(200).ok());
  BudgetCharge b(std::move(a));
  EXPECT_EQ(b.bytes(), 200u);
  EXPECT_EQ(budget->used(), 200u);
  BudgetCharge c(budget, "bob");
  ASSERT_TRUE(c.Resize(100).ok());
  c = std::move(b);  // bob's 100 released, alice's 200 now c's
  EXPECT_EQ(budget->used_by("bob"), 0u);
  EXPECT_EQ(budget->used_by("alice"), 200u);
  c.Reset();
  EXPECT_EQ(budget->used(), 0u);
}

// A connection that authenticates moves what it holds from the unauthenticated pool to its
// principal; when the principal has no room, nothing moves.
TEST(BudgetChargeTest, RebindMovesTheHoldingToTheAuthenticatedClient) {
  auto budget = Budget(1000, 400, 100);
  BudgetCharge connection(budget, std::string(kUnauthenticatedClient));
  ASSERT_TRUE(connection.Resize(80).ok());
  ASSERT_TRUE(connection.Rebind("alice").ok());
  EXPECT_EQ(budget->used_by(kUnauthenticatedClient), 0u);
  EXPECT_EQ(budget->used_by("alice"), 80u);
  EXPECT_EQ(connection.client(), "alice");
  ASSERT_TRUE(connection.Resize(300).ok());  // alice's share now applies

  ASSERT_TRUE(budget->TryCharge("bob", 390).ok());
  BudgetCharge other(budget, std::string(kUnauthenticatedClient));
  ASSERT_TRUE(other.Resize(20).ok());
  EXPECT_EQ(other.Rebind("bob").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(other.client(), kUnauthenticatedClient);
  EXPECT_EQ(budget->used_by(kUnauthenticatedClient), 20u);
  EXPECT_EQ(budget->used_by("bob"), 390u);
}

TEST(BudgetChargeTest, WithoutABudgetNothingIsBounded) {
  BudgetCharge charge(nullptr, "alice");
  EXPECT_TRUE(charge.Resize(SIZE_MAX / 2).ok());
  EXPECT_TRUE(charge.Rebind("bob").ok());
  EXPECT_EQ(charge.client(), "bob");
  BudgetCharge empty;
  EXPECT_TRUE(empty.Resize(10).ok());
}

TEST(ByteBudgetTest, ConcurrentChargesNeverExceedTheTotalAndAllComeBack) {
  auto budget = Budget(10000, 10000, 100);
  std::vector<std::thread> threads;
  std::atomic<bool> exceeded{false};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&budget, &exceeded, t] {
      BudgetCharge charge(budget, "client" + std::to_string(t % 3));
      for (int i = 0; i < 2000; ++i) {
        (void)charge.Resize(static_cast<size_t>((i * 37 + t * 11) % 3000));
        if (budget->used() > 10000) exceeded = true;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_FALSE(exceeded);
  EXPECT_EQ(budget->used(), 0u);
}

}  // namespace
}  // namespace pswitch::frontend
