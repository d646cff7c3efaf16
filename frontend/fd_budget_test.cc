#include "frontend/fd_budget.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

using ::testing::HasSubstr;

FdDemand Defaults() {
  return FdDemand{.tcp_connections = 256,
                  .unauthenticated_connections = 32,
                  .http_connections = 256,
                  .gpus = 1,
                  .workers_per_gpu = 3};
}

TEST(FdBudgetTest, TheNeedCountsEveryConnectionCapWorkersAndAMargin) {
  const FdDemand demand = Defaults();
  EXPECT_EQ(FdsNeeded(demand), 256 + 32 + 256 + (kFdsPerGpu + 3 * kFdsPerWorker) + kFdsBase);
  FdDemand more_gpus = demand;
  more_gpus.gpus = 4;
  EXPECT_EQ(FdsNeeded(more_gpus) - FdsNeeded(demand), 3 * (kFdsPerGpu + 3 * kFdsPerWorker));
  FdDemand more_http = demand;
  more_http.http_connections = 1256;
  EXPECT_EQ(FdsNeeded(more_http) - FdsNeeded(demand), 1000u);
}

// The defaults fit systemd's default soft limit of 1,024 (and so any hard limit above it).
TEST(FdBudgetTest, TheDefaultsFitTheUsualSoftLimit) {
  EXPECT_TRUE(CheckFdBudget(Defaults(), 1024).ok());
  EXPECT_LE(FdsNeeded(Defaults()), 1024u);
}

// Issue 27, item 2: 1,500 idle HTTP connections under a 1,024 limit starved the TCP port and a
// worker's respawn. A limit short of the caps is refused, naming the numbers and the remedies.
TEST(FdBudgetTest, ALimitShortOfTheCapsIsRefusedWithTheReason) {
  FdDemand demand = Defaults();
  demand.http_connections = 1500;
  absl::Status refused = CheckFdBudget(demand, 1024);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("RLIMIT_NOFILE allows 1024"));
  EXPECT_THAT(refused.message(), HasSubstr("1500 HTTP"));
  EXPECT_THAT(refused.message(), HasSubstr("LimitNOFILE"));
  EXPECT_THAT(refused.message(), HasSubstr("--http-max-connections"));
  EXPECT_FALSE(CheckFdBudget(Defaults(), 64).ok());
  EXPECT_TRUE(CheckFdBudget(demand, FdsNeeded(demand)).ok());
  EXPECT_FALSE(CheckFdBudget(demand, FdsNeeded(demand) - 1).ok());
}

// In a child (the limits are the process's): a soft limit below the hard one is raised to it.
TEST(FdBudgetTest, RaiseFdLimitLiftsTheSoftLimitToTheHardLimit) {
  rlimit current{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &current), 0);
  if (current.rlim_max != RLIM_INFINITY && current.rlim_max < 128) GTEST_SKIP() << "hard limit";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit lowered = current;
    lowered.rlim_cur = 100;
    if (::setrlimit(RLIMIT_NOFILE, &lowered) != 0) ::_exit(2);
    absl::StatusOr<FdLimit> raised = RaiseFdLimit();
    if (!raised.ok()) ::_exit(3);
    rlimit now{};
    ::getrlimit(RLIMIT_NOFILE, &now);
    const bool ok = raised->soft == raised->hard || current.rlim_max == RLIM_INFINITY;
    ::_exit(ok && now.rlim_cur == raised->soft && raised->soft > 100 ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace pswitch::frontend
