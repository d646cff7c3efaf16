// pipetrain: a pipeline-parallel training job, the "main job" whose idle bubbles pswitch fills.
//
//   pipetrain [--stages 4] [--microbatches 8] [--schedule gpipe|1f1b] [--iterations 10]
//             [--warmup 1] [--simulated-compute [--fwd-ms F --bwd-ms B]] [--seed S]
//             [--n-layer 8 --n-embd 128 --n-head 4 --vocab-size 512 --seq-len 64
//              --microbatch-size 2] [--bubble-free-bytes N] [--pin-cores] [--json PATH]
//
// Forks one process per stage, chained by Unix sockets that carry activations forward and
// gradients backward. Real mode trains the zoo's GPT-2 split by transformer blocks (SGD, one
// libtorch thread per stage). --simulated-compute makes every op sleep its cost instead (given
// by --fwd-ms/--bwd-ms, or profiled on the real GPT-2 stage), still passing small messages, so
// the bubbles are real idle time even on a machine with fewer cores than stages. Prints measured
// iteration time, per-stage busy and bubble time and the bubble ratio beside the simulator's
// prediction; --json writes them too.
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/clock.h"
#include "base/status.h"
#include "client/client.h"
#include "fill/bubble_cycle.h"
#include "gpu/copy_engine.h"
#include "gpu/host/compute_lock.h"
#include "pipeline/bubble_reporter.h"
#include "pipeline/coordinator.h"
#include "pipeline/gpt2_stage.h"
#include "pipeline/report.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_compute.h"
#include "pipeline/stage_runner.h"
#include "tools/cli.h"

ABSL_FLAG(int, stages, 4, "pipeline stages (one process each)");
ABSL_FLAG(int, microbatches, 8, "micro-batches per iteration");
ABSL_FLAG(std::string, schedule, "gpipe", "gpipe or 1f1b");
ABSL_FLAG(int, iterations, 10, "measured iterations");
ABSL_FLAG(int, warmup, 1, "iterations run before measuring");
ABSL_FLAG(bool, simulated_compute, false,
          "ops sleep their cost instead of computing (real messages still flow)");
ABSL_FLAG(double, fwd_ms, 0, "simulated forward cost per micro-batch (0: profile the real stage)");
ABSL_FLAG(double, bwd_ms, 0, "simulated backward cost per micro-batch (0: profile the real stage)");
ABSL_FLAG(uint64_t, seed, 0, "seed for weights and data");
ABSL_FLAG(int, n_layer, 8, "GPT-2 transformer blocks (split over the stages)");
ABSL_FLAG(int, n_embd, 128, "GPT-2 width");
ABSL_FLAG(int, n_head, 4, "GPT-2 attention heads");
ABSL_FLAG(int, vocab_size, 512, "GPT-2 vocabulary");
ABSL_FLAG(int, seq_len, 64, "tokens per sequence");
ABSL_FLAG(int, microbatch_size, 2, "sequences per micro-batch");
ABSL_FLAG(double, lr, 0.01, "SGD learning rate");
ABSL_FLAG(double, momentum, 0.9, "SGD momentum");
ABSL_FLAG(bool, dropout, true, "train with dropout (false: deterministic runs)");
ABSL_FLAG(uint64_t, bubble_free_bytes, 0, "device bytes each bubble announces as free");
ABSL_FLAG(bool, pin_cores, false, "pin stage s to core s modulo the available cores");
ABSL_FLAG(bool, log_bubbles, false, "print every bubble a stage announces to stderr");
ABSL_FLAG(double, timeout_s, 60, "longest wait of a stage for one message");
ABSL_FLAG(std::string, json, "", "write the measurements as JSON to this path");
ABSL_FLAG(std::string, bubble_log, "",
          "append every bubble of every stage to this file at the end, one 'STAGE BEGIN_NS "
          "END_NS' line each (CLOCK_MONOTONIC): the truth a bubble detector is judged against");
