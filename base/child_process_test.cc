#include "base/child_process.h"

#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace pswitch::base {
namespace {

// Issue 28 item 2: a child's compute libraries get the thread count pswitchd gives them, in
// place of whatever pswitchd's own environment says, and the rest of the environment is kept.
TEST(ChildProcessTest, AChildsEnvironmentTakesTheGivenEntriesAndKeepsTheRest) {
  ::setenv("OMP_NUM_THREADS", "9", 1);
  ::setenv("PSWITCH_TEST_KEPT", "kept", 1);
  auto run = RunBoundedChild(
      {.argv = {"/bin/sh", "-c",
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

// A large output is sealed and mapped, not copied; a descendant the child left holding its
// stdout can no longer change what was mapped.
TEST(ChildProcessTest, AMappedOutputIsSealedAgainstWhatTheChildLeftBehind) {
  auto run = RunBoundedChild(
      // The descendant reopens the output and writes over its start (as a shared writable file
      // it could also shrink it, which would fault a mapping).
      {.argv = {"/bin/sh", "-c",
                "printf first; (sleep 0.2; printf XXXXX 1<>/proc/self/fd/1) 2>/dev/null & exit 0"},
       .what = "the output probe",
       .map_output = true});
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_NE(run->mapped_output, nullptr);
  EXPECT_TRUE(run->output.empty()) << "not copied";
  EXPECT_EQ(run->bytes(), "first");
  ::usleep(400'000);  // the descendant's write fails: the file is sealed against writes
  EXPECT_EQ(run->bytes(), "first");
  auto copied = RunBoundedChild({.argv = {"/bin/sh", "-c", "printf first"}, .what = "the probe"});
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(copied->mapped_output, nullptr);
  EXPECT_EQ(copied->bytes(), "first");
}

}  // namespace
}  // namespace pswitch::base
