#include "controller/respawn_backoff.h"

#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

TEST(RespawnBackoffTest, AWorkerThatCannotStartIsRetriedLaterAndLaterUpToFiveSeconds) {
  RespawnBackoff backoff(2);
  std::vector<absl::Duration> delays;
  for (int i = 0; i < 8; ++i) delays.push_back(backoff.Failed(1, false, "exec failed", kT0));
  EXPECT_EQ(delays[0], absl::Milliseconds(100));
  EXPECT_EQ(delays[1], absl::Milliseconds(200));
  EXPECT_EQ(delays[2], absl::Milliseconds(400));
  EXPECT_EQ(delays[6], absl::Seconds(5));
  EXPECT_EQ(delays[7], absl::Seconds(5));
  EXPECT_EQ(backoff.last_error(1), "exec failed");
  EXPECT_EQ(backoff.start_failures(1), 8);
  EXPECT_FALSE(backoff.GaveUp(0));
}

TEST(RespawnBackoffTest, DueSlotsAreReturnedOnceAndNextIsTheEarliest) {
  RespawnBackoff backoff(3);
  EXPECT_EQ(backoff.Next(), absl::InfiniteFuture());
  backoff.Failed(0, false, "a", kT0);                      // due at +100 ms
  backoff.Failed(2, false, "b", kT0);                      // +100 ms
  backoff.Failed(2, false, "b", kT0 + absl::Seconds(1));   // +1.2 s
  EXPECT_EQ(backoff.Next(), kT0 + absl::Milliseconds(100));
  EXPECT_TRUE(backoff.Due(kT0 + absl::Milliseconds(99)).empty());
  EXPECT_EQ(backoff.Due(kT0 + absl::Milliseconds(100)), std::vector<size_t>{0});
  EXPECT_TRUE(backoff.Due(kT0 + absl::Milliseconds(100)).empty()) << "each restart once";
  EXPECT_EQ(backoff.Next(), kT0 + absl::Milliseconds(1200));
  EXPECT_EQ(backoff.Due(kT0 + absl::Seconds(2)), std::vector<size_t>{2});
}

TEST(RespawnBackoffTest, GivesUpAfterThreeFailuresInARowAndAServingWorkerResetsIt) {
  RespawnBackoff backoff(1);
  for (int i = 0; i < RespawnBackoff::kMaxStartFailures - 1; ++i) {
    backoff.Failed(0, false, "x", kT0);
    EXPECT_FALSE(backoff.GaveUp(0));
  }
  backoff.Failed(0, false, "x", kT0);
  EXPECT_TRUE(backoff.GaveUp(0));
  // A worker that had been serving and died is replaced at once, its count forgotten.
  EXPECT_EQ(backoff.Failed(0, true, "crashed", kT0), absl::ZeroDuration());
  EXPECT_FALSE(backoff.GaveUp(0));
  EXPECT_EQ(backoff.Next(), absl::InfiniteFuture());
}

}  // namespace
}  // namespace pswitch::controller
