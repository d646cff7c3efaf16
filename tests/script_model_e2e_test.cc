// Your own model through pswitchd: archives made by pswitch.export (tests/data/archives, from
// tests/data/make_archives.py) registered from the model repository and by clients, served with
// pipelined switches, trained with preemption, and refused with clear errors when broken.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/weights.h"
#include "tests/e2e_helpers.h"
#include "tests/test_daemon.h"
#include "worker/host_tensors.h"

namespace pswitch {
namespace {

using ::testing::HasSubstr;

const std::filesystem::path kArchives = std::filesystem::path(PSWITCH_TEST_DATA_DIR) / "archives";

struct PythonIo {
  proto::HostTensor input;
  at::Tensor output;
};

PythonIo ReadIo(const std::string& name) {
  auto io = models::ReadTensors((kArchives / (name + ".io.safetensors")).string());
  EXPECT_TRUE(io.ok()) << io.status();
  std::map<std::string, at::Tensor> by_name(io->begin(), io->end());
  auto host = worker::ToHostTensor("input", by_name.at("input"));
  EXPECT_TRUE(host.ok()) << host.status();
  return {*host, by_name.at("output").contiguous()};
}

void ExpectMatches(const proto::HostTensor& got, const at::Tensor& expected) {
  std::vector<float> values = e2e::Floats(got);
  ASSERT_EQ(static_cast<int64_t>(values.size()), expected.numel());
  const float* want = expected.data_ptr<float>();
  double scale = 1, worst = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) scale = std::max(scale, double{std::abs(want[i])});
  for (int64_t i = 0; i < expected.numel(); ++i) {
    worst = std::max(worst, double{std::abs(values[i] - want[i])});
  }
  EXPECT_LT(worst, 1e-5 * scale);
}

// A model repository holding `folders` (name -> archive file), each config naming its archive.
class Repository {
 public:
  explicit Repository(const std::map<std::string, std::string>& folders) {
    char tmpl[] = "/tmp/pswitch-script-repo-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (const auto& [name, archive] : folders) {
      std::filesystem::create_directories(dir_ / name);
      std::filesystem::copy_file(kArchives / archive, dir_ / name / "m.pswitch.pt");
      std::ofstream(dir_ / name / "config.json") << R"({"archive": "m.pswitch.pt", "batch": 2})";
    }
  }
  ~Repository() { (void)base::RemoveTree(dir_); }
  std::string flag() const { return "--model-repository=" + dir_.string(); }

 private:
  std::filesystem::path dir_;
};

void AwaitListed(client::Client& client, const std::vector<std::string>& names,
                 const e2e::TestDaemon& daemon) {
  for (int i = 0; i < 400; ++i) {
    auto models = client.ListModels();
    ASSERT_TRUE(models.ok()) << models.status();
    size_t found = 0;
    for (const auto& m : *models) {
      for (const auto& n : names) found += m.name == n ? 1 : 0;
    }
    if (found == names.size()) return;
    absl::SleepFor(absl::Milliseconds(50));
  }
  FAIL() << "models not registered in time\n" << daemon.log();
}