ABSL_FLAG(int, crash_stage, -1, "testing aid: this stage kills itself at --crash-iteration");
ABSL_FLAG(int, crash_iteration, 0, "testing aid: see --crash-stage");
ABSL_FLAG(std::vector<std::string>, real_stages, {},
          "with --simulated-compute: these stages (e.g. 0) compute the real GPT-2 stage on "
          "--device while the others are simulated, so one GPU idles in its stage's bubbles");
ABSL_FLAG(std::string, device, "cpu",
          "real compute: cpu, or cuda / cuda:N (every stage on that GPU when one is shared)");
ABSL_FLAG(std::string, token, "",
          "bearer token for a pswitchd with --auth-tokens, an admin's (bubble calls); default "
          "$PSWITCH_TOKEN");
ABSL_FLAG(std::string, server, "",
          "pswitchd HOST:PORT: each stage reports its bubbles there (stage s = GPU s), so fill "
          "tasks run in them");
ABSL_FLAG(bool, device_lock, true,
          "simulated compute holds the host device's compute lock (GPU = stage) while it "
          "computes, as a time-sliced GPU would (see gpu/host/compute_lock.h)");

namespace pswitch::pipeline {
namespace {

// Prints each bubble; a stand-in for a server reporter that shows where the hook fires.
class LogReporter final : public BubbleReporter {
 public:
  void BubbleBegin(int stage, int, absl::Duration expected, uint64_t free_bytes) override {
    begin_ = absl::Now();
    std::fprintf(stderr, "stage %d bubble: expected %.2f ms, %llu bytes free\n", stage,
                 absl::ToDoubleMilliseconds(expected), static_cast<unsigned long long>(free_bytes));
  }
  void BubbleEnd(int stage) override {
    std::fprintf(stderr, "stage %d bubble end after %.2f ms\n", stage,
                 absl::ToDoubleMilliseconds(absl::Now() - begin_));
  }

 private:
  absl::Time begin_;
};

// Reports bubbles to pswitchd with the client library's bubble instruction (one send per call,
// no wait), and registers the stage's bubble cycle once it has measured it: over the warm-up
// iterations (all but the first, which is cold, when there are several), so fill jobs are
// placed and predicted on what this job really does. One reporter per stage process (its own
// connection, opened after the fork). A failure is reported once and the stage goes on: the
// main job must never depend on the fill service.
class ServerReporter final : public BubbleReporter {
 public:
  ServerReporter(std::unique_ptr<client::Client> client, int warmup)
      : client_(std::move(client)),
        skip_(warmup >= 2 ? 1 : 0),
        profile_iterations_(std::max(1, warmup - skip_)) {}

  void BubbleBegin(int stage, int position, absl::Duration expected,
                   uint64_t free_bytes) override {
    bubble_begin_ = absl::Now();
    bubble_position_ = position;
    free_bytes_ = free_bytes;
    Check(client_->BubbleBegin(static_cast<uint32_t>(stage), expected, free_bytes));
  }
  void BubbleEnd(int stage) override {
    const absl::Time end = absl::Now();
    Check(client_->BubbleEnd(static_cast<uint32_t>(stage)));
    // Waits too short to hold any fill step are not worth placing work in.
    if (profiling_ && end - bubble_begin_ >= kMinProfiledBubble) {
      Check(profiler_.RecordBubble(bubble_position_, bubble_begin_, end,
                                   static_cast<int64_t>(free_bytes_)));
    }
  }
  // Profiles iterations [skip_, skip_ + profile_iterations_) and registers at the start of the
  // next one: one round trip (about 0.1 ms on this node), once.
  void IterationStart(int stage, int iteration) override {
    if (registered_ || iteration < skip_) return;
    Check(profiler_.StartIteration(absl::Now()));  // closes the previous profiled iteration
    profiling_ = true;
    if (profiler_.complete_iterations() >= profile_iterations_) {
      Register(stage, base::MonotonicNowNs());
    }
  }

 private:
  static constexpr absl::Duration kMinProfiledBubble = absl::Microseconds(500);

