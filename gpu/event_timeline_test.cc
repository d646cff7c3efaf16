#include "gpu/event_timeline.h"

#include <vector>

#include "gtest/gtest.h"

namespace pswitch::gpu {
namespace {

TEST(EventTimelineTest, AnchorIsTheTightestBoundOverAllObservations) {
  // True start at 1'000'000 ns; groups end 500 us, 600 us, 700 us later; seen with lags of
  // 80 us, 3 us and 40 us.
  std::vector<EventObservation> seen = {
      {1'000'000 + 500'000 + 80'000, 500'000},
      {1'000'000 + 600'000 + 3'000, 600'000},
      {1'000'000 + 700'000 + 40'000, 700'000},
  };
  EXPECT_EQ(AnchorStartNs(seen), 1'003'000);
}

TEST(EventTimelineTest, SingleGroupIsNotShiftedByItsOwnDuration) {
  // One 20 ms group seen 50 us late. Anchoring on when it was seen (the old engine) put the copy
  // start at 1'020'050'000 and ready at 1'040'050'000: twice the real time after the start.
  std::vector<EventObservation> seen = {{1'000'000'000 + 20'000'000 + 50'000, 20'000'000}};
  std::vector<uint64_t> bytes = {480 << 20};
  std::vector<GroupTiming> t = GroupTimings(seen, bytes);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].copy_start_ns, 1'000'050'000);
  EXPECT_EQ(t[0].ready_ns - t[0].copy_start_ns, 20'000'000);
  EXPECT_EQ(t[0].bytes, uint64_t{480} << 20);
}

TEST(EventTimelineTest, EachGroupStartsWhenThePreviousEnded) {
  std::vector<EventObservation> seen = {{2'000 + 100, 100}, {2'000 + 250, 250}, {2'000 + 400, 400}};
  std::vector<uint64_t> bytes = {1, 2, 3};
  std::vector<GroupTiming> t = GroupTimings(seen, bytes);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].copy_start_ns, 2'000);
  EXPECT_EQ(t[1].copy_start_ns, 2'100);
  EXPECT_EQ(t[1].ready_ns, 2'250);
  EXPECT_EQ(t[2].copy_start_ns, 2'250);
  EXPECT_EQ(t[2].ready_ns, 2'400);
}

TEST(LookaheadWindowTest, PerLayerGroupsKeepTensOfMegabytesInFlight) {
  // 360 groups of 0.7 MB: the old engine kept 4 groups (2.8 MB, ~50 us at PCIe 5) ahead.
  std::vector<uint64_t> bytes(360, 700'000);
  LookaheadWindow window(bytes, 64ull << 20);
  while (window.MayEnqueue()) window.Enqueued();
  EXPECT_EQ(window.enqueued(), (64ull << 20) / 700'000);
  window.Completed();
  EXPECT_TRUE(window.MayEnqueue());
  window.Enqueued();
  EXPECT_FALSE(window.MayEnqueue());
}

TEST(LookaheadWindowTest, AGroupLargerThanTheWindowStillGoesAlone) {
  std::vector<uint64_t> bytes = {100, 500, 100};
  LookaheadWindow window(bytes, 200);
  ASSERT_TRUE(window.MayEnqueue());
  window.Enqueued();
  EXPECT_FALSE(window.MayEnqueue());  // 100 + 500 > 200
  window.Completed();
  ASSERT_TRUE(window.MayEnqueue());  // nothing in flight
  window.Enqueued();
  EXPECT_FALSE(window.MayEnqueue());
  window.Completed();
  window.Enqueued();
  window.Completed();
  EXPECT_TRUE(window.done());
  EXPECT_FALSE(window.MayEnqueue());
}

}  // namespace
}  // namespace pswitch::gpu
