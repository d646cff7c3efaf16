#include "registry/inspection_child.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>

#include "base/files.h"
#include "grouping/profile.h"
#include "gtest/gtest.h"
#include "models/model_inspection.h"
#include "models/registry.h"
#include "models/script_model.h"

namespace pswitch::registry {
namespace {

// An executable standing in for pswitch-worker: it takes its request as the real one does and
// says so (a build-step progress report), then runs `body` as a shell script (which ignores the
// flags). Without `takes_request`, `body` runs at once and the request is never read.
class FakeInspector {
 public:
  explicit FakeInspector(const std::string& body, bool takes_request = true) {
    char tmpl[] = "/tmp/pswitch-inspector-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/inspector";
    std::ofstream script(path_);
    if (takes_request) {
      script << "#!/usr/bin/python3\n"
                "import os, socket, sys\n"
                "flag = '--inspect_request_fd='\n"
                "fd = next(int(a[len(flag):]) for a in sys.argv[1:] if a.startswith(flag))\n"
                "s = socket.socket(fileno=fd)\n"
                "socket.recv_fds(s, 65536, 4)\n"
                "s.send(bytes([1] + [0] * 8))\n"
                "os.execv('/bin/sh', ['sh', '-c', "
             << std::quoted(body, '\'') << "])\n";
    } else {
      script << "#!/bin/sh\n" << body << "\n";
    }
    script.close();
    ::chmod(path_.c_str(), 0700);
  }
  ~FakeInspector() { (void)base::RemoveTree(dir_); }
  InspectionChildOptions Options() const {
    InspectionChildOptions options;
    options.binary = path_;
    options.timeout = absl::Seconds(10);
    return options;
  }

 private:
  std::string dir_, path_;
};

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

absl::StatusOr<models::ModelFacts> Inspect(const InspectionChildOptions& options,
                                           const UniqueFd& fd, int weights_fd = -1) {
  return InspectInChild(options, {.name = "m",
                                  .archive_fd = fd.get(),
                                  .weights_fd = weights_fd,
                                  .weights_name = "w.safetensors",
                                  .max_facts_bytes = 64 << 20});
}

// The facts made here, in this process, for comparison.
void ExpectSameFacts(const models::ModelFacts& child, const models::ModelFacts& here) {
  ASSERT_EQ(child.layers.size(), here.layers.size());
  for (size_t l = 0; l < here.layers.size(); ++l) {
    const auto &a = child.layers[l], &b = here.layers[l];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.executed, b.executed);
    ASSERT_EQ(a.tensors.size(), b.tensors.size()) << a.name;
    for (size_t t = 0; t < a.tensors.size(); ++t) {
      EXPECT_EQ(a.tensors[t].name, b.tensors[t].name);
      ASSERT_EQ(a.tensors[t].bytes.size(), b.tensors[t].bytes.size());
      EXPECT_EQ(std::memcmp(a.tensors[t].bytes.data(), b.tensors[t].bytes.data(),
                            a.tensors[t].bytes.size()),
                0)
          << a.name << "." << a.tensors[t].name;
    }
  }
  EXPECT_EQ(child.optimizer_slot_bytes, here.optimizer_slot_bytes);
  EXPECT_EQ(child.trainable, here.trainable);
  EXPECT_EQ(child.input.shape, here.input.shape);
  EXPECT_EQ(child.output.shape, here.output.shape);
}

// A zoo model's facts from a child against the same model built and inspected here (seeded
// alike); returns its layer count.
size_t ExpectFactsOfZooModel(const models::ModelFacts& child, const std::string& zoo) {
  auto model = models::CreateModel(zoo);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return 0;
  auto here = models::InspectModel(**model);
  EXPECT_TRUE(here.ok()) << here.status();
  if (!here.ok()) return 0;
  ExpectSameFacts(child, *here);
  return here->layers.size();
}

InspectionChildOptions RealInspector() {
  InspectionChildOptions options;
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
    auto here = models::InspectModel(**model);
    ASSERT_TRUE(here.ok()) << here.status();
    ExpectSameFacts(*facts, *here);
    EXPECT_TRUE(facts->profile_json.empty()) << "no profile was asked for";
  }
}