  void Register(int stage, int64_t origin_ns) {
    registered_ = true;
    profiling_ = false;
    absl::StatusOr<fill::BubbleCycle> cycle = profiler_.Build();
    if (!cycle.ok()) return Check(cycle.status());
    const std::string json = fill::BubbleCycleToJson(*cycle).dump();
    // One round trip, at an iteration start, once.
    Check(client_->RegisterBubbleCycle(static_cast<uint32_t>(stage), json, origin_ns));
    std::fprintf(stderr,
                 "pipetrain: stage %d registered its measured bubble cycle: period %.2f ms, %zu "
                 "bubbles\n",
                 stage, absl::ToDoubleMilliseconds(cycle->period), cycle->bubbles.size());
  }
  void Check(const absl::Status& status) {
    if (status.ok() || warned_) return;
    warned_ = true;
    std::fprintf(stderr, "pipetrain: reporting to pswitchd failed (stage keeps training): %s\n",
                 status.ToString().c_str());
  }

  std::unique_ptr<client::Client> client_;
  const int skip_;                // cold iterations left out of the profile
  const int profile_iterations_;  // complete iterations the cycle is measured over
  fill::BubbleCycleProfiler profiler_;
  bool profiling_ = false;
  bool registered_ = false;
  absl::Time bubble_begin_;
  int bubble_position_ = 0;
  uint64_t free_bytes_ = 0;
  bool warned_ = false;
};

// Keeps each bubble's begin and end on this node's monotonic clock beside what `inner` does, and
// appends them to `path` at the stage's end (one write: stages append whole blocks, and nothing
// touches the file while the job runs).
class RecordedReporter final : public BubbleReporter {
 public:
  RecordedReporter(std::unique_ptr<BubbleReporter> inner, std::string path)
      : inner_(std::move(inner)), path_(std::move(path)) {
    bubbles_.reserve(1 << 14);
  }
  ~RecordedReporter() override {
    std::string text;
    for (const auto& [begin_ns, end_ns] : bubbles_) {
      absl::StrAppend(&text, stage_, " ", begin_ns, " ", end_ns, "\n");
    }
    const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      std::fprintf(stderr, "pipetrain: stage %d could not write --bubble-log %s: %s\n", stage_,
                   path_.c_str(), std::strerror(errno));
    }
    if (fd >= 0) ::close(fd);
  }
  void BubbleBegin(int stage, int position, absl::Duration expected, uint64_t free_bytes) override {
    stage_ = stage;
    begin_ns_ = base::MonotonicNowNs();
    inner_->BubbleBegin(stage, position, expected, free_bytes);
  }
  void BubbleEnd(int stage) override {
    bubbles_.emplace_back(begin_ns_, base::MonotonicNowNs());
    inner_->BubbleEnd(stage);
  }
  void IterationStart(int stage, int iteration) override {
    inner_->IterationStart(stage, iteration);
  }

 private:
  const std::unique_ptr<BubbleReporter> inner_;
  const std::string path_;
  int stage_ = 0;
  int64_t begin_ns_ = 0;
  std::vector<std::pair<int64_t, int64_t>> bubbles_;
};

absl::StatusOr<std::unique_ptr<BubbleReporter>> MakeInnerReporter(int /*stage*/) {
  if (!absl::GetFlag(FLAGS_server).empty()) {
    client::ClientOptions options;
    options.token = tools::ClientToken(absl::GetFlag(FLAGS_token));
    PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                             client::Client::Connect(absl::GetFlag(FLAGS_server), options));
    return std::make_unique<ServerReporter>(std::move(client), absl::GetFlag(FLAGS_warmup));
  }
  if (absl::GetFlag(FLAGS_log_bubbles)) return std::make_unique<LogReporter>();
  return std::make_unique<NullReporter>();
}

absl::StatusOr<std::unique_ptr<BubbleReporter>> MakeBubbleReporter(int stage) {
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<BubbleReporter> reporter, MakeInnerReporter(stage));
  if (absl::GetFlag(FLAGS_bubble_log).empty()) return reporter;
  return std::make_unique<RecordedReporter>(std::move(reporter), absl::GetFlag(FLAGS_bubble_log));
}

