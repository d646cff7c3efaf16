#include "registry/profile_process.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/files.h"
#include "gtest/gtest.h"
#include "models/script_model.h"
#include "worker/model_inspection.h"

namespace pswitch::registry {
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

// Archives are checked in a child: pswitchd takes only their facts back, the same facts as the
// archive loaded in this process gives.
const std::string kArchives = std::string(PSWITCH_TEST_DATA_DIR) + "/archives/";

UniqueFd ArchiveFile(const std::string& file) {
  auto bytes = base::ReadRegularFile(kArchives + file, "archive", 64 << 20);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  auto fd = base::SealedMemoryFile("archive", bytes.ok() ? *bytes : "");
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? std::move(*fd) : UniqueFd();
}

absl::StatusOr<models::ModelFacts> Inspect(const ProfileChildOptions& options, const UniqueFd& fd,
                                           int weights_fd = -1) {
  return InspectInChild(options, "m", fd.get(), weights_fd, "w.safetensors", 64 << 20);
}

ProfileChildOptions RealInspector() {
  ProfileChildOptions options;
  options.binary = PSWITCH_WORKER_PATH;
  options.timeout = absl::Seconds(60);
  return options;
}

TEST(InspectInChildTest, TheChildsFactsAreThoseOfTheArchiveLoadedHere) {
  for (const std::string file : {"residual_cnn.pswitch.pt", "tiny_transformer.pswitch.pt"}) {
    SCOPED_TRACE(file);
    UniqueFd fd = ArchiveFile(file);
    auto facts = Inspect(RealInspector(), fd);
    ASSERT_TRUE(facts.ok()) << facts.status();
    auto bytes = base::ReadRegularFile(kArchives + file, "archive", 64 << 20);
    auto model = models::LoadScriptModel(file, *bytes, file);
    ASSERT_TRUE(model.ok()) << model.status();
    auto here = worker::InspectModel(**model);
    ASSERT_TRUE(here.ok()) << here.status();
    ASSERT_EQ(facts->layers.size(), here->layers.size());
    for (size_t l = 0; l < here->layers.size(); ++l) {
      const auto &a = facts->layers[l], &b = here->layers[l];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.executed, b.executed);
      ASSERT_EQ(a.tensors.size(), b.tensors.size()) << a.name;
      for (size_t t = 0; t < a.tensors.size(); ++t) {
        EXPECT_EQ(a.tensors[t].name, b.tensors[t].name);
        ASSERT_EQ(a.tensors[t].bytes.size(), b.tensors[t].bytes.size());
        EXPECT_EQ(std::memcmp(a.tensors[t].bytes.data(), b.tensors[t].bytes.data(),
                              a.tensors[t].bytes.size()), 0)
            << a.name << "." << a.tensors[t].name;
      }
    }
    EXPECT_EQ(facts->optimizer_slot_bytes, here->optimizer_slot_bytes);
    EXPECT_EQ(facts->trainable, here->trainable);
    EXPECT_EQ(facts->input.shape, here->input.shape);
    EXPECT_EQ(facts->output.shape, here->output.shape);
  }
}

TEST(InspectInChildTest, TheArchivesRefusalComesBackNamingTheParameter) {
  UniqueFd fd = ArchiveFile("float64.pt");
  auto facts = Inspect(RealInspector(), fd);
  EXPECT_EQ(facts.status().code(), absl::StatusCode::kInvalidArgument) << facts.status();
  EXPECT_NE(facts.status().message().find("parameter 'fc.weight'"), absl::string_view::npos)
      << facts.status();
  // A checkpoint that does not fit the archive: the child's LoadWeights says which key.
  UniqueFd good = ArchiveFile("residual_cnn.pswitch.pt");
  const std::vector<float> w(3, 1.0f);
  auto weights = models::SerializeSafetensors({{"no.such.key", models::DType::kF32, {3}, w.data(), 12}});
  auto weights_fd = base::SealedMemoryFile("weights", *weights);
  auto loaded = Inspect(RealInspector(), good, weights_fd->get());
  EXPECT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("w.safetensors"), absl::string_view::npos)
      << loaded.status();
}

TEST(InspectInChildTest, ACrashHangOrGarbleInTheCheckerIsARefusalNotACrash) {
  UniqueFd fd = ArchiveFile("residual_cnn.pswitch.pt");
  FakeProfiler crashes("kill -SEGV $$");
  auto crashed = Inspect(crashes.Options(), fd);
  EXPECT_EQ(crashed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(crashed.status().message().find("killed by signal 11"), absl::string_view::npos)
      << crashed.status();
  FakeProfiler garbled("echo 'not facts'");
  EXPECT_EQ(Inspect(garbled.Options(), fd).status().code(), absl::StatusCode::kInvalidArgument);
  FakeProfiler lies("printf '{\"code\": 0, \"message\": \"fine\"}'; exit 3");
  EXPECT_EQ(Inspect(lies.Options(), fd).status().code(), absl::StatusCode::kInternal);
  FakeProfiler floods("head -c 20000000 /dev/zero");
  auto flooded = InspectInChild(floods.Options(), "m", fd.get(), -1, "", 1 << 20);
  EXPECT_EQ(flooded.status().code(), absl::StatusCode::kResourceExhausted) << flooded.status();
  FakeProfiler hangs("exec sleep 60");
  ProfileChildOptions options = hangs.Options();
  options.timeout = absl::Milliseconds(300);
  EXPECT_EQ(Inspect(options, fd).status().code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace pswitch::registry
