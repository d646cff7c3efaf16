#include "base/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::base {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override { previous_ = SetLogSink(sink_); }
  void TearDown() override {
    SetLogSink(previous_);
    SetMinLogLevel(LogLevel::kInfo);
  }
  std::shared_ptr<MemoryLogSink> sink_ = std::make_shared<MemoryLogSink>();
  std::shared_ptr<LogSink> previous_;
};

TEST_F(LogTest, EveryLineHasTimeLevelAndEventThenItsFields) {
  Log(LogLevel::kWarn, "task_switch")
      .Field("task", 7)
      .Field("model", "resnet50")
      .Field("copy_ms", 1.23456)
      .FieldMs("wait_ms", absl::Microseconds(2500))
      .Field("ok", true);
  std::vector<std::string> lines = sink_->Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], StartsWith("ts=20"));
  EXPECT_THAT(lines[0], HasSubstr("Z level=warn event=task_switch task=7 model=resnet50 "
                                  "copy_ms=1.235 wait_ms=2.500 ok=1"));
}

TEST_F(LogTest, ValuesThatAreNotPlainTokensAreQuotedAndEscaped) {
  EXPECT_EQ(LogfmtValue("plain-token_1.5"), "plain-token_1.5");
  EXPECT_EQ(LogfmtValue(""), "\"\"");
  EXPECT_EQ(LogfmtValue("two words"), "\"two words\"");
  EXPECT_EQ(LogfmtValue("a=b"), "\"a=b\"");
  EXPECT_EQ(LogfmtValue("say \"hi\" \\ bye"), "\"say \\\"hi\\\" \\\\ bye\"");
  // A value cannot forge a second line or a field: newlines and control bytes are escaped.
  EXPECT_EQ(LogfmtValue("x\nlevel=error event=fake"), "\"x\\nlevel=error event=fake\"");
  EXPECT_EQ(LogfmtValue(std::string("\x01\x7f", 2)), "\"\\x01\\x7f\"");
  Log(LogLevel::kError, "failed").Field("error", absl::InvalidArgumentError("bad \"x\""));
  EXPECT_THAT(sink_->Lines().at(0),
              HasSubstr("event=failed error=\"INVALID_ARGUMENT: bad \\\"x\\\"\""));
}

TEST_F(LogTest, LinesBelowTheMinimumLevelAreDropped) {
  Log(LogLevel::kDebug, "noise").Field("n", 1);
  EXPECT_TRUE(sink_->Lines().empty());
  SetMinLogLevel(LogLevel::kDebug);
  Log(LogLevel::kDebug, "noise").Field("n", 2);
  EXPECT_EQ(sink_->Events("noise").size(), 1u);
}

TEST_F(LogTest, EventsCanBeQueriedAndAwaitedByTheirFields) {
  std::thread later([] {
    absl::SleepFor(absl::Milliseconds(20));
    Log(LogLevel::kInfo, "bubble_cycle_registered").Field("gpu", 1);
  });
  Log(LogLevel::kInfo, "bubble_cycle_registered").Field("gpu", 0);
  Log(LogLevel::kInfo, "bubble_cycle_registered_twice").Field("gpu", 1);
  EXPECT_TRUE(sink_->AwaitEvent("bubble_cycle_registered", {"gpu=1"}, absl::Seconds(10)));
  later.join();
  EXPECT_EQ(sink_->Events("bubble_cycle_registered").size(), 2u);
  EXPECT_EQ(sink_->Events("bubble_cycle_registered", {"gpu=0"}).size(), 1u);
  EXPECT_FALSE(sink_->AwaitEvent("never", {}, absl::Milliseconds(10)));
}

// Many threads logging to one file descriptor: every line arrives whole, none interleaved.
TEST(FdLogSinkTest, ConcurrentLinesArriveWhole) {
  char path[] = "/tmp/pswitch-log-test-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  auto previous = SetLogSink(std::make_shared<FdLogSink>(fd));
  std::vector<std::thread> threads;
  const std::string payload(300, 'x');
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &payload] {
      for (int i = 0; i < 200; ++i) Log(LogLevel::kInfo, "spam").Field("t", t).Field("p", payload);
    });
  }
  for (auto& t : threads) t.join();
  SetLogSink(previous);
  std::string text(static_cast<size_t>(::lseek(fd, 0, SEEK_END)), '\0');
  ASSERT_EQ(::pread(fd, text.data(), text.size(), 0), static_cast<ssize_t>(text.size()));
  ::close(fd);
  ::unlink(path);
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++lines;
    ASSERT_THAT(std::string(line), StartsWith("ts="));
    ASSERT_THAT(std::string(line), HasSubstr(" p=" + payload));
  }
  EXPECT_EQ(lines, 8 * 200);
}

}  // namespace
}  // namespace pswitch::base