// Simulated compute that occupies its stage's (host) device while it computes.
class DeviceLockedCompute final : public StageCompute {
 public:
  DeviceLockedCompute(std::unique_ptr<StageCompute> inner, gpu::ComputeLock lock)
      : inner_(std::move(inner)), lock_(std::move(lock)) {}
  TensorSpec InputSpec() const override { return inner_->InputSpec(); }
  TensorSpec OutputSpec() const override { return inner_->OutputSpec(); }
  absl::StatusOr<StageCost> Profile() override { return inner_->Profile(); }
  absl::Status StartIteration(int iteration) override { return inner_->StartIteration(iteration); }
  absl::StatusOr<WireTensor> Forward(int microbatch, WireTensor input) override {
    gpu::ComputeLock::Hold hold = lock_.Acquire();
    return inner_->Forward(microbatch, std::move(input));
  }
  absl::StatusOr<WireTensor> Backward(int microbatch, WireTensor output_grad) override {
    gpu::ComputeLock::Hold hold = lock_.Acquire();
    return inner_->Backward(microbatch, std::move(output_grad));
  }
  absl::StatusOr<double> FinishIteration() override { return inner_->FinishIteration(); }

 private:
  std::unique_ptr<StageCompute> inner_;
  gpu::ComputeLock lock_;
};

Gpt2StageOptions Gpt2Options(int stage) {
  Gpt2StageOptions o;
  o.stage = stage;
  o.stages = absl::GetFlag(FLAGS_stages);
  o.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.microbatch_size = absl::GetFlag(FLAGS_microbatch_size);
  o.model_config.values = {
      {"n_layer", absl::GetFlag(FLAGS_n_layer)}, {"n_embd", absl::GetFlag(FLAGS_n_embd)},
      {"n_head", absl::GetFlag(FLAGS_n_head)},   {"vocab_size", absl::GetFlag(FLAGS_vocab_size)},
      {"seq_len", absl::GetFlag(FLAGS_seq_len)}, {"n_positions", absl::GetFlag(FLAGS_seq_len)}};
  o.seed = absl::GetFlag(FLAGS_seed);
  o.learning_rate = absl::GetFlag(FLAGS_lr);
  o.momentum = absl::GetFlag(FLAGS_momentum);
  o.dropout = absl::GetFlag(FLAGS_dropout);
  o.device = c10::Device(absl::GetFlag(FLAGS_device));  // validated by OptionsFromFlags
  return o;
}

bool FixedCosts() { return absl::GetFlag(FLAGS_fwd_ms) > 0; }

// --real-stages as indices (validated by OptionsFromFlags).
std::vector<int> RealStages() {
  std::vector<int> out;
  for (const std::string& s : absl::GetFlag(FLAGS_real_stages)) {
    int stage = -1;
    if (absl::SimpleAtoi(s, &stage)) out.push_back(stage);
  }
  return out;
}

bool IsRealStage(int stage) {
  const std::vector<int> real = RealStages();
  return std::find(real.begin(), real.end(), stage) != real.end();
}

// The activation every GPT-2 stage sends and receives: f32[micro-batch, tokens, width].
TensorSpec Gpt2ActivationSpec() {
  return {WireDType::kF32,
          {absl::GetFlag(FLAGS_microbatch_size), absl::GetFlag(FLAGS_seq_len),
           absl::GetFlag(FLAGS_n_embd)}};
}

absl::Status PinToCore(int stage) {
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
    return ErrnoStatus("sched_getaffinity");
  const int cores = CPU_COUNT(&allowed);
  int wanted = stage % cores, seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != wanted) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    // Before any thread of the stage exists, so its link readers inherit the mask.
    if (::sched_setaffinity(0, sizeof(one), &one) != 0) return ErrnoStatus("sched_setaffinity");
    return absl::OkStatus();
  }
  return absl::InternalError("no core to pin to");
}

