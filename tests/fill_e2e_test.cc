// Fill tasks end to end: a real pswitchd, this test playing the main job (bubble instruction,
// bubble cycle, and the device's compute lock between bubbles).
#include <grp.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/files.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gpu/copy_engine.h"
#include "gpu/host/compute_lock.h"
#include "gtest/gtest.h"
#include "models/registry.h"
#include "models/safetensors.h"
#include "models/training.h"
#include "models/zoo_model.h"
#include "tests/e2e_helpers.h"
#include "tests/test_daemon.h"
#include "worker/host_tensors.h"

namespace pswitch {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Holds one thread of another process still (ptrace interrupts that thread alone; the rest run
// on) until destroyed. The thread is found by its name (/proc/<pid>/task/*/comm).
class FrozenThread {
 public:
  FrozenThread(pid_t pid, const std::string& name) {
    for (const auto& task : std::filesystem::directory_iterator(std::filesystem::path("/proc") /
                                                                std::to_string(pid) / "task")) {
      std::string comm = ReadFile((task.path() / "comm").string());
      if (comm == name + "\n") tid_ = std::stoi(task.path().filename().string());
    }
    if (tid_ <= 0) return;
    if (::ptrace(PTRACE_SEIZE, tid_, nullptr, nullptr) != 0) {
      // A container or Yama's ptrace_scope may forbid tracing: the test cannot hold the thread.
      denied_ = errno == EPERM || errno == EACCES;
      return;
    }
    int status = 0;
    frozen_ = ::ptrace(PTRACE_INTERRUPT, tid_, nullptr, nullptr) == 0 &&
              ::waitpid(tid_, &status, __WALL) == tid_ && WIFSTOPPED(status);
  }
  ~FrozenThread() {
    if (tid_ > 0) ::ptrace(PTRACE_DETACH, tid_, nullptr, nullptr);
  }
  FrozenThread(const FrozenThread&) = delete;
  FrozenThread& operator=(const FrozenThread&) = delete;
  bool frozen() const { return frozen_; }
  // Tracing is not permitted in this environment (not a failure of what is tested).
  bool denied() const { return denied_; }

 private:
  pid_t tid_ = -1;
  bool frozen_ = false;
  bool denied_ = false;
};

// The output file a batch-inference fill job wrote holds `model`'s answer for every row.
void ExpectOutputIsTheModelsAnswer(const std::string& output, models::ZooModel& model,
                                   const at::Tensor& rows) {
  auto file = models::SafetensorsFile::Read(output);
  ASSERT_TRUE(file.ok()) << file.status();
  const models::SafetensorsTensor* out = file->Find("output");
  ASSERT_NE(out, nullptr);
  torch::NoGradGuard no_grad;
  model.eval();
  models::ModelInput in;
  in.input = rows;
  at::Tensor want = model.Forward(in).output.contiguous();
  ASSERT_EQ(out->shape, want.sizes().vec());
  const float* got = reinterpret_cast<const float*>(out->data);
  for (int64_t i = 0; i < want.numel(); ++i) {
    ASSERT_NEAR(got[i], want.data_ptr<float>()[i], 1e-5) << i;
  }
}

// A batch-inference fill job of tiny_mlp over `dataset` into `output` (names under the data
// root, or the caller's own paths when passed by fd), 3 ms steps in 16 MiB.
client::FillJobOptions TinyMlpInference(const std::string& dataset, const std::string& output) {
  client::FillJobOptions o;
  o.kind = client::FillKind::kInference;
  o.model = "tiny_mlp";
  o.dataset_path = dataset;
  o.output_path = output;
  o.step = absl::Milliseconds(3);
  o.memory_bytes = 16 << 20;
  return o;
}

// A dataset of 40 rows for tiny_mlp under the daemon's data root, and its job: 16 rows a step,
// declared at 80 ms a step (5 ms a row), longer than the 30 ms bubbles of the tests below.
struct LongBatchJob {
  at::Tensor rows;
  client::FillJobOptions options;
};
LongBatchJob WriteLongBatchJob(const std::filesystem::path& root, models::ZooModel& model) {
  LongBatchJob job;
  job.rows = model.ExampleInput(40, 9).input.contiguous();
  EXPECT_TRUE(
      models::WriteSafetensors(
          (root / "dataset.safetensors").string(),
          {models::SafetensorsEntry{"input", models::DType::kF32, job.rows.sizes().vec(),
                                    job.rows.data_ptr(), static_cast<size_t>(job.rows.nbytes())}})
          .ok());
  job.options = TinyMlpInference("dataset.safetensors", "output.safetensors");
  job.options.batch = 16;  // 3 steps, the last one of 8 rows
  job.options.step = absl::Milliseconds(80);
  return job;
}

// A synthetic fill job (steps that occupy the device for `step` each) of `steps` steps in 1 MiB.
client::FillJobOptions SyntheticJob(absl::Duration step, uint32_t steps) {
  client::FillJobOptions o;
  o.synthetic_step = step;
  o.steps = steps;
  o.memory_bytes = 1 << 20;
  return o;
}

// A job whose 60 ms steps are declared to take 2 ms: predicted to fit a 20 ms bubble, it
// overruns every one.
client::FillJobOptions OverrunningJob() {
  client::FillJobOptions o = SyntheticJob(absl::Milliseconds(60), 5);
  o.step = absl::Milliseconds(2);
  return o;
}

constexpr absl::Duration kGrace = absl::Milliseconds(30);
constexpr uint64_t kFreeBytes = 64ull << 20;

class FillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::string> flags{"--arena-bytes=536870912", "--preload=", "--standby-workers=1",
                                   "--activation-bytes=67108864", "--fill-grace-ms=30"};
    for (std::string& flag : ExtraFlags()) flags.push_back(std::move(flag));
    daemon_ = std::make_unique<e2e::TestDaemon>(std::move(flags));
    // The host device's compute lock is a per-machine file: these tests run serially.
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
    auto c = client::Client::Connect(ClientAddress());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  virtual std::vector<std::string> ExtraFlags() { return {}; }
  // TCP (a test port is never the default one, so the client does not take the Unix socket).
  virtual std::string ClientAddress() { return daemon_->address(); }
  std::string SocketPath() const { return (daemon_->dir() / "pswitchd.sock").string(); }

  void RegisterCycle(absl::Duration bubble) {
    std::string json =
        absl::StrCat(R"({"period_ns": )", absl::ToInt64Nanoseconds(bubble * 3),
                     R"(, "bubbles": [{"offset_ns": 0, "duration_ns": )",
                     absl::ToInt64Nanoseconds(bubble), R"(, "free_bytes": )", kFreeBytes, "}]}");
    ASSERT_TRUE(client_->RegisterBubbleCycle(0, json).ok());
  }

  // One main-job iteration: a bubble of `bubble`, then `compute` holding the device. Returns
  // how long the main job waited for the device after its bubble ended.
  absl::Duration Iteration(absl::Duration bubble, absl::Duration compute) {
    EXPECT_TRUE(client_->BubbleBegin(0, bubble, kFreeBytes).ok());
    absl::SleepFor(bubble);
    EXPECT_TRUE(client_->BubbleEnd(0).ok());
    absl::Time ended = absl::Now();
    auto lock = gpu::ComputeLock::Open(gpu::ComputeLock::DefaultPath(0));
    EXPECT_TRUE(lock.ok());
    gpu::ComputeLock::Hold hold = lock->Acquire();
    absl::Duration waited = absl::Now() - ended;
    absl::SleepFor(compute);
    return waited;
  }

  // Runs main-job iterations until the job stops (or `max` iterations); `between(i)`, when
  // given, runs after the i-th iteration's bubble, while the main job computes.
  client::FillJobStatus RunUntilStopped(uint64_t job, absl::Duration bubble, int max,
                                        absl::Duration* worst_wait = nullptr,
                                        const std::function<void(int)>& between = nullptr) {
    client::FillJobStatus status;
    for (int i = 0; i < max; ++i) {
      absl::Duration waited = Iteration(bubble, absl::Milliseconds(5));
      if (between) between(i);
      if (worst_wait != nullptr) *worst_wait = std::max(*worst_wait, waited);
      auto s = client_->FillStatus(job);
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) break;
      status = *s;
      if (status.state == client::FillState::kStopped) break;
    }
    return status;
  }

