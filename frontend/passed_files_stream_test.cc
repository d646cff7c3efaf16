// A passed file is streamed into pswitchd's sealed copy, never read whole into memory first: a
// client passing a large weights file or archive (up to 64 GiB) must not cost pswitchd its size
// in heap on top of the copy.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "base/files.h"
#include "frontend/passed_files.h"
#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

// This process's peak resident memory (VmHWM) in bytes; 0 when unknown.
uint64_t PeakResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    uint64_t kib = 0;
    std::string digits;
    for (char c : line) {
      if (c >= '0' && c <= '9') digits += c;
    }
    return absl::SimpleAtoi(digits, &kib) ? kib << 10 : 0;
  }
  return 0;
}

// Resets the peak to what is resident now (Linux 4.0+); false where it cannot.
bool ResetPeakResident() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

TEST(PassedFilesStreamTest, ALargeFileIsCopiedWithoutHoldingItInMemory) {
  constexpr size_t kFileBytes = size_t{192} << 20;
  char tmpl[] = "/tmp/pswitch-passed-stream-XXXXXX";
  const int made = ::mkstemp(tmpl);
  ASSERT_GE(made, 0);
  const std::string path = tmpl;
  {
    UniqueFd out(made);
    std::vector<char> chunk(size_t{1} << 20);
    for (size_t done = 0; done < kFileBytes; done += chunk.size()) {
      std::memset(chunk.data(), static_cast<int>('a' + (done >> 20) % 26), chunk.size());
      ASSERT_EQ(::write(out.get(), chunk.data(), chunk.size()), static_cast<ssize_t>(chunk.size()));
    }
  }
  UniqueFd passed(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ::unlink(path.c_str());
  ASSERT_TRUE(passed.valid());
  if (!ResetPeakResident()) GTEST_SKIP() << "cannot reset the peak resident size here";
  const uint64_t before = PeakResidentBytes();
  ASSERT_GT(before, 0u);

  auto sealed = SealPassedFile(passed, "the passed weights file", kFileBytes);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  const uint64_t grown = PeakResidentBytes() - before;
  // Reading it whole first would add its 192 MiB; streaming costs a bounded buffer at most.
  EXPECT_LT(grown, uint64_t{48} << 20) << "the copy held " << (grown >> 20) << " MiB at its peak";

  struct stat st;
  ASSERT_EQ(::fstat(sealed->get(), &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), kFileBytes);
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
  EXPECT_EQ(::fcntl(sealed->get(), F_GET_SEALS) & kSeals, kSeals);
  char last = 0;
  ASSERT_EQ(::pread(sealed->get(), &last, 1, static_cast<off_t>(kFileBytes - 1)), 1);
  EXPECT_EQ(last, static_cast<char>('a' + ((kFileBytes - 1) >> 20) % 26));
}

}  // namespace
}  // namespace pswitch::frontend
