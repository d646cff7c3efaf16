#include "base/child_process.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "base/unique_fd.h"
#include "gtest/gtest.h"

namespace pswitch::base {
namespace {

// Issue 28 item 2: a child's compute libraries get the thread count pswitchd gives them, in
// place of whatever pswitchd's own environment says, and the rest of the environment is kept.
TEST(ChildProcessTest, AChildsEnvironmentTakesTheGivenEntriesAndKeepsTheRest) {
  ::setenv("OMP_NUM_THREADS", "9", 1);
  ::setenv("PSWITCH_TEST_KEPT", "kept", 1);
  auto run =
      RunBoundedChild({.argv = {"/bin/sh", "-c",
                                "printf '%s:%s:%s' \"$OMP_NUM_THREADS\" \"$OPENBLAS_NUM_THREADS\" "
                                "\"$PSWITCH_TEST_KEPT\""},
                       .env = CpuThreadsEnv(3),
                       .what = "the environment probe"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->output, "3:3:kept");
  auto unchanged = RunBoundedChild({.argv = {"/bin/sh", "-c", "printf '%s' \"$OMP_NUM_THREADS\""},
                                    .env = CpuThreadsEnv(0),
                                    .what = "the environment probe"});
  ASSERT_TRUE(unchanged.ok()) << unchanged.status();
  EXPECT_EQ(unchanged->output, "9") << "0 threads: the environment as it is";
  ::unsetenv("OMP_NUM_THREADS");
  ::unsetenv("PSWITCH_TEST_KEPT");
}

// Background helpers (pswitchd's inspectors) run at a lower priority than their parent.
TEST(ChildProcessTest, AChildRunsAtTheNiceValueItIsGiven) {
  errno = 0;
  const int own = ::getpriority(PRIO_PROCESS, 0);
  ASSERT_EQ(errno, 0);
  auto run =
      RunBoundedChild({.argv = {"/bin/sh", "-c", "nice"}, .nice = 5, .what = "the nice probe"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->output, std::to_string(std::min(own + 5, 19)) + "\n");
  auto same = RunBoundedChild({.argv = {"/bin/sh", "-c", "nice"}, .what = "the nice probe"});
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->output, std::to_string(own) + "\n");
}

// A large output is sealed and mapped, not copied; a descendant the child left holding its
// stdout can no longer change what was mapped. The descendant waits for the test's word on one
// pipe, tries to write over the output's start, and reports whether that write failed on another.
TEST(ChildProcessTest, AMappedOutputIsSealedAgainstWhatTheChildLeftBehind) {
  int go[2], done[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(done), 0);
  UniqueFd go_read(go[0]), go_write(go[1]), done_read(done[0]), done_write(done[1]);
  const std::string script =
      absl::StrCat("printf first; (read _ <&", go_read.get(),
                   "; printf XXXXX 1<>/proc/self/fd/1 2>/dev/null", " && echo written >&",
                   done_write.get(), " || echo refused >&", done_write.get(), ") & exit 0");
  auto run = RunBoundedChild({.argv = {"/bin/sh", "-c", script},
                              .inherit_fds = {go_read.get(), done_write.get()},
                              .what = "the output probe",
                              .map_output = true});
  ASSERT_TRUE(run.ok()) << run.status();
  go_read.Reset();
  done_write.Reset();
  ASSERT_NE(run->mapped_output, nullptr);
  EXPECT_TRUE(run->output.empty()) << "not copied";
  EXPECT_EQ(run->bytes(), "first");
  ASSERT_EQ(::write(go_write.get(), "\n", 1), 1);
  pollfd answered{done_read.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&answered, 1, 10'000), 1) << "the descendant never answered";
  char said[16] = {};
  ASSERT_GT(::read(done_read.get(), said, sizeof(said) - 1), 0);
  EXPECT_EQ(std::string(said), "refused\n");
  EXPECT_EQ(run->bytes(), "first");
  auto copied = RunBoundedChild({.argv = {"/bin/sh", "-c", "printf first"}, .what = "the probe"});
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(copied->mapped_output, nullptr);
  EXPECT_EQ(copied->bytes(), "first");
}

}  // namespace
}  // namespace pswitch::base