  // Runs main-job iterations until `job` has done a step: its run has a worker (while workers
  // start, a run still waiting at its bubble's end is answered as paused, and the next bubble
  // starts another). Its status then.
  client::FillJobStatus RunUntilFirstStep(uint64_t job, absl::Duration bubble) {
    client::FillJobStatus status;
    for (int i = 0; i < 200 && status.steps_done == 0; ++i) {
      Iteration(bubble, absl::Milliseconds(5));
      auto s = client_->FillStatus(job);
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) break;
      status = *s;
    }
    EXPECT_GT(status.steps_done, 0u) << daemon_->log();
    return status;
  }

  // A training fill job of tiny_cnn (`steps` steps) run through bubbles until it stops, then
  // compared with the same training run as one task: the same weights, bit for bit.
  // `bubble` long enough for a step on a loaded machine: a step that does not fit the largest
  // bubble stops the job (rightly), which is not what these tests are about.
  // A training fill job of `steps` steps of tiny_cnn at `batch` in bubbles of `bubble` ends with
  // exactly the weights of the same training run uninterrupted; the job's status at its end.
  client::FillJobStatus TrainThroughBubblesExactly(
      uint32_t steps, absl::Duration bubble = absl::Milliseconds(60),
      const std::function<void(int)>& between = nullptr, uint32_t batch = 4) {
    client::FillJobStatus done;
    TrainThroughBubblesExactlyInto(&done, steps, bubble, between, batch);
    return done;
  }
  void TrainThroughBubblesExactlyInto(client::FillJobStatus* result, uint32_t steps,
                                      absl::Duration bubble,
                                      const std::function<void(int)>& between, uint32_t batch) {
    RegisterCycle(bubble);
    client::FillJobOptions o;
    o.kind = client::FillKind::kTraining;
    o.model = "tiny_cnn";
    o.batch = batch;
    o.steps = steps;
    o.seed = 3;
    o.step = absl::Milliseconds(4);
    o.memory_bytes = 32 << 20;
    auto job = client_->SubmitFill(o);
    ASSERT_TRUE(job.ok()) << job.status();
    client::FillJobStatus done = RunUntilStopped(job->job_id, bubble, 1000, nullptr, between);
    *result = done;
    ASSERT_EQ(done.state, client::FillState::kStopped);
    ASSERT_TRUE(done.error.ok()) << done.error;
    EXPECT_EQ(done.steps_done, steps);
    EXPECT_GT(done.bubbles, 1u) << "it was never paused";

    ASSERT_TRUE(client_->Register({"reference", "tiny_cnn", "", batch, "auto"}).ok());
    client::TrainOptions train;
    train.iterations = steps;
    train.seed = 3;  // same data, same SGD with momentum 0.9, lr 0.01
    ASSERT_TRUE(client_->Train("reference", train).ok());
    auto model = models::CreateModel("tiny_cnn");
    ASSERT_TRUE(model.ok());
    auto probe = worker::ToHostTensor("input", (*model)->ExampleInput(batch, 17).input);
    ASSERT_TRUE(probe.ok());
    auto filled = client_->Infer(absl::StrCat("fill-", job->job_id), {*probe});
    auto reference = client_->Infer("reference", {*probe});
    ASSERT_TRUE(filled.ok() && reference.ok()) << filled.status() << reference.status();
    EXPECT_EQ(filled->outputs[0].data, reference->outputs[0].data);
    // The trained model is the job's result: kept until a client unloads it.
    ASSERT_TRUE(client_->Unload(absl::StrCat("fill-", job->job_id)).ok());
    EXPECT_EQ(client_->Infer(absl::StrCat("fill-", job->job_id), {*probe}).status().code(),
              absl::StatusCode::kNotFound);
  }

  std::unique_ptr<e2e::TestDaemon> daemon_;
  std::unique_ptr<client::Client> client_;
};

TEST_F(FillTest, SubmissionsAreValidated) {
  client::FillJobOptions o = SyntheticJob(absl::Milliseconds(1), 3);
  auto no_cycle = client_->SubmitFill(o);
  EXPECT_EQ(no_cycle.status().code(), absl::StatusCode::kFailedPrecondition) << no_cycle.status();
  RegisterCycle(absl::Milliseconds(20));
  EXPECT_EQ(client_->RegisterBubbleCycle(0, R"({"period_ns": 10})").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->RegisterBubbleCycle(7, R"({"period_ns": 10, "bubbles": []})").code(),
            absl::StatusCode::kInvalidArgument);
  // Trust-boundary issue, item 1: this cycle crashed pswitchd (stack overflow printing it back).
  const std::string nested = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(client_->RegisterBubbleCycle(0, "{\"period_ns\":" + nested + ",\"bubbles\":[]}").code(),
            absl::StatusCode::kInvalidArgument);
  client::FillJobOptions no_memory = o;
  no_memory.memory_bytes = 0;
  EXPECT_EQ(client_->SubmitFill(no_memory).status().code(), absl::StatusCode::kInvalidArgument);
  client::FillJobOptions too_big = o;
  too_big.memory_bytes = kFreeBytes * 2;  // no bubble can ever hold it
  EXPECT_EQ(client_->SubmitFill(too_big).status().code(), absl::StatusCode::kResourceExhausted);
  client::FillJobOptions bad_model = o;
  bad_model.kind = client::FillKind::kTraining;
  bad_model.model = "no_such_model";
  bad_model.step = absl::Milliseconds(1);
  EXPECT_THAT(std::string(client_->SubmitFill(bad_model).status().message()),
              HasSubstr("no_such_model"));
  auto reserved = client_->Register({"fill-1", "tiny_cnn", "", 1, "auto"});
  EXPECT_EQ(reserved.status().code(), absl::StatusCode::kInvalidArgument);
  auto ok = client_->SubmitFill(o);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->state, client::FillState::kPaused);  // waiting for its first bubble
  EXPECT_GT(ok->predicted_remaining, absl::ZeroDuration());
}

// `fill estimate` predicts without submitting; `fill cancel` stops a job; bubble calls for a GPU
// the daemon lacks come back as errors.
TEST_F(FillTest, EstimateSubmitsNothingCancelStopsAJobAndBadBubblesAreErrors) {
  client::FillJobOptions o = SyntheticJob(absl::Milliseconds(5), 8);
  EXPECT_EQ(client_->EstimateFill(o).status().code(), absl::StatusCode::kFailedPrecondition);
  RegisterCycle(absl::Milliseconds(20));
  EXPECT_EQ(client_
                ->RegisterBubbleCycle(0, R"({"period_ns": 60000000, "bubbles": []})",
                                      base::MonotonicNowNs() + 1'000'000'000)
                .code(),
            absl::StatusCode::kInvalidArgument);  // an origin in the future

  auto estimate = client_->EstimateFill(o);
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  EXPECT_EQ(estimate->job_id, 0u);
  EXPECT_EQ(estimate->state, client::FillState::kSubmitted);
  EXPECT_EQ(estimate->steps_total, 8u);
  // 3 steps of 5 ms (+ margin) fit a 20 ms bubble: 8 steps need 3 cycles of 60 ms.
  EXPECT_GT(estimate->predicted_remaining, absl::Milliseconds(120));
  EXPECT_LT(estimate->predicted_remaining, absl::Milliseconds(240));
  EXPECT_EQ(client_->FillStatus(1).status().code(), absl::StatusCode::kNotFound);
  client::FillJobOptions too_big = o;
  too_big.memory_bytes = kFreeBytes * 2;
  EXPECT_EQ(client_->EstimateFill(too_big).status().code(), absl::StatusCode::kResourceExhausted);

  auto job = client_->SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->job_id, 1u);  // the estimate took no id
  EXPECT_LT(absl::AbsDuration(job->predicted_remaining - estimate->predicted_remaining),
            absl::Milliseconds(60));
  ASSERT_TRUE(client_->CancelFill(job->job_id).ok());
  auto cancelled = client_->FillStatus(job->job_id);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state, client::FillState::kStopped);
  EXPECT_EQ(cancelled->error.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(client_->CancelFill(job->job_id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->CancelFill(99).code(), absl::StatusCode::kNotFound);
  // A cancelled job never runs: a bubble passes without a fill step.
  Iteration(absl::Milliseconds(20), absl::Milliseconds(5));
  auto stats = client_->FillStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->steps, 0u);

  // Bubble calls do not wait for their reply; the error surfaces on the next bubble call.
  // A bubble that began in the future is another host's clock.
  ASSERT_TRUE(client_->BubbleBegin(0, absl::Milliseconds(5), kFreeBytes,
                                   base::MonotonicNowNs() + 1'000'000'000)
                  .ok());
  ASSERT_TRUE(client_->FillStats().ok());
  absl::Status future = client_->BubbleEnd(0);
  EXPECT_EQ(future.code(), absl::StatusCode::kInvalidArgument) << future;
  EXPECT_THAT(std::string(future.message()), HasSubstr("future"));
}

// The bubble ends `expected` after it began at the main job, not after the server handled its
// message: a message handled after its bubble is over starts nothing.
TEST_F(FillTest, ABubbleMessageHandledAfterItsBubbleEndedStartsNoFillStep) {
  RegisterCycle(absl::Milliseconds(20));
  client::FillJobOptions o = SyntheticJob(absl::Milliseconds(2), 1000);
  auto job = client_->SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();
  // On time: the job runs in its bubbles (once its worker is up).
  uint64_t runs = 0;
  for (int i = 0; i < 200 && runs < 3; ++i) {
    Iteration(absl::Milliseconds(20), absl::Milliseconds(2));
    auto status = client_->FillStatus(job->job_id);
    ASSERT_TRUE(status.ok()) << status.status();
    runs = status->bubbles;
  }
  ASSERT_GE(runs, 3u) << daemon_->log();
  // The same bubbles, their messages handled 30 ms after they began: no run starts.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(client_->BubbleBegin(0, absl::Milliseconds(20), kFreeBytes,
                                     base::MonotonicNowNs() - 30'000'000)
                    .ok());
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(client_->BubbleEnd(0).ok());
  }
  auto late = client_->FillStatus(job->job_id);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->bubbles, runs) << daemon_->log();
}

