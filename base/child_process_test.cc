#include "base/child_process.h"

#include <stdlib.h>

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

}  // namespace
}  // namespace pswitch::base
