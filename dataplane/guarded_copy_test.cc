#include "dataplane/guarded_copy.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "base/unique_fd.h"
#include "dataplane/stream_copy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::dataplane {
namespace {

using ::testing::HasSubstr;

const size_t kPage = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

// A shared mapping of a memfd that the test can shrink under it, as a client can shrink a
// /dev/shm segment.
class ShrinkableFile {
 public:
  explicit ShrinkableFile(size_t bytes) : bytes_(bytes) {
    fd_.Reset(::memfd_create("guarded-copy-test", MFD_CLOEXEC));
    EXPECT_TRUE(fd_.valid());
    Resize(bytes);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    EXPECT_NE(p, MAP_FAILED);
    data_ = static_cast<unsigned char*>(p);
  }
  ~ShrinkableFile() { ::munmap(data_, bytes_); }
  void Resize(size_t bytes) { ASSERT_EQ(::ftruncate(fd_.get(), static_cast<off_t>(bytes)), 0); }
  unsigned char* data() { return data_; }

 private:
  const size_t bytes_;
  UniqueFd fd_;
  unsigned char* data_ = nullptr;
};

// The byte a DataLoss message says the fault was at ("... at byte N of ..."); 0 if none.
size_t FaultByte(absl::string_view message) {
  const size_t at = message.find("at byte ");
  if (at == absl::string_view::npos) return 0;
  const absl::string_view rest = message.substr(at + 8);
  size_t byte = 0;
  return absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &byte) ? byte : 0;
}

TEST(GuardedCopyTest, CopiesLikeMemcpy) {
  std::vector<unsigned char> src(10000), dst(10000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7);
  ASSERT_TRUE(GuardedCopy(dst.data(), src.data(), src.size(), "test region").ok());
  EXPECT_EQ(dst, src);
  EXPECT_TRUE(GuardedCopy(nullptr, nullptr, 0, "empty").ok());
}

TEST(GuardedCopyTest, ATruncatedSourceFailsTheCopyAndTheNextCopySucceeds) {
  ShrinkableFile file(4 * kPage);
  std::memset(file.data(), 0xab, 4 * kPage);
  std::vector<unsigned char> dst(4 * kPage, 0);
  file.Resize(kPage);  // the owner shrinks the segment: pages 1..3 are gone

  // Repeated, so a guard that left SIGBUS blocked (or disarmed) after the first fault would show.
  for (int round = 0; round < 3; ++round) {
    absl::Status copied = GuardedCopy(dst.data(), file.data(), 4 * kPage, "shm region 7");
    EXPECT_EQ(copied.code(), absl::StatusCode::kDataLoss) << copied;
    EXPECT_THAT(copied.message(), HasSubstr("shm region 7"));
    EXPECT_THAT(copied.message(), HasSubstr("SIGBUS reading it at byte " + std::to_string(kPage)));
  }
  // What is still there copies fine, and so does the whole once the file has grown back.
  ASSERT_TRUE(GuardedCopy(dst.data(), file.data(), kPage, "shm region 7").ok());
  EXPECT_EQ(dst[kPage - 1], 0xab);
  file.Resize(4 * kPage);
  ASSERT_TRUE(GuardedCopy(dst.data(), file.data(), 4 * kPage, "shm region 7").ok());
  EXPECT_EQ(dst[0], 0xab);
  EXPECT_EQ(dst[4 * kPage - 1], 0);  // the regrown pages are new zeroes
}

TEST(GuardedCopyTest, ATruncatedDestinationFailsTheCopy) {
  ShrinkableFile file(2 * kPage);
  std::vector<unsigned char> src(2 * kPage, 0x5c);
  file.Resize(0);
  absl::Status copied = GuardedCopy(file.data(), src.data(), src.size(), "output region 3");
  EXPECT_EQ(copied.code(), absl::StatusCode::kDataLoss) << copied;
  EXPECT_THAT(copied.message(), HasSubstr("writing into it at byte "));
  // Every page is gone; which store faults first is memcpy's choice (it varies with alignment).
  EXPECT_LT(FaultByte(copied.message()), 2 * kPage) << copied;
}

