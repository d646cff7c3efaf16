#include "controller/profile_process.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

// An executable script standing in for pswitch-worker (it ignores the profile flags).
class FakeProfiler {
 public:
  explicit FakeProfiler(const std::string& body) {
    char tmpl[] = "/tmp/pswitch-profiler-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/profiler";
    std::ofstream(path_) << "#!/bin/sh\n" << body << "\n";
    ::chmod(path_.c_str(), 0700);
  }
  ~FakeProfiler() { std::filesystem::remove_all(dir_); }
  ProfileChildOptions Options() const {
    ProfileChildOptions options;
    options.binary = path_;
    options.timeout = absl::Seconds(10);
    return options;
  }

 private:
  std::string dir_, path_;
};

TEST(ProfileInChildTest, TheRealProfilerReturnsEveryLayer) {
  ProfileChildOptions options;
  options.binary = PSWITCH_WORKER_PATH;
  options.timeout = absl::Seconds(60);
  auto profile = ProfileInChild(options, "tiny_mlp", 2);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_GT(profile->layers.size(), 1u);
  for (const grouping::LayerProfile& layer : profile->layers) EXPECT_GE(layer.exec_s, 0);
  EXPECT_EQ(ProfileInChild(options, "no_such_model", 2).status().code(),
            absl::StatusCode::kInternal);
}

// Trust-boundary issue, item 6: profiling at the client's batch ran inside pswitchd (batch 64:
// 26 s and +522 MiB of pswitchd's memory). In a child, it is held to a memory bound and a time
// bound, and killed at either.
TEST(ProfileInChildTest, AProfilerOverItsMemoryBoundIsKilled) {
  ProfileChildOptions options;
  options.binary = PSWITCH_WORKER_PATH;
  options.memory_bytes = 8 << 20;  // less than libtorch alone takes
  const absl::Time start = absl::Now();
  auto profile = ProfileInChild(options, "tiny_mlp", 2);
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kResourceExhausted) << profile.status();
  EXPECT_NE(profile.status().message().find("--profile-memory-bytes"), absl::string_view::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(ProfileInChildTest, AProfilerPastItsTimeoutIsKilled) {
  FakeProfiler hangs("exec sleep 60");
  ProfileChildOptions options = hangs.Options();
  options.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  EXPECT_EQ(ProfileInChild(options, "m", 1).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ProfileInChildTest, AFailingOrGarbledProfilerIsAnErrorNotAPlan) {
  FakeProfiler fails("exit 3");
  auto failed = ProfileInChild(fails.Options(), "m", 1);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(failed.status().message().find("exited with status 3"), absl::string_view::npos)
      << failed.status();
  FakeProfiler garbled("echo '{\"layers\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]'");
  EXPECT_EQ(ProfileInChild(garbled.Options(), "m", 1).status().code(),
            absl::StatusCode::kInternal);
  // Closing stdout and living on does not hold the registration past the timeout.
  FakeProfiler lingers("exec 1>&-; sleep 60");
  ProfileChildOptions options = lingers.Options();
  options.timeout = absl::Milliseconds(300);
  EXPECT_EQ(ProfileInChild(options, "m", 1).status().code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace pswitch::controller