// What each stage process runs.
absl::Status StageBody(StageConfig config, StageLinks& links) {
  const int stage = config.stage;
  config.bubble_free_bytes = absl::GetFlag(FLAGS_bubble_free_bytes);
  if (stage == absl::GetFlag(FLAGS_crash_stage)) {
    config.crash_at_iteration = absl::GetFlag(FLAGS_crash_iteration);
  }
  if (absl::GetFlag(FLAGS_pin_cores)) PSWITCH_RETURN_IF_ERROR(PinToCore(stage));
  std::unique_ptr<StageCompute> compute;
  const bool real = !absl::GetFlag(FLAGS_simulated_compute) || IsRealStage(stage);
  // Beside a real stage, simulated ones pass messages of its activation's shape.
  const TensorSpec message = RealStages().empty() ? SimulatedCompute::DefaultMessage()
                                                  : Gpt2ActivationSpec();
  if (!real && FixedCosts()) {
    compute = SimulatedCompute::WithCost({absl::Milliseconds(absl::GetFlag(FLAGS_fwd_ms)),
                                          absl::Milliseconds(absl::GetFlag(FLAGS_bwd_ms))},
                                         message);
  } else {
    PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<Gpt2StageCompute> gpt2,
                             Gpt2StageCompute::Create(Gpt2Options(stage)));
    if (!real) {
      compute = SimulatedCompute::ProfiledFrom(std::move(gpt2), message);
    } else {
      compute = std::move(gpt2);
    }
  }
  if (!real && absl::GetFlag(FLAGS_device_lock)) {
    // Its holds are the simulated GPU's activity, which pswitchd's bubble detection reads
    // (--detect-bubbles) when no --server gets the bubble calls.
    PSWITCH_ASSIGN_OR_RETURN(gpu::ComputeLock lock,
                             gpu::ComputeLock::Open(gpu::ComputeLock::DefaultPath(stage),
                                                    /*record_activity=*/true));
    compute = std::make_unique<DeviceLockedCompute>(std::move(compute), std::move(lock));
  }
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<BubbleReporter> reporter, MakeBubbleReporter(stage));
  return ServeStage(config, links, *compute, *reporter);
}

absl::StatusOr<PipelineOptions> OptionsFromFlags() {
  PipelineOptions o;
  PSWITCH_ASSIGN_OR_RETURN(o.schedule, ParseScheduleKind(absl::GetFlag(FLAGS_schedule)));
  o.stages = absl::GetFlag(FLAGS_stages);
  o.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.iterations = absl::GetFlag(FLAGS_iterations);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s > 0)) return absl::InvalidArgumentError("--timeout-s must be positive");
  o.receive_timeout = absl::Seconds(timeout_s);
  const bool simulated = absl::GetFlag(FLAGS_simulated_compute);
  try {
    c10::Device device(absl::GetFlag(FLAGS_device));
    if (!device.is_cpu() && !device.is_cuda()) throw std::invalid_argument("not cpu or cuda");
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(absl::StrCat("--device must be cpu, cuda or cuda:N, got '",
                                                   absl::GetFlag(FLAGS_device), "'"));
  }
  for (const std::string& s : absl::GetFlag(FLAGS_real_stages)) {
    int stage = -1;
    if (!absl::SimpleAtoi(s, &stage) || stage < 0 || stage >= o.stages) {
      return absl::InvalidArgumentError(absl::StrCat("--real-stages: '", s,
                                                     "' is not a stage in [0, ", o.stages, ")"));
    }
  }
  if (!absl::GetFlag(FLAGS_real_stages).empty() && !simulated) {
    return absl::InvalidArgumentError(
        "--real-stages picks the real ones among simulated stages: add --simulated-compute");
  }
  const double fwd = absl::GetFlag(FLAGS_fwd_ms), bwd = absl::GetFlag(FLAGS_bwd_ms);
  if (fwd < 0 || bwd < 0) return absl::InvalidArgumentError("--fwd-ms/--bwd-ms must be >= 0");
  if ((fwd > 0) != (bwd > 0)) {
    return absl::InvalidArgumentError("give both --fwd-ms and --bwd-ms, or neither to profile");
  }
  if (fwd > 0 && !simulated) {
    return absl::InvalidArgumentError("--fwd-ms/--bwd-ms need --simulated-compute");
  }
  // Real compute (or profiling it) needs a model that splits: checked here so the error is one
  // line, not one per stage.
  if (!(simulated && fwd > 0) || !absl::GetFlag(FLAGS_real_stages).empty()) {
    if (absl::GetFlag(FLAGS_n_layer) < o.stages) {
      return absl::InvalidArgumentError(absl::StrCat("--n-layer ", absl::GetFlag(FLAGS_n_layer),
                                                     " is less than --stages ", o.stages,
                                                     " (each stage needs a block)"));
    }
    if (absl::GetFlag(FLAGS_n_head) < 1 ||
        absl::GetFlag(FLAGS_n_embd) % absl::GetFlag(FLAGS_n_head) != 0) {
      return absl::InvalidArgumentError("--n-embd must be a multiple of --n-head");
    }
    if (absl::GetFlag(FLAGS_microbatch_size) < 1 || absl::GetFlag(FLAGS_seq_len) < 2 ||
        absl::GetFlag(FLAGS_vocab_size) < 2 || absl::GetFlag(FLAGS_n_embd) < 1) {
      return absl::InvalidArgumentError(
          "--microbatch-size, --n-embd must be >= 1; --seq-len, --vocab-size >= 2");
    }
    o.tied_link = !simulated && o.stages > 1;
  }
  // The schedule's own limits (stages, micro-batches) come back from BuildSchedule.
  PSWITCH_RETURN_IF_ERROR(BuildSchedule(o.schedule, o.stages, o.microbatches).status());
  if (o.iterations < 1 || o.warmup < 0) {
    return absl::InvalidArgumentError("--iterations must be >= 1 and --warmup >= 0");
  }
  return o;
}

