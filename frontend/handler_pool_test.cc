#include "frontend/handler_pool.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

TEST(HandlerPoolTest, TheQueueIsBoundedAndStopRunsWhatWasQueued) {
  HandlerPool pool(1, 2);
  absl::Notification release;
  absl::Notification started;
  ASSERT_TRUE(pool.TrySubmit([&] {
    started.Notify();
    release.WaitForNotification();
  }));
  started.WaitForNotification();
  std::atomic<int> ran{0};
  EXPECT_TRUE(pool.TrySubmit([&] { ++ran; }));
  EXPECT_TRUE(pool.TrySubmit([&] { ++ran; }));
  EXPECT_FALSE(pool.TrySubmit([&] { ++ran; }));  // full
  EXPECT_TRUE(pool.Submit([&] { ++ran; }));      // past the bound: work already admitted
  release.Notify();
  pool.Stop();
  EXPECT_EQ(ran.load(), 3);
  EXPECT_FALSE(pool.Submit([] {}));
}

}  // namespace
}  // namespace pswitch::frontend