TEST_F(FillTest, BubblesOfAMissingGpuAreErrors) {
  EXPECT_TRUE(client_->BubbleBegin(7, absl::Milliseconds(5), kFreeBytes).ok());
  ASSERT_TRUE(client_->FillStats().ok());  // a round trip: the error reply has arrived
  absl::Status later = client_->BubbleEnd(0);
  EXPECT_EQ(later.code(), absl::StatusCode::kInvalidArgument) << later;
  EXPECT_THAT(std::string(later.message()), HasSubstr("no GPU 7"));
}

// Program-directed limit: a step starts only if it fits in what is left of the bubble, so a
// well-behaved task has paused by the time its bubble ends.
TEST_F(FillTest, StepsStartOnlyWhenTheyFitInTheBubble) {
  const absl::Duration bubble = absl::Milliseconds(25);
  RegisterCycle(bubble);
  client::FillJobOptions o = SyntheticJob(absl::Milliseconds(10), 12);
  auto job = client_->SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();
  client::FillJobStatus done = RunUntilStopped(job->job_id, bubble, 200);
  ASSERT_EQ(done.state, client::FillState::kStopped) << done.error;
  EXPECT_TRUE(done.error.ok()) << done.error;
  EXPECT_EQ(done.steps_done, 12u);
  // At most two 10 ms steps fit a 25 ms bubble.
  EXPECT_GE(done.bubbles, 6u);
  auto stats = client_->FillStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_LE(stats->fill_step_time, stats->bubble_time);
  EXPECT_EQ(stats->killed, 0u);
  EXPECT_LT(stats->pause_p99, absl::Milliseconds(5)) << "steps overran their bubbles";
}

// A run that lives across bubbles (issue 30 item 1): one Run message at the job's first bubble,
// then every later bubble of the job opened by its bell, with no message, until its last step.
TEST_F(FillTest, AJobsRunLivesAcrossBubblesWokenByItsBell) {
  const absl::Duration bubble = absl::Milliseconds(25);
  RegisterCycle(bubble);
  auto job = client_->SubmitFill(SyntheticJob(absl::Milliseconds(10), 12));
  ASSERT_TRUE(job.ok()) << job.status();
  const client::FillJobStatus status = RunUntilFirstStep(job->job_id, bubble);
  ASSERT_GT(status.steps_done, 0u);
  ASSERT_LT(status.steps_done, 12u);
  auto before = client_->FillStats();
  ASSERT_TRUE(before.ok());
  client::FillJobStatus done = RunUntilStopped(job->job_id, bubble, 200);
  ASSERT_EQ(done.state, client::FillState::kStopped) << done.error;
  EXPECT_TRUE(done.error.ok()) << done.error;
  EXPECT_EQ(done.steps_done, 12u);
  EXPECT_GE(done.bubbles - status.bubbles, 4u);  // at most two 10 ms steps fit a 25 ms bubble
  auto stats = client_->FillStats();
  ASSERT_TRUE(stats.ok());
  // From then on no Run message: every later bubble of the job rang its bell.
  EXPECT_EQ(stats->runs, before->runs) << daemon_->log();
  EXPECT_EQ(stats->bell_wakes - before->bell_wakes, done.bubbles - status.bubbles);
  EXPECT_EQ(stats->steps, 12u) << "counted from the bell as from RunDone, never twice";
  EXPECT_EQ(stats->killed, 0u);
  EXPECT_LT(stats->pause_p99, absl::Milliseconds(5)) << "steps overran their bubbles";
}

// Cancelled while its resident run waits between bubbles: the run ends at once (its bell), the
// GPU goes to the next job, and the cancelled job runs no further step.
TEST_F(FillTest, AJobCancelledBetweenBubblesEndsItsResidentRunAndFreesTheGpu) {
  const absl::Duration bubble = absl::Milliseconds(20);
  RegisterCycle(bubble);
  auto first = client_->SubmitFill(SyntheticJob(absl::Milliseconds(2), 100000));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_GT(RunUntilFirstStep(first->job_id, bubble).steps_done, 0u);
  ASSERT_TRUE(client_->CancelFill(first->job_id).ok());
  auto next = client_->SubmitFill(SyntheticJob(absl::Milliseconds(2), 5));
  ASSERT_TRUE(next.ok()) << next.status();
  client::FillJobStatus done = RunUntilStopped(next->job_id, bubble, 200);
  EXPECT_TRUE(done.error.ok()) << done.error;
  EXPECT_EQ(done.steps_done, 5u);
  auto cancelled = client_->FillStatus(first->job_id);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state, client::FillState::kStopped);
  EXPECT_EQ(cancelled->error.code(), absl::StatusCode::kCancelled);
  const uint64_t steps_at_cancel = cancelled->steps_done;
  Iteration(bubble, absl::Milliseconds(5));
  EXPECT_EQ(client_->FillStatus(first->job_id)->steps_done, steps_at_cancel);
  EXPECT_EQ(client_->FillStats()->killed, 0u);
}

// The same job with one run per bubble (--fill-resident-runs=false): a Run message at each.
class PerBubbleFillTest : public FillTest {
 protected:
  std::vector<std::string> ExtraFlags() override { return {"--fill-resident-runs=false"}; }
};

// Runs of one bubble cannot split a step (its parts would be lost with the run): the same job is
// refused at submission, with the reason.
TEST_F(PerBubbleFillTest, AnInferenceBatchLongerThanEveryBubbleIsRefused) {
  RegisterCycle(absl::Milliseconds(30));
  auto model = models::CreateModel("tiny_mlp");
  ASSERT_TRUE(model.ok());
  auto job = client_->SubmitFill(WriteLongBatchJob(daemon_->dir(), **model).options);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted) << job.status();
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("fits no stage's bubbles"));
}

TEST_F(PerBubbleFillTest, EachBubbleStartsARunAndNoBellRings) {
  const absl::Duration bubble = absl::Milliseconds(25);
  RegisterCycle(bubble);
  auto job = client_->SubmitFill(SyntheticJob(absl::Milliseconds(10), 12));
  ASSERT_TRUE(job.ok()) << job.status();
  client::FillJobStatus done = RunUntilStopped(job->job_id, bubble, 200);
  ASSERT_EQ(done.state, client::FillState::kStopped) << done.error;
  EXPECT_TRUE(done.error.ok()) << done.error;
  EXPECT_EQ(done.steps_done, 12u);
  auto stats = client_->FillStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->runs, done.bubbles);
  EXPECT_EQ(stats->bell_wakes, 0u);
  EXPECT_EQ(stats->steps, 12u);
}