// Issue 28 item 1: zoo models are inspected in the child too, seeded as this process would
// build them, and an "auto" plan's profile is measured there in the same run.
TEST(InspectInChildTest, AZooModelsFactsAndProfileComeFromOneChild) {
  auto facts = InspectInChild(
      RealInspector(),
      {.name = "m", .zoo = "tiny_cnn", .profile_batch = 2, .max_facts_bytes = 64 << 20});
  ASSERT_TRUE(facts.ok()) << facts.status();
  const size_t layers = ExpectFactsOfZooModel(*facts, "tiny_cnn");
  auto profile = grouping::ParseProfileJson(facts->profile_json);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->layers.size(), layers);
  for (const grouping::LayerProfile& layer : profile->layers) EXPECT_GE(layer.exec_s, 0);
  EXPECT_GT(facts->profile_us, 0u);
  auto unknown = InspectInChild(RealInspector(),
                                {.name = "m", .zoo = "no_such_model", .max_facts_bytes = 64 << 20});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
  EXPECT_NE(unknown.status().message().find("no_such_model"), absl::string_view::npos)
      << unknown.status();
}

// Trust-boundary issue, item 6: profiling at the client's batch ran inside pswitchd (batch 64:
// 26 s and +522 MiB of pswitchd's memory). In the child it is held to a memory bound and a time
// bound, and killed at either.
TEST(InspectInChildTest, AnInspectionOverItsMemoryBoundIsKilled) {
  InspectionChildOptions options = RealInspector();
  options.memory_bytes = 8 << 20;  // less than libtorch alone takes
  const absl::Time start = absl::Now();
  auto facts = InspectInChild(
      options, {.name = "m", .zoo = "tiny_mlp", .profile_batch = 2, .max_facts_bytes = 64 << 20});
  EXPECT_EQ(facts.status().code(), absl::StatusCode::kResourceExhausted) << facts.status();
  EXPECT_NE(facts.status().message().find("--profile-memory-bytes"), absl::string_view::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
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
  auto weights =
      models::SerializeSafetensors({{"no.such.key", models::DType::kF32, {3}, w.data(), 12}});
  auto weights_fd = base::SealedMemoryFile("weights", *weights);
  auto loaded = Inspect(RealInspector(), good, weights_fd->get());
  EXPECT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("w.safetensors"), absl::string_view::npos)
      << loaded.status();
}

