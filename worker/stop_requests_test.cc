#include "worker/stop_requests.h"

#include "gtest/gtest.h"

namespace pswitch::worker {
namespace {

TEST(StopRequestsTest, AStopIsPendingFromArrivalUntilHandled) {
  StopRequests stops;
  EXPECT_FALSE(stops.pending());
  stops.Received();
  EXPECT_TRUE(stops.pending());
  stops.Handled();
  EXPECT_FALSE(stops.pending());
}

// The race that left a preempted training running until the drain timeout: Stop #2 (for the Run
// queued after Stop #1) arrives before Stop #1 is handled; handling #1 must not clear it.
TEST(StopRequestsTest, HandlingOneStopKeepsALaterOneInForce) {
  StopRequests stops;
  stops.Received();  // #1, for the run now executing
  stops.Received();  // #2, for the Run queued between #1 and #2
  stops.Handled();   // #1
  EXPECT_TRUE(stops.pending()) << "the queued Run must see #2 and stop at once";
  stops.Handled();   // #2
  EXPECT_FALSE(stops.pending());
  stops.Handled();  // more than received: nothing goes negative
  stops.Received();
  EXPECT_TRUE(stops.pending());
}

}  // namespace
}  // namespace pswitch::worker