// Pause inside a step (issue 30 item 2): a step that started because it was predicted to fit
// (declared 2 ms) but runs 60 ms is cut at its bubble's end by the worker itself, at a layer
// boundary, not killed, bubble after bubble; its time so far raises the job's prediction.
TEST_F(FillTest, AStepThatOverrunsItsBubbleIsCutAtTheBubbleEndNotKilled) {
  const absl::Duration bubble = absl::Milliseconds(20);
  RegisterCycle(bubble);
  auto job = client_->SubmitFill(OverrunningJob());
  ASSERT_TRUE(job.ok()) << job.status();
  // Bubbles until two of its steps were cut (the first bubbles may pass before its runs reach
  // a worker; a loaded machine may take a while).
  auto cuts = [this] {
    const std::string log = daemon_->log();
    size_t n = 0;
    for (size_t at = log.find("event=fill_step_overran"); at != std::string::npos;
         at = log.find("event=fill_step_overran", at + 1)) {
      ++n;
    }
    return n;
  };
  absl::Duration worst_wait;
  client::FillJobStatus status;
  for (int i = 0; i < 500 && cuts() < 2; ++i) {
    worst_wait = std::max(worst_wait, Iteration(bubble, absl::Milliseconds(5)));
    auto s = client_->FillStatus(job->job_id);
    ASSERT_TRUE(s.ok()) << s.status();
    status = *s;
    ASSERT_NE(status.state, client::FillState::kStopped) << status.error;
  }
  ASSERT_GE(cuts(), 2u) << daemon_->log();
  EXPECT_EQ(status.steps_done, 0u);
  auto stats = client_->FillStats();
  ASSERT_TRUE(stats.ok());
  // Uncut, the step would have held the device past the grace period and been killed.
  EXPECT_EQ(stats->killed, 0u) << "cut, not killed";
  EXPECT_LT(worst_wait, kGrace + absl::Milliseconds(150)) << daemon_->log();
  EXPECT_TRUE(client_->CancelFill(job->job_id).ok());
}

// The same overrunning step, left to go on: no bubble ever sees it finish, and the job is
// stopped with the reason (its measured steps no longer fit, or bubble after bubble opened for
// it ends with nothing done), never killed and never left holding the GPU's bubbles.
TEST_F(FillTest, AJobWhoseStepsNeverFinishInItsBubblesIsStoppedWithTheReason) {
  const absl::Duration bubble = absl::Milliseconds(20);
  RegisterCycle(bubble);
  auto job = client_->SubmitFill(OverrunningJob());
  ASSERT_TRUE(job.ok()) << job.status();
  client::FillJobStatus stopped = RunUntilStopped(job->job_id, bubble, 500);
  ASSERT_EQ(stopped.state, client::FillState::kStopped) << daemon_->log();
  EXPECT_EQ(stopped.error.code(), absl::StatusCode::kFailedPrecondition) << stopped.error;
  EXPECT_THAT(std::string(stopped.error.message()),
              testing::AnyOf(HasSubstr("too long"), HasSubstr("does not fit")))
      << stopped.error;
  EXPECT_EQ(stopped.steps_done, 0u);
  EXPECT_EQ(client_->FillStats()->killed, 0u);
}

// Framework-enforced limit: a task that ignores the pause is SIGKILLed after the grace period,
// so the main job waits at most about that long for its device; the daemon serves on.
TEST_F(FillTest, ATaskThatIgnoresThePauseIsKilledAndTheMainJobGoesOn) {
  const absl::Duration bubble = absl::Milliseconds(20);
  RegisterCycle(bubble);
  client::FillJobOptions o = SyntheticJob(absl::Milliseconds(5), 100000);
  o.ignore_pause = true;
  auto job = client_->SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::Duration worst_wait;
  client::FillJobStatus killed = RunUntilStopped(job->job_id, bubble, 200, &worst_wait);
  ASSERT_EQ(killed.state, client::FillState::kStopped);
  EXPECT_THAT(std::string(killed.error.message()), HasSubstr("did not pause"));
  EXPECT_LT(worst_wait, kGrace + absl::Milliseconds(150)) << daemon_->log();
  auto stats = client_->FillStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->killed, 1u);
  // A well-behaved job runs next, on the respawned worker.
  o.ignore_pause = false;
  o.steps = 3;
  auto next = client_->SubmitFill(o);
  ASSERT_TRUE(next.ok()) << next.status();
  client::FillJobStatus done = RunUntilStopped(next->job_id, bubble, 40, &worst_wait);
  EXPECT_TRUE(done.error.ok()) << done.error;
  EXPECT_EQ(done.steps_done, 3u);
}

TEST_F(FillTest, ATaskOverItsMemoryCapFailsAlone) {
  const absl::Duration bubble = absl::Milliseconds(20);
  RegisterCycle(bubble);
  client::FillJobOptions o = SyntheticJob(absl::Milliseconds(2), 5);
  o.synthetic_alloc_bytes = 8 << 20;  // each step allocates past its cap
  auto job = client_->SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();
  client::FillJobStatus failed = RunUntilStopped(job->job_id, bubble, 200);
  ASSERT_EQ(failed.state, client::FillState::kStopped);
  EXPECT_THAT(std::string(failed.error.message()), HasSubstr("memory cap"));
  o.synthetic_alloc_bytes = 0;
  auto next = client_->SubmitFill(o);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(RunUntilStopped(next->job_id, bubble, 40).error.ok());
}

// What exactness tests need besides bubbles a loaded machine's step fits
// (TrainThroughBubblesExactly): a grace long enough that a step slowed past its bubble's end is
// waited for, not killed (the kill itself is FillTest's
// ATaskThatIgnoresThePauseIsKilledAndTheMainJobGoesOn; a killed step would fail the job, not show
// inexactness).
class ExactFillTest : public FillTest {
 protected:
  std::vector<std::string> ExtraFlags() override { return {"--fill-grace-ms=2000"}; }
};

// A training fill task is paused at every bubble end and resumed in the next; it ends with
// exactly the weights of an uninterrupted run (momentum included).
TEST_F(ExactFillTest, TrainingFillTaskSurvivesPausesExactly) {
  // Enough steps that no bubble holds them all, however fast this machine steps tiny_cnn
  // (60 steps once fit one 40 ms bubble on a fast host, and the job was never paused).
  TrainThroughBubblesExactly(600);
}

// A resident training run is preempted between bubbles by inference requests of another model
// (each request ends the run; the next bubble starts a new one from the job's saved state) and
// the job's own model cannot be unloaded under it; it still ends with exactly the weights of an
// uninterrupted run.
TEST_F(ExactFillTest, AResidentTrainingRunPreemptedBetweenBubblesResumesExactly) {
  ASSERT_TRUE(client_->Register({"other", "tiny_cnn", "", 2, "auto"}).ok());
  auto model = models::CreateModel("tiny_cnn");
  ASSERT_TRUE(model.ok());
  auto probe = worker::ToHostTensor("input", (*model)->ExampleInput(2, 5).input);
  ASSERT_TRUE(probe.ok());
  int served = 0;
  TrainThroughBubblesExactly(300, absl::Milliseconds(60), [&](int i) {
    if (i % 7 != 3) return;
    auto answered = client_->Infer("other", {*probe});
    EXPECT_TRUE(answered.ok()) << answered.status();
    served += answered.ok();
    // The job's own model is its state while it runs: refused, with what to do. (Steps run only
    // in the bubbles this thread announces, so a job not stopped now is not stopped below.)
    auto status = client_->FillStatus(1);
    ASSERT_TRUE(status.ok()) << status.status();
    if (status->state == client::FillState::kStopped) return;  // its last steps just ran
    auto unload = client_->Unload("fill-1");
    EXPECT_EQ(unload.code(), absl::StatusCode::kFailedPrecondition) << unload;
    EXPECT_THAT(std::string(unload.message()), HasSubstr("cancel the job first"));
  });
  EXPECT_GT(served, 0);
  auto stats = client_->FillStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->runs, 1u) << "no request ever preempted the run";
  EXPECT_GT(stats->bell_wakes, 0u);
  EXPECT_EQ(stats->killed, 0u);
}

// A training step longer than every bubble (issue 30): at each bubble's end it waits at its layer
// boundary for the next bubble and goes on (--fill-suspend-steps, the default), so the job ends,
// exactly as a run never interrupted, where each step would otherwise be cut and lost for ever.
// How long tiny_cnn's training step at `batch` takes on this machine: the fastest of three after
// one to warm up.
absl::Duration TinyCnnStep(uint32_t batch) {
  auto model = models::CreateModel("tiny_cnn");
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return absl::ZeroDuration();
  auto trainer = models::Trainer::Create(**model, {models::OptimizerKind::kSgd, 0.01, 0.9});
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return absl::ZeroDuration();
  absl::Duration fastest = absl::InfiniteDuration();
  for (int i = 0; i < 4; ++i) {
    const absl::Time start = absl::Now();
    EXPECT_TRUE(
        (*trainer)->Step((*model)->ExampleInput(batch, i), (*model)->ExampleTarget(batch, i)).ok());
    if (i > 0) fastest = std::min(fastest, absl::Now() - start);
  }
  return fastest;
}