TEST(InspectInChildTest, ACrashHangOrGarbleInTheCheckerIsARefusalNotACrash) {
  UniqueFd fd = ArchiveFile("residual_cnn.pswitch.pt");
  FakeInspector crashes("kill -SEGV $$");
  auto crashed = Inspect(crashes.Options(), fd);
  EXPECT_EQ(crashed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(crashed.status().message().find("killed by signal 11"), absl::string_view::npos)
      << crashed.status();
  FakeInspector garbled("echo 'not facts'");
  EXPECT_EQ(Inspect(garbled.Options(), fd).status().code(), absl::StatusCode::kInvalidArgument);
  FakeInspector lies("printf '{\"code\": 0, \"message\": \"fine\"}'; exit 3");
  EXPECT_EQ(Inspect(lies.Options(), fd).status().code(), absl::StatusCode::kInternal);
  FakeInspector floods("head -c 20000000 /dev/zero");
  auto flooded = InspectInChild(floods.Options(),
                                {.name = "m", .archive_fd = fd.get(), .max_facts_bytes = 1 << 20});
  EXPECT_EQ(flooded.status().code(), absl::StatusCode::kResourceExhausted) << flooded.status();
  FakeInspector hangs("exec sleep 60");
  InspectionChildOptions options = hangs.Options();
  options.timeout = absl::Milliseconds(300);
  EXPECT_EQ(Inspect(options, fd).status().code(), absl::StatusCode::kDeadlineExceeded);
  // Closing stdout and living on does not hold the registration past the timeout.
  FakeInspector lingers("exec 1>&-; exec sleep 60");
  options = lingers.Options();
  options.timeout = absl::Milliseconds(300);
  EXPECT_EQ(Inspect(options, fd).status().code(), absl::StatusCode::kDeadlineExceeded);
}

// Issue 28: the next registration's child is started ahead, and it is still one child per
// registration: each inspection takes the standby and another is started after it.
TEST(InspectorTest, EachInspectionTakesTheStandbyAndAFreshOneReplacesIt) {
  {
    Inspector inspector(RealInspector());
    const pid_t first = inspector.standby_pid();
    ASSERT_GT(first, 0);
    auto facts = inspector.Inspect(
        {.name = "m", .zoo = "tiny_cnn", .profile_batch = 2, .max_facts_bytes = 64 << 20});
    ASSERT_TRUE(facts.ok()) << facts.status();
    ExpectFactsOfZooModel(*facts, "tiny_cnn");
    EXPECT_FALSE(facts->profile_json.empty());
    EXPECT_EQ(inspector.standby_used(), 1u);
    const pid_t second = inspector.standby_pid();
    ASSERT_GT(second, 0);
    EXPECT_NE(second, first) << "a child inspects one registration only";
    EXPECT_NE(::kill(first, 0), 0) << "the used child has exited and been reaped";
    UniqueFd fd = ArchiveFile("residual_cnn.pswitch.pt");
    auto archive =
        inspector.Inspect({.name = "a", .archive_fd = fd.get(), .max_facts_bytes = 64 << 20});
    ASSERT_TRUE(archive.ok()) << archive.status();
    EXPECT_EQ(inspector.standby_used(), 2u);
    // A refusal comes back from a standby as from a child started for it.
    auto unknown =
        inspector.Inspect({.name = "m", .zoo = "no_such_model", .max_facts_bytes = 64 << 20});
    EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
    EXPECT_EQ(inspector.standby_used(), 3u);
  }
  // The last standby went with its Inspector: nothing is left to reap.
  int status = 0;
  EXPECT_EQ(::waitpid(-1, &status, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(InspectorTest, AStandbyThatDiedWhileWaitingIsReplacedNotUsed) {
  Inspector inspector(RealInspector());
  const pid_t standby = inspector.standby_pid();
  ASSERT_GT(standby, 0);
  ASSERT_EQ(::kill(standby, SIGKILL), 0);
  // Dead (a zombie until the Inspector reaps it) before the inspection looks at it.
  auto state = [standby] {
    std::ifstream stat("/proc/" + std::to_string(standby) + "/stat");
    std::string pid, comm, state;
    stat >> pid >> comm >> state;
    return state;
  };
  for (int i = 0; i < 400 && state() != "Z"; ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(state(), "Z");
  auto facts = inspector.Inspect({.name = "m", .zoo = "tiny_mlp", .max_facts_bytes = 64 << 20});
  ASSERT_TRUE(facts.ok()) << facts.status();
  EXPECT_EQ(inspector.standby_used(), 0u);
}

// A child that ends before it takes its request is the inspector's failure, not the model's: it
// is tried once more in a fresh child, then refused as Internal without blaming the archive.
TEST(InspectorTest, AChildThatEndsBeforeTakingItsRequestIsNotBlamedOnTheModel) {
  UniqueFd fd = ArchiveFile("residual_cnn.pswitch.pt");
  FakeInspector dies("kill -SEGV $$", /*takes_request=*/false);
  Inspector inspector(dies.Options());
  auto facts = inspector.Inspect({.name = "m", .archive_fd = fd.get(), .max_facts_bytes = 1 << 20});
  EXPECT_EQ(facts.status().code(), absl::StatusCode::kInternal) << facts.status();
  const std::string message(facts.status().message());
  EXPECT_NE(message.find("killed by signal 11 (Segmentation fault) before it took the request"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("archive is damaged"), std::string::npos) << message;
}

// A standby waits as long as it must; the inspection's time bound starts with its request.
TEST(InspectorTest, TheTimeBoundCountsFromTheRequestNotFromTheStandbysStart) {
  // Answers (garbage) as soon as its request comes, not before.
  FakeInspector answers("echo 'not facts'");
  InspectionChildOptions options = answers.Options();
  options.timeout = absl::Seconds(2);
  Inspector inspector(options);
  absl::SleepFor(absl::Seconds(2.5));
  UniqueFd fd = ArchiveFile("residual_cnn.pswitch.pt");
  auto facts = inspector.Inspect({.name = "m", .archive_fd = fd.get(), .max_facts_bytes = 1 << 20});
  EXPECT_EQ(facts.status().code(), absl::StatusCode::kInvalidArgument) << facts.status();
  EXPECT_EQ(inspector.standby_used(), 1u);
}

}  // namespace
}  // namespace pswitch::registry