TEST(ScriptModelE2eTest, OwnModelsServeAcrossSwitchesAndMatchPython) {
  Repository repo({{"cnn", "residual_cnn.pswitch.pt"}, {"tf", "tiny_transformer.pswitch.pt"}});
  e2e::TestDaemon daemon({"--preload=", repo.flag(), "--allow-client-paths=false"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto client = client::Client::Connect(daemon.address());
  ASSERT_TRUE(client.ok()) << client.status();
  AwaitListed(**client, {"cnn", "tf"}, daemon);
  auto models = (*client)->ListModels();
  ASSERT_TRUE(models.ok());
  for (const auto& m : *models) EXPECT_EQ(m.zoo_model, "torchscript") << m.name;

  PythonIo cnn = ReadIo("residual_cnn"), tf = ReadIo("tiny_transformer");
  // Alternating models: the first request of each copies it in; after that both are resident in
  // the GPU's weights cache and nothing is copied again.
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    auto a = (*client)->Infer("cnn", {cnn.input});
    ASSERT_TRUE(a.ok()) << a.status();
    ExpectMatches(a->outputs[0], cnn.output);
    auto b = (*client)->Infer("tf", {tf.input});
    ASSERT_TRUE(b.ok()) << b.status();
    ExpectMatches(b->outputs[0], tf.output);
    if (round == 0) {
      EXPECT_GT(b->switch_time, absl::ZeroDuration());
    } else {
      EXPECT_EQ(a->switch_time, absl::ZeroDuration());
      EXPECT_EQ(b->switch_time, absl::ZeroDuration());
    }
  }
  // The wrong dtype is the client's error, not the server's.
  auto wrong = (*client)->Infer("tf", {cnn.input});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
}

TEST(ScriptModelE2eTest, PreemptedTrainingOfAnOwnModelEndsBitIdenticalToAnUninterruptedRun) {
  Repository repo({{"a", "residual_cnn.pswitch.pt"},
                   {"b", "residual_cnn.pswitch.pt"},
                   {"tf", "tiny_transformer.pswitch.pt"}});
  e2e::TestDaemon daemon({"--preload=", repo.flag(), "--allow-client-paths=false"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto client = client::Client::Connect(daemon.address());
  ASSERT_TRUE(client.ok()) << client.status();
  AwaitListed(**client, {"a", "b", "tf"}, daemon);
  PythonIo cnn = ReadIo("residual_cnn"), tf = ReadIo("tiny_transformer");

  client::TrainOptions options;
  options.iterations = 200;
  options.seed = 5;
  options.optimizer = client::Optimizer::kAdam;
  options.learning_rate = 1e-3;
  options.momentum = 0;
  auto straight = (*client)->Train("b", options);
  ASSERT_TRUE(straight.ok()) << straight.status();

  auto training = (*client)->TrainAsync("a", options);
  int inferences = 0;
  while (training.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready &&
         inferences < 200) {
    ASSERT_TRUE((*client)->Infer("tf", {tf.input}).ok());
    ++inferences;
  }
  auto interrupted = training.get();
  ASSERT_TRUE(interrupted.ok()) << interrupted.status();
  auto status = (*client)->Status(interrupted->task_id);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->iterations_done, options.iterations);
  ASSERT_GE(status->preemptions, 1u) << "inferences sent: " << inferences;

  auto a = (*client)->Infer("a", {cnn.input});
  auto b = (*client)->Infer("b", {cnn.input});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->outputs[0].data, b->outputs[0].data);  // bit for bit
  std::vector<float> trained = e2e::Floats(a->outputs[0]);
  std::vector<float> untrained(cnn.output.data_ptr<float>(),
                               cnn.output.data_ptr<float>() + cnn.output.numel());
  EXPECT_NE(trained, untrained);  // training really moved the weights
}

TEST(ScriptModelE2eTest, AFillJobTrainsACopyOfAnOwnModelInBubblesExactly) {
  Repository repo({{"cnn", "residual_cnn.pswitch.pt"}, {"reference", "residual_cnn.pswitch.pt"}});
  e2e::TestDaemon daemon({"--preload=", repo.flag(), "--allow-client-paths=false",
                          "--arena-bytes=536870912", "--standby-workers=1",
                          "--activation-bytes=67108864", "--fill-grace-ms=30"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto client = client::Client::Connect(daemon.address());
  ASSERT_TRUE(client.ok()) << client.status();
  AwaitListed(**client, {"cnn", "reference"}, daemon);
  const absl::Duration bubble = absl::Milliseconds(20);
  ASSERT_TRUE((*client)
                  ->RegisterBubbleCycle(0, absl::StrCat(R"({"period_ns": )",
                                                        absl::ToInt64Nanoseconds(bubble * 3),
                                                        R"(, "bubbles": [{"offset_ns": 0, )",
                                                        R"("duration_ns": )",
                                                        absl::ToInt64Nanoseconds(bubble),
                                                        R"(, "free_bytes": 67108864}]})"))
                  .ok());
  constexpr uint32_t kSteps = 40;
  client::FillJobOptions o;
  o.kind = client::FillKind::kTraining;
  o.model = "cnn";  // a model of the user's own, registered from its archive
  o.batch = 2;
  o.steps = kSteps;
  o.seed = 9;
  o.step = absl::Milliseconds(4);
  o.memory_bytes = 32 << 20;
  auto job = (*client)->SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();
  client::FillJobStatus status;
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE((*client)->BubbleBegin(0, bubble, 64 << 20).ok());
    absl::SleepFor(bubble);
    ASSERT_TRUE((*client)->BubbleEnd(0).ok());
    absl::SleepFor(absl::Milliseconds(5));
    auto s = (*client)->FillStatus(job->job_id);
    ASSERT_TRUE(s.ok()) << s.status();
    status = *s;
    if (status.state == client::FillState::kStopped) break;
  }
  ASSERT_EQ(status.state, client::FillState::kStopped) << daemon.log();
  ASSERT_TRUE(status.error.ok()) << status.error;
  EXPECT_EQ(status.steps_done, kSteps);

  client::TrainOptions train;
  train.iterations = kSteps;
  train.seed = 9;
  train.batch = 2;
  ASSERT_TRUE((*client)->Train("reference", train).ok());
  PythonIo cnn = ReadIo("residual_cnn");
  auto filled = (*client)->Infer(absl::StrCat("fill-", job->job_id), {cnn.input});
  auto reference = (*client)->Infer("reference", {cnn.input});
  ASSERT_TRUE(filled.ok() && reference.ok()) << filled.status() << reference.status();
  EXPECT_EQ(filled->outputs[0].data, reference->outputs[0].data);
  // The original is untouched: the job trained its own copy.
  auto original = (*client)->Infer("cnn", {cnn.input});
  ASSERT_TRUE(original.ok());
  ExpectMatches(original->outputs[0], cnn.output);
}

TEST(ScriptModelE2eTest, BrokenArchivesAreRefusedClearlyAndLeaveNothingBehind) {
  Repository repo({{"float64", "float64.pt"},
                   {"plain", "no_table.pt"},
                   {"nogates", "no_gates.pt"},
                   {"unknownop", "unknown_op.pt"}});
  e2e::TestDaemon daemon({"--preload=", repo.flag(), "--allow-client-paths=true"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto client = client::Client::Connect(daemon.address());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::map<std::string, std::string> expected = {
      {"float64", "parameter 'fc.weight' has dtype Double"},
      {"plain", "has no layer table"},
      {"nogates", "calls none of the 1 gates"},
      {"unknownop", "pswitch_missing::gate"},
  };
  for (const auto& [name, message] : expected) {
    SCOPED_TRACE(name);
    client::RegisterOptions options;
    options.name = name;
    auto refused = (*client)->Register(options);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(message));
  }
  auto models = (*client)->ListModels();
  ASSERT_TRUE(models.ok());
  EXPECT_TRUE(models->empty());
  // A client's own archive (server path, --allow-client-paths), under a name a failure used.
  client::RegisterOptions own;
  own.name = "float64";
  own.archive_path = (kArchives / "residual_cnn.pswitch.pt").string();
  own.batch_size = 2;
  auto registered = (*client)->Register(own);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->layers, 14u);  // "(model)" and 13 leaf calls (one ReLU runs twice)
  EXPECT_GE(registered->groups, 1u);
  PythonIo cnn = ReadIo("residual_cnn");
  auto out = (*client)->Infer("float64", {cnn.input});
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectMatches(out->outputs[0], cnn.output);
  own.name = "both";
  own.zoo_model = "tiny_cnn";
  EXPECT_THAT(std::string((*client)->Register(own).status().message()),
              HasSubstr("not both"));
}

// pswitchd never loads an archive itself: the check runs in a child (InspectInChild), so an
// archive that crashes libtorch's loader costs only that registration. Here the child crashes on
// every archive (a checker that segfaults when asked to inspect an archive, the real worker
// otherwise): the archive is refused saying so, and pswitchd goes on registering and serving zoo
// models.
TEST(ScriptModelE2eTest, AnArchiveThatCrashesTheCheckerIsRefusedAndPswitchdServesOn) {
  char tmpl[] = "/tmp/pswitch-crashing-checker-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::filesystem::path dir = tmpl;
  const std::filesystem::path checker = dir / "checker";
  // It takes the request pswitchd sends its inspector, crashes on an archive's, and otherwise
  // hands the request on to the real worker it becomes.
  std::ofstream(checker)
      << "#!/usr/bin/python3\n"
         "import os, signal, socket, sys\n"
         "flag = '--inspect_request_fd='\n"
         "fd = next(int(a[len(flag):]) for a in sys.argv[1:] if a.startswith(flag))\n"
         "s = socket.socket(fileno=fd)\n"
         "message, fds, _, _ = socket.recv_fds(s, 65536, 4)\n"
         "s.send(bytes([1] + [0] * 8))  # took it (the real worker's reports go to the relay)\n"
         "if b'\"archive\":true' in message:\n"
         "    os.kill(os.getpid(), signal.SIGSEGV)\n"
         "ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
         "socket.send_fds(ours, [message], fds)\n"
         "os.set_inheritable(theirs.fileno(), True)\n"
         "args = [a for a in sys.argv[1:] if not a.startswith(flag)]\n"
         "os.execv('"
      << PSWITCH_WORKER_PATH
      << "', ['pswitch-worker'] + args + "
         "[flag + str(theirs.fileno())])\n";
  std::filesystem::permissions(checker, std::filesystem::perms::owner_all);
  {
    e2e::TestDaemon daemon({"--preload=", "--allow-client-paths=true",
                            "--profiler-binary=" + checker.string()});
    ASSERT_GT(daemon.port(), 0) << daemon.log();
    auto client = client::Client::Connect(daemon.address());
    ASSERT_TRUE(client.ok()) << client.status();
    client::RegisterOptions own;
    own.name = "own";
    own.archive_path = (kArchives / "residual_cnn.pswitch.pt").string();
    auto refused = (*client)->Register(own);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("killed by signal 11"));
    client::RegisterOptions zoo;
    zoo.name = "own";  // the refused name is free again
    zoo.zoo_model = "tiny_cnn";
    auto registered = (*client)->Register(zoo);
    ASSERT_TRUE(registered.ok()) << registered.status() << daemon.log();
    auto models = (*client)->ListModels();
    ASSERT_TRUE(models.ok()) << models.status();
    EXPECT_EQ(models->size(), 1u);
  }
  (void)base::RemoveTree(dir);
}

}  // namespace
}  // namespace pswitch