TEST_F(ExactFillTest, ATrainingStepLongerThanEveryBubbleGoesOnAcrossBubblesExactly) {
  constexpr uint32_t kSteps = 4, kBatch = 256;
  // Bubbles a third of a step: each step outlives one, and a step starts with room for an eighth
  // of it (fill::kSuspendParts) and the margin.
  const absl::Duration step = TinyCnnStep(kBatch);
  const absl::Duration bubble = std::max(step / 3, absl::Milliseconds(2));
  ASSERT_GT(step, bubble) << "tiny_cnn steps too fast here to outlast a bubble";
  const client::FillJobStatus done = TrainThroughBubblesExactly(kSteps, bubble, nullptr, kBatch);
  auto stats = client_->FillStats();
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->steps, kSteps);
  // Each step computed for longer than a bubble lasts: cut at a bubble's end, none would have
  // ended.
  EXPECT_GT(stats->fill_step_time / kSteps, bubble);
  EXPECT_GT(done.bubbles, 1u);
  EXPECT_EQ(stats->killed, 0u);
}

// A dataset that would block its reader (a FIFO with no writer) is refused at once, never read,
// and neither the bubble path nor any other client waits meanwhile.
TEST_F(FillTest, ADatasetThatWouldBlockIsRefusedAndHoldsUpNoOneMeanwhile) {
  RegisterCycle(absl::Milliseconds(20));
  const std::string fifo = (daemon_->dir() / "dataset.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  client::FillJobOptions o = TinyMlpInference("dataset.fifo", "out.safetensors");
  auto submitter = client::Client::Connect(daemon_->address());
  ASSERT_TRUE(submitter.ok()) << submitter.status();
  auto submitted = std::async(std::launch::async, [&] { return (*submitter)->SubmitFill(o); });
  const absl::Time start = absl::Now();
  for (int i = 0; i < 3; ++i) Iteration(absl::Milliseconds(20), absl::Milliseconds(2));
  ASSERT_TRUE(client_->FillStats().ok());
  ASSERT_TRUE(client_->ListModels().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "other clients were answered at once";
  ASSERT_EQ(submitted.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto refused = submitted.get();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("not a regular file"));
}

// Trust-boundary issue, items 2 and 3: a client names files only under the data root; an
// output never replaces a file (a root-only 0600 file was replaced, coming back 0644), and no
// answer says anything about files outside the root.
TEST_F(FillTest, ClientNamedFilesStayUnderTheDataRootAndNoFileIsReplaced) {
  RegisterCycle(absl::Milliseconds(20));
  const std::filesystem::path taken = daemon_->dir() / "taken.safetensors";
  std::ofstream(taken) << "precious";
  std::filesystem::permissions(taken, std::filesystem::perms::owner_read |
                                          std::filesystem::perms::owner_write);
  std::ofstream(daemon_->dir() / "secret") << "root:$6$hash";
  std::filesystem::create_symlink(daemon_->dir() / "secret", daemon_->dir() / "link");
  auto submit = [&](const std::string& dataset, const std::string& output) {
    return client_->SubmitFill(TinyMlpInference(dataset, output)).status();
  };
  absl::Status replaced = submit("dataset.safetensors", "taken.safetensors");
  EXPECT_EQ(replaced.code(), absl::StatusCode::kAlreadyExists) << replaced;
  std::ifstream in(taken);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "precious");
  EXPECT_EQ(std::filesystem::status(taken).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  for (const std::string& outside :
       {std::string("/etc/shadow"), std::string("../etc/shadow"), std::string("link"),
        (daemon_->dir() / "secret").string()}) {
    absl::Status read = submit(outside, "fresh.safetensors");
    EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument) << outside << ": " << read;
    EXPECT_THAT(std::string(read.message()), Not(HasSubstr("root:"))) << outside;
  }
  EXPECT_EQ(submit("dataset.safetensors", "../escape.safetensors").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(daemon_->dir() / "fresh.safetensors"));
}

TEST_F(FillTest, BatchInferenceOverADatasetWritesEveryOutputRow) {
  const absl::Duration bubble = absl::Milliseconds(30);
  RegisterCycle(bubble);
  auto model = models::CreateModel("tiny_mlp");
  ASSERT_TRUE(model.ok());
  at::Tensor rows = (*model)->ExampleInput(7, 5).input.contiguous();
  const std::string dataset = (daemon_->dir() / "dataset.safetensors").string();
  const std::string output = (daemon_->dir() / "output.safetensors").string();
  ASSERT_TRUE(
      models::WriteSafetensors(
          dataset, {models::SafetensorsEntry{"input", models::DType::kF32, rows.sizes().vec(),
                                             rows.data_ptr(), static_cast<size_t>(rows.nbytes())}})
          .ok());
  // Names under the daemon's data root.
  client::FillJobOptions o = TinyMlpInference("dataset.safetensors", "output.safetensors");
  o.batch = 2;  // 7 rows: 4 steps, the last one a single row
  auto job = client_->SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->steps_total, 4u);
  const std::string own_model = absl::StrCat("fill-", job->job_id);
  EXPECT_EQ(client_->Unload(own_model).code(), absl::StatusCode::kFailedPrecondition)
      << "a running job's own model is the job's";
  client::FillJobStatus done = RunUntilStopped(job->job_id, bubble, 200);
  ASSERT_TRUE(done.error.ok()) << done.error;
  ASSERT_EQ(done.steps_done, 4u);
  // Its output is the file: its own copy of the model goes (pinned weights, workers, catalog).
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    auto models = client_->ListModels();
    ASSERT_TRUE(models.ok()) << models.status();
    gone = std::none_of(models->begin(), models->end(),
                        [&](const client::ModelInfo& m) { return m.name == own_model; });
    if (!gone) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(gone) << own_model << " outlived its job";
  ASSERT_NO_FATAL_FAILURE(ExpectOutputIsTheModelsAnswer(output, **model, rows));
}

// Inference batches split to fit what is left of a bubble (issue 30 item 2): a batch declared
// longer than every bubble is placed by its rows (a step may start once one row fits, and runs
// the rows that fit: worker/dataset_inference_test.cc), and every row is answered once, in order.
TEST_F(FillTest, AnInferenceBatchLongerThanItsBubblesIsPlacedByTheRowAndAnswersEveryRowOnce) {
  const absl::Duration bubble = absl::Milliseconds(30);
  RegisterCycle(bubble);
  auto model = models::CreateModel("tiny_mlp");
  ASSERT_TRUE(model.ok());
  LongBatchJob long_batch = WriteLongBatchJob(daemon_->dir(), **model);
  auto job = client_->SubmitFill(long_batch.options);
  ASSERT_TRUE(job.ok()) << job.status();
  client::FillJobStatus done = RunUntilStopped(job->job_id, bubble, 300);
  ASSERT_EQ(done.state, client::FillState::kStopped);
  ASSERT_TRUE(done.error.ok()) << done.error;
  ASSERT_EQ(done.steps_done, 3u);
  ASSERT_NO_FATAL_FAILURE(ExpectOutputIsTheModelsAnswer(
      (daemon_->dir() / "output.safetensors").string(), **model, long_batch.rows));
}

// A job cancelled after its last step, while its output still waits for the I/O thread, writes
// no output: the named file is never created (a passed one would be left as it was).
TEST_F(FillTest, AJobCancelledBeforeItsOutputIsWrittenWritesNone) {
  const absl::Duration bubble = absl::Milliseconds(30);
  RegisterCycle(bubble);
  auto model = models::CreateModel("tiny_mlp");
  ASSERT_TRUE(model.ok());
  at::Tensor rows = (*model)->ExampleInput(3, 5).input.contiguous();
  ASSERT_TRUE(models::WriteSafetensors(
                  (daemon_->dir() / "dataset.safetensors").string(),
                  {models::SafetensorsEntry{"input", models::DType::kF32, rows.sizes().vec(),
                                            rows.data_ptr(), static_cast<size_t>(rows.nbytes())}})
                  .ok());
  client::FillJobOptions o = TinyMlpInference("dataset.safetensors", "output.safetensors");
  o.batch = 4;  // one step
  auto job = client_->SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();
  {
    // The output's write waits behind a held I/O thread; every row is computed meanwhile.
    FrozenThread io(daemon_->pid(), "pswitch-fill-io");
    if (io.denied()) GTEST_SKIP() << "ptrace is not permitted here: cannot hold the I/O thread";
    ASSERT_TRUE(io.frozen()) << "could not hold pswitchd's fill I/O thread (ptrace)";
    client::FillJobStatus status;
    for (int i = 0; i < 200 && status.steps_done < 1; ++i) {
      Iteration(bubble, absl::Milliseconds(5));
      auto s = client_->FillStatus(job->job_id);
      ASSERT_TRUE(s.ok()) << s.status();
      status = *s;
    }
    ASSERT_EQ(status.steps_done, 1u);
    ASSERT_NE(status.state, client::FillState::kStopped) << "its output is not written yet";
    ASSERT_TRUE(client_->CancelFill(job->job_id).ok());
  }
  // An estimate is answered from the I/O thread, after the output's turn there.
  client::FillJobOptions estimate = o;
  estimate.output_path.clear();
  ASSERT_TRUE(client_->EstimateFill(estimate).ok());
  auto cancelled = client_->FillStatus(job->job_id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->error.code(), absl::StatusCode::kCancelled) << cancelled->error;
  EXPECT_FALSE(std::filesystem::exists(daemon_->dir() / "output.safetensors"))
      << "a cancelled job wrote its output";
}