std::string ModeDescription() {
  const std::string model =
      absl::StrFormat("gpt2 n_layer=%d n_embd=%d seq_len=%d, %d sequences per micro-batch",
                      absl::GetFlag(FLAGS_n_layer), absl::GetFlag(FLAGS_n_embd),
                      absl::GetFlag(FLAGS_seq_len), absl::GetFlag(FLAGS_microbatch_size));
  if (!absl::GetFlag(FLAGS_simulated_compute)) return absl::StrCat("real compute (", model, ")");
  std::string real;
  if (!RealStages().empty()) {
    real = absl::StrCat("; stages ", absl::StrJoin(absl::GetFlag(FLAGS_real_stages), ","),
                        " real (", model, " on ", absl::GetFlag(FLAGS_device), ")");
  }
  if (FixedCosts()) {
    return absl::StrFormat("simulated compute (fwd %.2f ms, bwd %.2f ms%s)",
                           absl::GetFlag(FLAGS_fwd_ms), absl::GetFlag(FLAGS_bwd_ms), real);
  }
  if (!real.empty()) return absl::StrCat("simulated compute (costs profiled on ", model, real, ")");
  return absl::StrCat("simulated compute (costs profiled on ", model, ")");
}

}  // namespace
}  // namespace pswitch::pipeline

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(
      argc, argv,
      "pipetrain [--stages 4] [--microbatches 8] [--schedule gpipe|1f1b] [--iterations 10] "
      "[--warmup 1] [--simulated-compute [--fwd-ms F --bwd-ms B]] [--json PATH] ...");
  using namespace pswitch::pipeline;
  absl::StatusOr<PipelineOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "pipetrain: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<PipelineReport> report = RunPipeline(*options, StageBody);
  if (!report.ok()) {
    std::fprintf(stderr, "pipetrain: %s\n", report.status().ToString().c_str());
    return 1;
  }
  const std::string mode = ModeDescription();
  std::fputs(FormatSummary(*report, mode).c_str(), stdout);
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    absl::Status written = WriteReportJson(*report, mode, json_path);
    if (!written.ok()) {
      std::fprintf(stderr, "pipetrain: %s\n", written.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