// A copy large enough to stream (non-temporal stores, StreamCopy) is guarded the same way, on
// either side.
TEST(GuardedCopyTest, AStreamedCopyFaultsLikeASmallOne) {
  const size_t bytes = kStreamCopyMinBytes + 4 * kPage;
  ShrinkableFile file(bytes);
  std::memset(file.data(), 0x3c, bytes);
  std::vector<unsigned char> other(bytes, 0);
  ASSERT_TRUE(GuardedCopy(other.data(), file.data(), bytes, "big region").ok());
  EXPECT_EQ(other[bytes - 1], 0x3c);

  file.Resize(kStreamCopyMinBytes);  // the last four pages are gone
  absl::Status read = GuardedCopy(other.data(), file.data(), bytes, "big region");
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss) << read;
  EXPECT_THAT(read.message(), HasSubstr("SIGBUS reading it"));
  // The first missing byte's 64-byte line: the line's four loads may be issued in any order.
  EXPECT_EQ(FaultByte(read.message()) / 64 * 64, kStreamCopyMinBytes) << read;
  absl::Status written = GuardedCopy(file.data(), other.data(), bytes, "big region");
  EXPECT_EQ(written.code(), absl::StatusCode::kDataLoss) << written;
  EXPECT_THAT(written.message(), HasSubstr("writing into it"));
  EXPECT_EQ(FaultByte(written.message()) / 64 * 64, kStreamCopyMinBytes) << written;
}

TEST(GuardedCopyTest, CopiesOnManyThreadsFaultIndependently) {
  ShrinkableFile file(2 * kPage);
  file.Resize(kPage);
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(4);
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      std::vector<unsigned char> dst(2 * kPage);
      // Even threads copy only what exists, odd ones run into the hole.
      const size_t bytes = t % 2 == 0 ? kPage : 2 * kPage;
      for (int i = 0; i < 50 && results[t].ok(); ++i) {
        results[t] = GuardedCopy(dst.data(), file.data(), bytes, "region");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t t = 0; t < results.size(); ++t) {
    EXPECT_EQ(results[t].code(), t % 2 == 0 ? absl::StatusCode::kOk : absl::StatusCode::kDataLoss)
        << t;
  }
}

// A fault outside any guarded copy is still fatal: the handler only catches its own copies.
TEST(GuardedCopyDeathTest, AFaultOutsideACopyStillKillsTheProcess) {
  ShrinkableFile file(2 * kPage);
  file.Resize(0);
  EXPECT_EXIT(
      {
        InstallCopyFaultHandler();
        volatile unsigned char* p = file.data();
        (void)p[kPage];
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

void ExitFortyTwo(int, siginfo_t*, void*) { ::_exit(42); }

// A handler installed before ours (a crash reporter, a sanitizer) still gets the faults that are
// not a guarded copy's, and ours still catches the copy's.
TEST(GuardedCopyDeathTest, FaultsOutsideACopyReachTheHandlerInstalledBefore) {
  // threadsafe: the child re-runs this test from a fresh process, so the earlier handler is
  // installed before ours.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        struct sigaction before {};
        before.sa_sigaction = ExitFortyTwo;
        before.sa_flags = SA_SIGINFO;
        sigemptyset(&before.sa_mask);
        ::sigaction(SIGBUS, &before, nullptr);
        ShrinkableFile file(2 * kPage);
        file.Resize(0);
        unsigned char dst[16];
        if (GuardedCopy(dst, file.data(), sizeof(dst), "r").code() != absl::StatusCode::kDataLoss) {
          ::_exit(1);
        }
        volatile unsigned char* p = file.data();
        (void)p[0];
        ::_exit(2);
      },
      ::testing::ExitedWithCode(42), "");
}

}  // namespace
}  // namespace pswitch::dataplane