// With warm-ups on (the CUDA default), the job's model is warmed on every worker at creation and
// its training step timed: the first bubble is admitted by that measurement. The warm-ups (a
// training step on every model that may train) leave the weights exactly as they were.
class WarmFillTest : public FillTest {
 protected:
  // The grace as ExactFillTest's: this one trains through bubbles exactly too.
  std::vector<std::string> ExtraFlags() override {
    return {"--warm-up=on", "--fill-grace-ms=2000"};
  }
};

TEST_F(WarmFillTest, AJobsStepIsMeasuredAtCreationAndWarmUpsLeaveTrainingExact) {
  // A registration made while no worker has started yet waits for none (they load the catalog
  // when they start, and measure there): this test wants the registration's own measurement.
  ASSERT_TRUE(daemon_->AwaitWorkersReady(2)) << daemon_->log();
  TrainThroughBubblesExactly(600);  // as many as ExactFillTest's: never one bubble's worth
  const std::string log = daemon_->log();
  EXPECT_THAT(log, HasSubstr("event=fill_job_step_measured job=1 declared_ms=4.000"));
  EXPECT_THAT(log, HasSubstr("train_step_ms="));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("model_train_warm_up_failed")));
}

class FillLoadsTest : public FillTest {
 protected:
  std::vector<std::string> ExtraFlags() override { return {"--max-fill-loads=2"}; }
};

