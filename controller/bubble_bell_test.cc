#include "controller/bubble_bell.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

TEST(BubbleBellTest, OpensClosesAndStopsOnItsPage) {
  auto bell = BubbleBell::Create();
  ASSERT_TRUE(bell.ok()) << bell.status();
  fill::BellLayout& page = *(*bell)->page_for_test();
  EXPECT_EQ((*bell)->region()->bytes(), fill::kBellBytes);
  EXPECT_EQ((*bell)->slice().length, fill::kBellBytes);
  const uint32_t seq = page.seq.load();
  (*bell)->Open(5000, 4000);
  EXPECT_EQ(page.bubble_end_ns.load(), 5000);
  EXPECT_EQ(page.cut_at_ns.load(), 4000);
  EXPECT_EQ(page.seq.load(), seq + 1);
  EXPECT_EQ((*bell)->opens(), 1u);
  // A bubble that ends sooner than announced cuts a step under way at once ...
  (*bell)->Close(3000);
  EXPECT_EQ(page.bubble_end_ns.load(), 3000);
  EXPECT_EQ(page.cut_at_ns.load(), 3000);
  // ... and one that ends later never moves its end later.
  (*bell)->Open(10000, 9000);
  (*bell)->Close(20000);
  EXPECT_EQ(page.bubble_end_ns.load(), 10000);
  EXPECT_EQ(page.cut_at_ns.load(), 9000);
  EXPECT_FALSE((*bell)->stopped());
  (*bell)->Stop();
  (*bell)->Stop();
  EXPECT_TRUE((*bell)->stopped());
  EXPECT_EQ(page.seq.load(), seq + 6);
  EXPECT_EQ((*bell)->opens(), 2u);
  // What pswitchd decided is its own: a worker scribbling on the page changes none of it.
  page.stop.store(0);
  page.seq.store(0);
  EXPECT_TRUE((*bell)->stopped());
  EXPECT_EQ((*bell)->opens(), 2u);
}

TEST(BubbleBellTest, ReadsWhatTheWorkerWrote) {
  auto bell = BubbleBell::Create();
  ASSERT_TRUE(bell.ok()) << bell.status();
  fill::BellLayout& page = *(*bell)->page_for_test();
  page.steps.store(3);
  page.step_ns.store(12345);
  page.iterations_done.store(17);
  page.stepping.store(1);
  page.overruns.store(2);
  const BubbleBell::Report r = (*bell)->Read();
  EXPECT_EQ(r.steps, 3u);
  EXPECT_EQ(r.step_ns, 12345);
  EXPECT_EQ(r.iterations_done, 17u);
  EXPECT_TRUE(r.stepping);
  EXPECT_EQ(r.overruns, 2u);
}

// The wake crosses processes: a child that maps the region's file as a worker does, waiting on
// the page, wakes at Open (the futex is not process-private).
TEST(BubbleBellTest, AnOpenWakesAnotherProcessWaitingOnThePage) {
  auto bell = BubbleBell::Create();
  ASSERT_TRUE(bell.ok()) << bell.status();
  const uint32_t seq = (*bell)->page_for_test()->seq.load();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    void* p = ::mmap(nullptr, fill::kBellBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                     (*bell)->region()->fd(), 0);
    if (p == MAP_FAILED) ::_exit(2);
    auto* page = static_cast<fill::BellLayout*>(p);
    page->idle_since_ns.store(1);  // waiting now
    // One wait: a wake that did not cross would leave it there for the whole timeout.
    const int64_t start = base::MonotonicNowNs();
    fill::BellWait(*page, seq, absl::Seconds(60));
    if (base::MonotonicNowNs() - start > 30'000'000'000) ::_exit(3);
    ::_exit(page->seq.load() != seq && page->bubble_end_ns.load() == 777 ? 0 : 1);
  }
  fill::BellLayout& page = *(*bell)->page_for_test();
  while (page.idle_since_ns.load() == 0) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(20));  // most likely inside its wait by now
  (*bell)->Open(777, 700);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace pswitch::controller
