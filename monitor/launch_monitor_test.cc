#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gpu/activity_page.h"
#include "gtest/gtest.h"

namespace pswitch {
namespace {

// Runs the stub caller (7 entry points, `n` times each) with `env` set; its output line.
std::string RunCaller(const std::string& env, int n, int* rc) {
  const std::string command = absl::StrCat(env, " ", PSWITCH_STUB_CALLER, " ", n, " 2>&1");
  FILE* out = ::popen(command.c_str(), "r");
  if (out == nullptr) return "popen failed";
  std::string text;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), out) != nullptr) text += buffer;
  *rc = ::pclose(out);
  return text;
}

class LaunchMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    page_ = absl::StrCat(::testing::TempDir(), "/monitor-", ::getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::remove(page_.c_str());
  }
  void TearDown() override { std::remove(page_.c_str()); }
  std::string Preloaded(const std::string& page) const {
    return absl::StrCat("env ", page.empty() ? "-u PSWITCH_ACTIVITY_FILE " : "",
                        "LD_PRELOAD=", PSWITCH_MONITOR_LIBRARY,
                        page.empty() ? "" : " PSWITCH_ACTIVITY_FILE=", page);
  }
  std::string page_;
};

TEST_F(LaunchMonitorTest, EveryLaunchIsCountedAndStillReachesTheRealFunction) {
  int rc = -1;
  const std::string out = RunCaller(Preloaded(page_), 5, &rc);
  EXPECT_EQ(rc, 0) << out;
  // Every call reached the stub, with its arguments (the last cuLaunchKernel's grid: 4 + 7).
  EXPECT_EQ(out, "calls=35 last_grid_x=11 failed=0\n");
  absl::StatusOr<gpu::ActivityReader> reader = gpu::ActivityReader::Open(page_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<gpu::ActivityCounts> counts = reader->Read();
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->launches, 35u);
  EXPECT_EQ(counts->busy, 0u);
  // A second run (a job restarted) adds to the same page.
  EXPECT_EQ(RunCaller(Preloaded(page_), 2, &rc), "calls=14 last_grid_x=8 failed=0\n");
  EXPECT_EQ(reader->Read()->launches, 49u);
}

TEST_F(LaunchMonitorTest, WithoutAPageTheJobRunsAsWithoutTheMonitor) {
  int rc = -1;
  const std::string bare = RunCaller("env", 3, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(bare, "calls=21 last_grid_x=9 failed=0\n");
  EXPECT_EQ(RunCaller(Preloaded(""), 3, &rc), bare);
  EXPECT_EQ(rc, 0);
  // A page it cannot create (no such directory) changes nothing either.
  EXPECT_EQ(RunCaller(Preloaded("/nonexistent-dir/page"), 3, &rc), bare);
  EXPECT_EQ(rc, 0);
}

TEST_F(LaunchMonitorTest, AFileThatIsNotAPageIsLeftAlone) {
  {
    std::ofstream f(page_);
    f << "someone else's file, not an activity page";
  }
  int rc = -1;
  EXPECT_EQ(RunCaller(Preloaded(page_), 3, &rc), "calls=21 last_grid_x=9 failed=0\n");
  EXPECT_EQ(rc, 0);
  std::ifstream f(page_);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_EQ(text.str().substr(0, 12), "someone else");
  EXPECT_EQ(gpu::ActivityReader::Open(page_)->Read().status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace pswitch
