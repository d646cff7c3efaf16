#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gpu/activity_page.h"
#include "gtest/gtest.h"

namespace pswitch {
namespace {

// What `out` gives until its end.
std::string ReadAll(FILE* out) {
  std::string text;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), out) != nullptr) text += buffer;
  return text;
}

// Runs the stub caller (7 launch entry points, `n` times each; `mode` "sync": the 8
// synchronisations; "lookup": the driver's entry points found at run time)
// with `env` set; its output line.
std::string RunCaller(const std::string& env, int n, int* rc, const std::string& mode = "") {
  const std::string command =
      absl::StrCat(env, " ", PSWITCH_STUB_CALLER, " ", n, " ", mode, " 2>&1");
  FILE* out = ::popen(command.c_str(), "r");
  if (out == nullptr) return "popen failed";
  std::string text = ReadAll(out);
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

// A synchronisation is the job waiting for its device: busy while it waits, and a launch once it
// has waited (kSyncBusyNs); one that returns at once is no activity. Every call still reaches the
// real function.
TEST_F(LaunchMonitorTest, SynchronisationsThatWaitCountAsActivity) {
  int rc = -1;
  absl::StatusOr<gpu::ActivityReader> reader = absl::NotFoundError("not yet");
  // Returning at once is well under a microsecond (symbols bound at start: nothing resolved
  // inside the timed call); the fewest of three runs, so that a preemption inside one call on a
  // loaded machine does not count.
  uint64_t quick = UINT64_MAX, before = 0;
  for (int run = 0; run < 3; ++run) {
    EXPECT_EQ(RunCaller(Preloaded(page_) + " LD_BIND_NOW=1 STUB_SYNC_US=0", 3, &rc, "sync"),
              "calls=24 failed=0\n");
    EXPECT_EQ(rc, 0);
    if (!reader.ok()) reader = gpu::ActivityReader::Open(page_);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ(reader->Read()->busy, 0u);
    const uint64_t now = reader->Read()->launches;
    quick = std::min(quick, now - before);
    before = now;
  }
  EXPECT_LE(quick, 1u);  // a threshold that counted them all would give 24
  EXPECT_EQ(RunCaller(Preloaded(page_) + " STUB_SYNC_US=1000", 2, &rc, "sync"),
            "calls=16 failed=0\n");
  EXPECT_EQ(reader->Read()->launches, before + 16);
  EXPECT_EQ(reader->Read()->busy, 0u);
}

// While the job waits in a synchronisation the page shows it under way.
TEST_F(LaunchMonitorTest, AWaitingSynchronisationIsAHoldUnderWay) {
  // 8 synchronisations of 0.3 s each.
  const std::string command =
      absl::StrCat(Preloaded(page_), " STUB_SYNC_US=300000 ", PSWITCH_STUB_CALLER, " 1 sync 2>&1");
  FILE* out = ::popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  bool seen = false;
  for (int i = 0; i < 10000 && !seen; ++i) {  // bounded: 10 s
    if (auto reader = gpu::ActivityReader::Open(page_); reader.ok()) {
      absl::StatusOr<gpu::ActivityCounts> counts = reader->Read();
      seen = counts.ok() && counts->busy == 1;
    }
    if (!seen) ::usleep(1000);
  }
  EXPECT_TRUE(seen) << "the waiting synchronisation never showed as busy";
  const std::string text = ReadAll(out);
  EXPECT_EQ(::pclose(out), 0);
  EXPECT_EQ(text, "calls=8 failed=0\n");
  absl::StatusOr<gpu::ActivityReader> reader = gpu::ActivityReader::Open(page_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->Read()->busy, 0u);
  EXPECT_EQ(reader->Read()->launches, 8u);
}

// A statically linked CUDA runtime (PyTorch's, cuBLAS's) reaches the driver through
// cuGetProcAddress, found with dlsym in the driver's own handle: every launch and synchronisation
// it gives, in each variant, is counted and reaches the real function; RTLD_NEXT keeps its
// meaning for the job through the interposed dlsym.
TEST_F(LaunchMonitorTest, DriverEntryPointsLookedUpAtRunTimeAreCounted) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "dlsym is interposed on x86-64 only";
#endif
  int rc = -1;
  // 8 launches, 4 synchronisations and 8 copies of 1 ms, 3 times, then 2 launches. The copy of
  // the CUDA 3.0 ABI (32-bit sizes) is passed on unwrapped: not counted.
  const std::string counted = "calls=62 failed=0 variants=kept context=kept rtld_next=kept";
  EXPECT_EQ(RunCaller(Preloaded(page_) + " STUB_SYNC_US=1000", 3, &rc, "lookup"),
            counted + " by_name=wrapper\n");
  EXPECT_EQ(rc, 0);
  absl::StatusOr<gpu::ActivityReader> reader = gpu::ActivityReader::Open(page_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->Read()->launches, 59u);
  EXPECT_EQ(reader->Read()->busy, 0u);
  // Without the monitor, or without a page, the same calls reach the same functions, and the job
  // is handed the driver's own.
  EXPECT_EQ(RunCaller("env STUB_SYNC_US=1000", 3, &rc, "lookup"), counted + " by_name=stub\n");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(RunCaller(Preloaded("") + " STUB_SYNC_US=1000", 3, &rc, "lookup"),
            counted + " by_name=stub\n");
  EXPECT_EQ(rc, 0);
}

// Preloaded ahead of everything in the job, the library must export the CUDA entry points it
// interposes and nothing else: a C++ runtime symbol of its own (__cxa_throw, the personality
// routine) would take the place of the job's.
TEST(LaunchMonitorExportsTest, OnlyTheInterposedEntryPointsAreExported) {
  void* library = ::dlopen(PSWITCH_MONITOR_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(library, nullptr) << ::dlerror();
  for (const char* name :
       {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cudaGraphLaunch",
        "cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch", "cudaDeviceSynchronize",
        "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync",
        "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"}) {
    EXPECT_NE(::dlsym(library, name), nullptr) << name;
  }
#if defined(__x86_64__)
  // Its own dlsym, not the one of libc it depends on.
  Dl_info dlsym_at{}, launch_at{};
  ASSERT_NE(::dladdr(::dlsym(library, "dlsym"), &dlsym_at), 0);
  ASSERT_NE(::dladdr(::dlsym(library, "cudaLaunchKernel"), &launch_at), 0);
  EXPECT_EQ(dlsym_at.dli_fbase, launch_at.dli_fbase) << dlsym_at.dli_fname;
#endif
  for (const char* name : {"__cxa_throw", "__cxa_begin_catch", "__gxx_personality_v0",
                           "_Unwind_Resume", "__cxa_demangle", "_ZSt9terminatev"}) {
    EXPECT_EQ(::dlsym(library, name), nullptr) << name << " is exported";
  }
  ::dlclose(library);
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
