#include "gpu/activity_page.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gpu/host/compute_lock.h"
#include "gtest/gtest.h"

namespace pswitch::gpu {
namespace {

class ActivityPageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/page-", ::getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::remove(path_.c_str());
    std::remove((path_ + ".activity").c_str());
  }
  void TearDown() override {
    std::remove(path_.c_str());
    std::remove((path_ + ".activity").c_str());
  }
  std::string path_;
};

TEST_F(ActivityPageTest, WhatAJobRecordsIsWhatPswitchdReads) {
  EXPECT_EQ(ActivityReader::Open(path_).status().code(), absl::StatusCode::kNotFound);
  auto writer = ActivityWriter::Open(path_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  auto reader = ActivityReader::Open(path_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->Read()->launches, 0u);
  (*writer)->Launched();
  (*writer)->BeginBusy();
  absl::StatusOr<ActivityCounts> counts = reader->Read();
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->launches, 2u);
  EXPECT_EQ(counts->busy, 1u);
  (*writer)->EndBusy();
  EXPECT_EQ(reader->Read()->busy, 0u);
  // Another writer (the job restarted) adds to the same counters.
  writer->reset();
  auto again = ActivityWriter::Open(path_);
  ASSERT_TRUE(again.ok()) << again.status();
  (*again)->Launched();
  EXPECT_EQ(reader->Read()->launches, 3u);
}

TEST_F(ActivityPageTest, AFileThatIsNotAPageIsNeitherWrittenNorBelieved) {
  {
    std::ofstream f(path_);
    f << "not a page";
  }
  EXPECT_EQ(ActivityWriter::Open(path_).status().code(), absl::StatusCode::kFailedPrecondition);
  auto reader = ActivityReader::Open(path_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->Read().status().code(), absl::StatusCode::kDataLoss);
  std::ifstream f(path_);
  std::string text;
  std::getline(f, text);
  EXPECT_EQ(text, "not a page");
}

// What a hostile user can put at the path: a FIFO (opening it must not hang either side), a
// symlink to another file (never followed).
TEST_F(ActivityPageTest, AFifoOrASymlinkAtThePathIsRefusedWithoutHanging) {
  ASSERT_EQ(::mkfifo(path_.c_str(), 0644), 0);
  EXPECT_EQ(ActivityWriter::Open(path_).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ActivityReader::Open(path_).status().code(), absl::StatusCode::kFailedPrecondition);
  std::remove(path_.c_str());
  const std::string target = path_ + ".target";
  { std::ofstream f(target); }
  ASSERT_EQ(::symlink(target.c_str(), path_.c_str()), 0);
  EXPECT_FALSE(ActivityWriter::Open(path_).ok());
  EXPECT_FALSE(ActivityReader::Open(path_).ok());
  std::ifstream f(target, std::ios::ate);
  EXPECT_EQ(f.tellg(), 0) << "the symlink's target was written";
  std::remove(target.c_str());
}

// The host backend's simulated GPU: a main job's holds of the compute lock are its activity; a
// lock opened without recording (a fill task's) adds nothing.
TEST_F(ActivityPageTest, AComputeLockRecordsTheHoldsOfTheJobThatAskedForIt) {
  auto main_job = ComputeLock::Open(path_, /*record_activity=*/true);
  ASSERT_TRUE(main_job.ok()) << main_job.status();
  auto fill = ComputeLock::Open(path_);
  ASSERT_TRUE(fill.ok()) << fill.status();
  auto reader = ActivityReader::Open(path_ + ".activity");
  ASSERT_TRUE(reader.ok()) << reader.status();
  {
    ComputeLock::Hold hold = main_job->Acquire();
    EXPECT_EQ(reader->Read()->busy, 1u);
  }
  { ComputeLock::Hold hold = fill->Acquire(); }
  absl::StatusOr<ActivityCounts> counts = reader->Read();
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->launches, 1u);
  EXPECT_EQ(counts->busy, 0u);
}

}  // namespace
}  // namespace pswitch::gpu