// Submissions and estimates beyond --max-fill-loads are refused at once rather than queued
// behind the fill I/O thread; those admitted are answered once it runs.
TEST_F(FillLoadsTest, EstimatesBeyondTheBoundAreRefusedNotQueued) {
  RegisterCycle(absl::Milliseconds(20));
  client::FillJobOptions o = SyntheticJob(absl::Milliseconds(1), 3);
  std::vector<std::shared_future<absl::Status>> answers;
  {
    FrozenThread io(daemon_->pid(), "pswitch-fill-io");
    if (io.denied()) GTEST_SKIP() << "ptrace is not permitted here: cannot hold the I/O thread";
    ASSERT_TRUE(io.frozen()) << "could not hold pswitchd's fill I/O thread (ptrace)";
    for (int i = 0; i < 5; ++i) {
      answers.push_back(std::async(std::launch::async, [&] {
                          auto c = client::Client::Connect(daemon_->address());
                          if (!c.ok()) return c.status();
                          return (*c)->EstimateFill(o).status();
                        }).share());
    }
    auto answered = [&] {
      return std::count_if(answers.begin(), answers.end(), [](const auto& a) {
        return a.wait_for(std::chrono::milliseconds(20)) == std::future_status::ready;
      });
    };
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (answered() < 3 && absl::Now() < deadline) {
    }
    ASSERT_EQ(answered(), 3) << "the three beyond the bound, while the I/O thread is held";
    for (const auto& a : answers) {
      if (a.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      EXPECT_EQ(a.get().code(), absl::StatusCode::kResourceExhausted) << a.get();
      EXPECT_THAT(std::string(a.get().message()), HasSubstr("--max-fill-loads"));
    }
  }
  for (const auto& a : answers) {
    ASSERT_EQ(a.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  }
  EXPECT_EQ(
      std::count_if(answers.begin(), answers.end(), [](const auto& a) { return a.get().ok(); }), 2);
  // The places are given back: another estimate is answered.
  EXPECT_TRUE(client_->EstimateFill(o).ok());
}

class FillDatasetBytesTest : public FillTest {
 protected:
  std::vector<std::string> ExtraFlags() override { return {"--max-total-dataset-bytes=100000"}; }
};

// The fill jobs' dataset copies held at once are bounded all together: a second job (or an
// estimate) whose copy would pass --max-total-dataset-bytes is refused until the first ends.
TEST_F(FillDatasetBytesTest, DatasetsHeldAtOnceAreBoundedAndGivenBackWhenAJobEnds) {
  RegisterCycle(absl::Milliseconds(20));
  auto model = models::CreateModel("tiny_mlp");
  ASSERT_TRUE(model.ok());
  at::Tensor rows = (*model)->ExampleInput(2, 5).input.contiguous();
  std::vector<float> pad(15000);  // 60000 bytes: one such dataset fits the bound, two do not
  const std::string dataset = (daemon_->dir() / "dataset.safetensors").string();
  ASSERT_TRUE(
      models::WriteSafetensors(
          dataset, {models::SafetensorsEntry{"input", models::DType::kF32, rows.sizes().vec(),
                                             rows.data_ptr(), static_cast<size_t>(rows.nbytes())},
                    models::SafetensorsEntry{"pad",
                                             models::DType::kF32,
                                             {static_cast<int64_t>(pad.size())},
                                             pad.data(),
                                             pad.size() * sizeof(float)}})
          .ok());
  ASSERT_GT(std::filesystem::file_size(dataset), 50000u);
  ASSERT_LE(std::filesystem::file_size(dataset), 100000u);
  client::FillJobOptions o = TinyMlpInference("dataset.safetensors", "first.safetensors");
  client::FillJobOptions estimate = o;
  estimate.output_path.clear();
  ASSERT_TRUE(client_->EstimateFill(estimate).ok()) << "an estimate's charge ends with it";
  auto first = client_->SubmitFill(o);
  ASSERT_TRUE(first.ok()) << first.status();  // no bubble runs: it holds its copy
  client::FillJobOptions second = o;
  second.output_path = "second.safetensors";
  for (const absl::Status& refused :
       {client_->SubmitFill(second).status(), client_->EstimateFill(estimate).status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr("--max-total-dataset-bytes"));
  }
  ASSERT_TRUE(client_->CancelFill(first->job_id).ok());
  auto after = client_->SubmitFill(second);
  EXPECT_TRUE(after.ok()) << after.status();
}

// Issue 26, item 1: over the Unix socket a local user's fill job reads the dataset the user
// opened and writes the output into the file the user created; pswitchd opens neither path.
// The user here is `nobody`, not pswitchd's uid (root), mapped by the token file to a principal
// that may submit fill jobs (fill jobs are admins' to submit); it keeps root's group only to
// reach the socket (0660, the operator's group).
class LocalFillTest : public FillTest {
 protected:
  static constexpr uid_t kNobody = 65534;
  std::vector<std::string> ExtraFlags() override { return {tokens_.flag()}; }
  std::string ClientAddress() override { return "unix:" + SocketPath(); }

  e2e::TokenFile tokens_{"fill-operator-token-0123456789 nobody-operator admin 65534\n"};
};

TEST_F(LocalFillTest, AnotherUsersDatasetOutsideTheDataRootIsPassedAndItsOutputIsItsOwnFile) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  const absl::Duration bubble = absl::Milliseconds(30);
  RegisterCycle(bubble);
  auto model = models::CreateModel("tiny_mlp");
  ASSERT_TRUE(model.ok());
  at::Tensor rows = (*model)->ExampleInput(7, 5).input.contiguous();
  // nobody's own directory (0700), which pswitchd's --data-root does not contain.
  char tmpl[] = "/tmp/pswitch-nobody-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string home = tmpl;
  ASSERT_TRUE(
      models::WriteSafetensors(
          home + "/rows.safetensors",
          {models::SafetensorsEntry{"input", models::DType::kF32, rows.sizes().vec(),
                                    rows.data_ptr(), static_cast<size_t>(rows.nbytes())}})
          .ok());
  std::ofstream(home + "/garbage.safetensors") << "not a safetensors file";
  for (const std::string& path :
       {home, home + "/rows.safetensors", home + "/garbage.safetensors"}) {
    ASSERT_EQ(::chown(path.c_str(), kNobody, kNobody), 0) << path;
    ASSERT_EQ(::chmod(path.c_str(), path == home ? 0700 : 0600), 0) << path;
  }

  // The user's side, in a child that becomes nobody; its answers come back through a pipe.
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const std::string socket = SocketPath();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(report[0]);
    if (::setgroups(0, nullptr) != 0 || ::setgid(0) != 0 || ::setuid(kNobody) != 0) ::_exit(2);
    if (::chdir(home.c_str()) != 0) ::_exit(3);
    int64_t answers[6] = {-1, -1, -1, -1, -1, -1};
    auto c = client::Client::Connect("unix:" + socket);
    if (c.ok()) {
      // Relative to the user's own working directory.
      client::FillJobOptions o = TinyMlpInference("rows.safetensors", "out.safetensors");
      o.batch = 2;  // 7 rows: 4 steps
      auto estimate = (*c)->EstimateFill(o);
      answers[0] = estimate.ok() ? static_cast<int64_t>(estimate->steps_total)
                                 : -static_cast<int64_t>(estimate.status().code());
      client::FillJobOptions bad = o;
      bad.dataset_path = "garbage.safetensors";
      bad.output_path = "refused.safetensors";
      answers[1] = static_cast<int64_t>((*c)->SubmitFill(bad).status().code());
      answers[2] = ::access("refused.safetensors", F_OK) == 0 ? 1 : 0;
      auto job = (*c)->SubmitFill(o);
      answers[3] = job.ok() ? static_cast<int64_t>(job->job_id)
                            : -static_cast<int64_t>(job.status().code());
      answers[4] = job.ok() ? static_cast<int64_t>(job->steps_total) : -1;
    } else {
      answers[5] = static_cast<int64_t>(c.status().code());
    }
    (void)!::write(report[1], answers, sizeof(answers));
    ::_exit(0);
  }
  ::close(report[1]);
  int64_t answers[6] = {-2, -2, -2, -2, -2, -2};
  const ssize_t got = ::read(report[0], answers, sizeof(answers));
  ::close(report[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof(answers)));
  ASSERT_EQ(answers[5], -1) << "nobody could not connect: code " << answers[5];
  EXPECT_EQ(answers[0], 4) << "the estimate, from the passed dataset";
  EXPECT_EQ(answers[1], static_cast<int64_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(answers[2], 0) << "a refused job's output file stays behind";
  ASSERT_GT(answers[3], 0) << "submit failed: code " << -answers[3] << "\n" << daemon_->log();
  EXPECT_EQ(answers[4], 4);

  client::FillJobStatus done = RunUntilStopped(static_cast<uint64_t>(answers[3]), bubble, 200);
  ASSERT_EQ(done.state, client::FillState::kStopped);
  ASSERT_TRUE(done.error.ok()) << done.error;
  ASSERT_EQ(done.steps_done, 4u);
  // The output is the user's own file, written through its fd; nothing appeared in the root.
  const std::string output = home + "/out.safetensors";
  struct stat st {};
  ASSERT_EQ(::stat(output.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kNobody);
  EXPECT_FALSE(std::filesystem::exists(daemon_->dir() / "out.safetensors"));
  ASSERT_NO_FATAL_FAILURE(ExpectOutputIsTheModelsAnswer(output, **model, rows));
  // pswitchd was never told where the user's files are.
  EXPECT_THAT(daemon_->log(), Not(HasSubstr(home)));
  (void)base::RemoveTree(home);
}

// A private set of simulated GPUs (PSWITCH_HOST_DEVICE_DIR) for the jobs and the daemon this
// test starts, gone with it, whatever the test's outcome.
class PrivateDevices {
 public:
  PrivateDevices() : dir_(absl::StrCat(::testing::TempDir(), "/devices-", ::getpid())) {
    std::filesystem::create_directories(dir_);
    ::setenv("PSWITCH_HOST_DEVICE_DIR", dir_.c_str(), 1);
  }
  ~PrivateDevices() {
    ::unsetenv("PSWITCH_HOST_DEVICE_DIR");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PrivateDevices(const PrivateDevices&) = delete;
  PrivateDevices& operator=(const PrivateDevices&) = delete;

 private:
  const std::string dir_;
};

// The real main job: pipetrain measures each stage's bubble cycle over its warm-up, registers
// it (so fill jobs can be placed), reports every bubble, and a fill job runs in them.
TEST(FillPipetrainTest, PipetrainRegistersItsMeasuredCycleAndFillStepsRunInItsBubbles) {
  const PrivateDevices devices;  // no other test's jobs on its simulated GPUs
  e2e::TestDaemon daemon({"--arena-bytes=536870912", "--preload=", "--standby-workers=1",
                          "--activation-bytes=33554432", "--gpus=2", "--fill-grace-ms=30"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto c = client::Client::Connect(daemon.address());
  ASSERT_TRUE(c.ok()) << c.status();
  client::Client& client = **c;
  const std::string log_path = (daemon.dir() / "pipetrain.log").string();
  // 2 stages x 2 micro-batches of 3 + 6 ms: a period of about 27 ms, 2 s in all.
  const std::string command =
      absl::StrCat(PIPETRAIN_PATH, " --stages=2 --microbatches=2 --simulated-compute --fwd-ms=3",
                   " --bwd-ms=6 --warmup=3 --iterations=70 --bubble-free-bytes=67108864 --server=",
                   daemon.address(), " > ",
                   log_path, " 2>&1");
  auto pipetrain = std::async(std::launch::async, [&] { return std::system(command.c_str()); });

  bool registered = false;
  for (int i = 0; i < 2000 && !registered; ++i) {
    std::string log = daemon.log();
    registered = log.find("event=bubble_cycle_registered gpu=0") != std::string::npos &&
                 log.find("event=bubble_cycle_registered gpu=1") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(registered) << daemon.log() << "\npipetrain:\n" << ReadFile(log_path);
  // Each GPU has its own memory daemon, whose socket its workers attach to.
  EXPECT_TRUE(std::filesystem::is_socket(daemon.dir() / "m.sock"));
  EXPECT_TRUE(std::filesystem::is_socket(daemon.dir() / "m.sock.1"));
  // More steps than the run's bubbles hold: it is still running at the end.
  client::FillJobOptions o = SyntheticJob(absl::Milliseconds(1), 100000);
  auto job = client.SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(pipetrain.get(), 0) << ReadFile(log_path);
  const std::string pipetrain_log = ReadFile(log_path);
  EXPECT_THAT(pipetrain_log, HasSubstr("stage 0 registered its measured bubble cycle"));
  EXPECT_THAT(pipetrain_log, Not(HasSubstr("failed"))) << pipetrain_log;
  auto status = client.FillStatus(job->job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_GT(status->steps_done, 10u) << daemon.log();
  EXPECT_GT(status->bubbles, 5u);
  auto stats = client.FillStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->bubble_time, absl::Milliseconds(300));
  EXPECT_GT(stats->fill_step_time, absl::ZeroDuration());
  EXPECT_EQ(stats->killed, 0u);
}

// An uninstrumented main job (issue 30 item 3): pipetrain makes no bubble call (no --server);
// pswitchd --detect-bubbles reads each simulated GPU's activity (the stages' holds of its compute
// lock), finds the job's cycle and its bubbles, and a fill job runs in them.
TEST(FillPipetrainTest, AJobThatMakesNoBubbleCallsHasItsBubblesFoundAndFilled) {
  const PrivateDevices devices;  // no other test's jobs on its simulated GPUs
  e2e::TestDaemon daemon({"--arena-bytes=536870912", "--preload=", "--standby-workers=1",
                          "--activation-bytes=33554432", "--gpus=2", "--fill-grace-ms=30",
                          "--detect-bubbles"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto c = client::Client::Connect(daemon.address());
  ASSERT_TRUE(c.ok()) << c.status();
  client::Client& client = **c;
  const std::string log_path = (daemon.dir() / "pipetrain.log").string();
  // 2 stages x 2 micro-batches of 6 + 12 ms: a period of about 54 ms, 11 s in all.
  const std::string command =
      absl::StrCat(PIPETRAIN_PATH, " --stages=2 --microbatches=2 --simulated-compute --fwd-ms=6",
                   " --bwd-ms=12 --warmup=3 --iterations=200 > ", log_path, " 2>&1");
  auto pipetrain = std::async(std::launch::async, [&] { return std::system(command.c_str()); });

  // Found within the job's run, however loaded the machine (a few cycles once it runs).
  bool detected = false;
  while (!detected &&
         pipetrain.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
    detected = daemon.log().find("event=bubble_cycle_detected gpu=0") != std::string::npos;
  }
  ASSERT_TRUE(detected) << daemon.log() << "\npipetrain:\n" << ReadFile(log_path);
  client::FillJobOptions o = SyntheticJob(absl::Milliseconds(1), 100000);
  auto job = client.SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_EQ(pipetrain.get(), 0) << ReadFile(log_path);
  const std::string pipetrain_log = ReadFile(log_path);
  EXPECT_THAT(pipetrain_log, Not(HasSubstr("registered its measured bubble cycle")));
  auto status = client.FillStatus(job->job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  // Steps in several of its bubbles (how many depends on the machine's load: on an idle one,
  // dozens), and none that had to be killed for not leaving a bubble.
  EXPECT_GE(status->steps_done, 3u) << daemon.log();
  EXPECT_GE(status->bubbles, 2u);
  auto stats = client.FillStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->fill_step_time, absl::ZeroDuration());
  EXPECT_EQ(stats->killed, 0u) << daemon.log();
}

// pswitchd restarting under an uninstrumented job (issue 30): the job, which makes no call and
// writes only its own activity pages, runs on untouched while no pswitchd reads them; the new
// pswitchd reads the pages afresh, finds the job's cycle again and fills its bubbles.
TEST(FillPipetrainTest, APswitchdRestartedUnderAnUninstrumentedJobFindsItsBubblesAgain) {
  const PrivateDevices devices;  // no other test's jobs on its simulated GPUs
  const std::vector<std::string> flags{"--arena-bytes=536870912",
                                       "--preload=",
                                       "--standby-workers=1",
                                       "--activation-bytes=33554432",
                                       "--gpus=2",
                                       "--fill-grace-ms=30",
                                       "--detect-bubbles"};
  auto first = std::make_unique<e2e::TestDaemon>(flags);
  ASSERT_GT(first->port(), 0) << first->log();
  // Beside the daemons' directories, which go with them.
  const std::filesystem::path log_path = std::filesystem::path(::testing::TempDir()) /
                                         absl::StrCat("pipetrain-restart-", ::getpid(), ".log");
  // 2 stages x 2 micro-batches of 6 + 12 ms: a period of about 54 ms, 16 s in all.
  const std::string command =
      absl::StrCat(PIPETRAIN_PATH, " --stages=2 --microbatches=2 --simulated-compute --fwd-ms=6",
                   " --bwd-ms=12 --warmup=3 --iterations=300 > ", log_path.string(), " 2>&1");
  auto pipetrain = std::async(std::launch::async, [&] { return std::system(command.c_str()); });
  auto detected_by = [&](const e2e::TestDaemon& daemon) {
    while (pipetrain.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
      if (daemon.log().find("event=bubble_cycle_detected gpu=0") != std::string::npos) return true;
    }
    return false;
  };
  ASSERT_TRUE(detected_by(*first)) << first->log() << "\npipetrain:\n" << ReadFile(log_path);
  EXPECT_EQ(first->Terminate(), 0);
  first.reset();
  auto second = std::make_unique<e2e::TestDaemon>(flags);
  ASSERT_GT(second->port(), 0) << second->log();
  ASSERT_TRUE(detected_by(*second)) << second->log() << "\npipetrain:\n" << ReadFile(log_path);
  auto c = client::Client::Connect(second->address());
  ASSERT_TRUE(c.ok()) << c.status();
  auto job = (*c)->SubmitFill(SyntheticJob(absl::Milliseconds(1), 100000));
  ASSERT_TRUE(job.ok()) << job.status();

  EXPECT_EQ(pipetrain.get(), 0) << ReadFile(log_path);
  EXPECT_THAT(ReadFile(log_path), Not(HasSubstr("failed")));
  std::filesystem::remove(log_path);
  auto status = (*c)->FillStatus(job->job_id);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_GE(status->steps_done, 3u) << second->log();
  auto stats = (*c)->FillStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->killed, 0u) << second->log();
}

// Online fill (issue 30 item 4): inference requests with a latency objective, served in the main
// job's bubbles. Inference holds the simulated device (--inference-device-lock) on a private set
// of simulated GPUs, so a request run outside a bubble would delay the main job as on a GPU.
class FillOnlineTest : public FillTest {
 protected:
  std::vector<std::string> ExtraFlags() override {
    std::vector<std::string> flags{"--inference-device-lock"};
    for (std::string& flag : OverflowFlags()) flags.push_back(std::move(flag));
    return flags;
  }
  virtual std::vector<std::string> OverflowFlags() { return {}; }
  // The daemon goes while its simulated devices are still there.
  void TearDown() override {
    client_.reset();
    daemon_.reset();
  }

  // tiny_mlp registered as `name`, and one input for it.
  proto::HostTensor RegisterModel(const std::string& name = "mlp") {
    EXPECT_TRUE(client_->Register({name, "tiny_mlp", "", 1, "auto"}).ok());
    auto model = models::CreateModel("tiny_mlp");
    EXPECT_TRUE(model.ok());
    auto input = worker::ToHostTensor("input", (*model)->ExampleInput(1, 5).input);
    EXPECT_TRUE(input.ok());
    return *input;
  }
  static client::InferOptions Online(absl::Duration objective) {
    client::InferOptions o;
    o.online_slo = objective;
    return o;
  }

  const PrivateDevices devices_;  // before the daemon: it inherits the directory
};

TEST_F(FillOnlineTest, ARequestIsServedInTheNextBubbleNotWhileTheMainJobComputes) {
  const proto::HostTensor input = RegisterModel();
  auto plain = client_->Infer("mlp", {input});
  ASSERT_TRUE(plain.ok()) << plain.status();
  RegisterCycle(absl::Milliseconds(80));

  // The device is free, but no bubble has begun: the main job may want it any moment.
  auto online = client_->InferAsync("mlp", {input}, Online(absl::Seconds(20)));
  EXPECT_EQ(online.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "served outside a bubble";
  const int64_t began = base::MonotonicNowNs();
  ASSERT_TRUE(client_->BubbleBegin(0, absl::Milliseconds(80), kFreeBytes).ok());
  ASSERT_EQ(online.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const int64_t answered = base::MonotonicNowNs();
  ASSERT_TRUE(client_->BubbleEnd(0).ok());
  absl::StatusOr<client::TaskResult> result = online.get();
  ASSERT_TRUE(result.ok()) << result.status() << daemon_->log();
  EXPECT_EQ(result->outputs.at(0).data, plain->outputs.at(0).data) << "not the model's answer";
  EXPECT_GT(answered, began);

  // A plain request is no fill work: it runs as soon as the device is free, bubble or not.
  auto lock = gpu::ComputeLock::Open(gpu::ComputeLock::DefaultPath(0));
  ASSERT_TRUE(lock.ok()) << lock.status();
  std::optional<gpu::ComputeLock::Hold> computing(lock->Acquire());  // the main job computes
  auto naive = client_->InferAsync("mlp", {input});
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(naive.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout)
      << "computed while the main job held the device";
  computing.reset();  // the main job's compute ends; no bubble is announced
  ASSERT_EQ(naive.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_TRUE(naive.get().ok());
}

TEST_F(FillOnlineTest, AnObjectiveNoBubbleCanMeetIsRefusedWithTheReasonAndTheJobUntouched) {
  const proto::HostTensor input = RegisterModel();
  RegisterCycle(absl::Milliseconds(50));
  auto refused = client_->Infer("mlp", {input}, Online(absl::Milliseconds(60)));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("latency objective of 60ms"));
  // Refused at the door: an objective beyond the bound.
  client::InferOptions too_long = Online(absl::Hours(2));
  EXPECT_EQ(client_->Infer("mlp", {input}, too_long).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(FillOnlineTest, AModelUnloadedWhileItsRequestWaitsAnswersTheRequestAtTheNextBubble) {
  const proto::HostTensor input = RegisterModel("gone");
  RegisterCycle(absl::Milliseconds(50));
  auto online = client_->InferAsync("gone", {input}, Online(absl::Seconds(20)));
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(client_->Unload("gone").ok());
  Iteration(absl::Milliseconds(50), absl::Milliseconds(5));
  ASSERT_EQ(online.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(online.get().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(FillOnlineTest, WithNoMainJobARequestRunsAtOnce) {
  const proto::HostTensor input = RegisterModel();
  auto result = client_->Infer("mlp", {input}, Online(absl::Milliseconds(500)));
  EXPECT_TRUE(result.ok()) << result.status();
}

class FillOnlineOverflowRunTest : public FillOnlineTest {
 protected:
  std::vector<std::string> OverflowFlags() override { return {"--online-fill-overflow=run"}; }
};

TEST_F(FillOnlineOverflowRunTest, AnObjectiveNoBubbleCanMeetRunsAtOnceWhenTheOperatorSaysSo) {
  const proto::HostTensor input = RegisterModel();
  RegisterCycle(absl::Milliseconds(50));
  auto result = client_->Infer("mlp", {input}, Online(absl::Milliseconds(60)));
  EXPECT_TRUE(result.ok()) << result.status();
}

}  // namespace
}  // namespace pswitch
