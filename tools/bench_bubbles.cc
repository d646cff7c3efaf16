// bench-bubbles: the main job (pipetrain, 4 pipeline stages, simulated compute on the host's
// simulated devices) run alone, with pswitch fill tasks in its bubbles, and with naive
// co-location (fill work running unmanaged on the same devices). Reports, per configuration
// (schedule x micro-batches), the median increase of the main job's iteration time with a 95 %
// interval, the share of bubble time fill steps used, fill throughput and the pause latency
// (bubble end -> fill task paused), plus the cost of one bubble-instruction call.
//
// Method (issue 12): a 1 % effect is the size of one run's noise on a shared 2-core machine, so
// a single "with" run beside a single "without" run cannot show it. Each configuration runs its
// arms interleaved, once each per round, for --repeats rounds, in a balanced order (RoundOrder)
// so that drift and after-effects spread over all arms:
//   alone        the main job by itself (the baseline of its round);
//   alone-again  the same again: the A/A comparison, i.e. the noise floor of the method;
//   fill         with pswitch fill tasks in its bubbles;
//   cpu-only     with fill tasks too, but the stages do not take their device's compute lock,
//                so the fill steps cannot delay the main job on the device, only on the CPUs
//                (pswitchd, workers, the bubble instruction): fill - cpu-only is the device
//                interference, i.e. fill steps still holding the device after their bubble;
//   naive        unmanaged co-location;
//   detected     the main job making no bubble call at all (pipetrain without --server) on its
//                own set of simulated devices, with a second pswitchd that finds its bubbles
//                from the devices' activity (--detect-bubbles, issue 30 item 3) and fills them.
// With --online-rates (issue 30 item 4; only the --online-configs), three more arms per rate,
// each sending the same Poisson arrivals of tiny_mlp inference requests (one seed per round):
//   online R     the requests carry a latency objective (--online-slo-ms): pswitchd serves them
//                in the main job's bubbles (pull-and-execute), beside the fill jobs;
//   co-exec R    the same requests as plain requests: they run at once, sharing the device
//                with the main job (naive co-execution);
//   idle R       the same requests with no main job: the latency of an idle GPU.
// The daemon runs --inference-device-lock, so an inference holds its simulated device while it
// computes, as every fill step does.
// Each arm's run is paired with its round's alone run, and the median of the paired relative
// increases gets a distribution-free order-statistic interval (tools/bench_stats.h says why
// that and not a bootstrap). The target (increase <= 1 % with >= 80 % of bubble time used) is
// "met" only when the interval's upper end is within it. Every configuration gets its own
// pswitchd, so its fill and pause statistics are its own (the pause percentiles cover its fill
// and cpu-only runs; the share of bubble time used is the fill runs' own).
//
// Host figures: every stage "computes" by holding its device's compute lock for the profiled
// time (gpu/host/compute_lock.h), and fill steps are synthetic steps that hold the same lock,
// so the device contention is that of a time-sliced GPU; the CPU contention (4 stages, pswitchd,
// its workers and the bench on the machine's cores) is the host's own and shows in cpu-only.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "base/files.h"
#include "base/status.h"
#include "client/client.h"
#include "gpu/host/compute_lock.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "tools/bench_stats.h"
#include "tools/cli.h"
#include "tools/pswitchd_process.h"

ABSL_FLAG(bool, quick, false,
          "a short run (4 iterations per run, --repeats rounds still) that finishes in a few "
          "minutes");
ABSL_FLAG(int, repeats, 0,
          "rounds per configuration, each running every arm once (0: 10, or 6 with --quick). "
          "6 is the fewest for which [min, max] of the paired increases is a 95 % interval for "
          "their median; 10 completes the balanced order of 5 arms");
ABSL_FLAG(int, iterations, 12, "measured main-job iterations per run (--quick: 4)");
ABSL_FLAG(int, warmup, 1, "main-job warm-up iterations per run (not measured)");
ABSL_FLAG(double, fwd_ms, 4, "simulated forward time per micro-batch and stage");
ABSL_FLAG(double, bwd_ms, 8, "simulated backward time per micro-batch and stage");
ABSL_FLAG(double, fill_step_ms, 1, "fill tasks' step time (synthetic steps on the device)");
ABSL_FLAG(std::string, configs, "gpipe-4,gpipe-8,1f1b-4,1f1b-8",
          "configurations, SCHEDULE-MICROBATCHES, comma-separated");
ABSL_FLAG(bool, cpu_only_arm, true,
          "run the cpu-only arm (fill tasks on, stages without the device lock) that separates "
          "device interference from CPU interference");
ABSL_FLAG(bool, fill_resident_runs, true,
          "pswitchd's --fill-resident-runs: fill runs live across bubbles, woken by their bell "
          "(false: one Run message per bubble)");
ABSL_FLAG(bool, detected_arm, true,
          "run the detected arm: pipetrain making no bubble call, its bubbles found by a "
          "pswitchd --detect-bubbles from the devices' activity");
ABSL_FLAG(int, naive_gap_us, 0,
          "naive arm: the loops leave the device free this long between steps (0: re-lock at "
          "once, which flock's unfairness lets starve a stage)");
ABSL_FLAG(std::string, device, "",
          "real GPT-2 compute on this device (pipetrain --device: cpu, cuda, cuda:N; every stage "
          "on it) instead of simulated compute; the naive and cpu-only arms, which act on the "
          "host compute lock, are then left out");
ABSL_FLAG(std::string, backend, "host", "pswitchd's --backend");
ABSL_FLAG(double, target_increase_pct, 1, "target: median main-job increase at most this");
ABSL_FLAG(double, target_used_pct, 80, "target: at least this share of bubble time used");
ABSL_FLAG(double, detect_window_ms, 2, "the detected arm's pswitchd --detect-window-ms");
ABSL_FLAG(double, target_detected_increase_pct, 1.5,
          "target of the detected arm: median main-job increase at most this");
ABSL_FLAG(double, target_detected_used_pct, 70,
          "target of the detected arm: at least this share of the job's bubble time used");
ABSL_FLAG(std::string, online_rates, "25,100",
          "online fill arms: two Poisson arrival rates of inference requests (requests/s), "
          "LOW,HIGH; empty: no online arms");
ABSL_FLAG(std::string, online_configs, "gpipe-4",
          "the configurations the online arms run in (comma-separated)");
ABSL_FLAG(double, online_slo_ms, 150, "online fill requests' latency objective");
ABSL_FLAG(double, target_online_p95_ratio, 1.0 / 3,
          "target of the online arms: p95 latency at most this share of co-execution's");

namespace pswitch {
namespace {

constexpr int kStages = 4;
constexpr uint64_t kFreeBytes = 256ull << 20;
constexpr double kLevel = 0.95;
// The detected arm's extra warm-up iterations: the detector needs three cycles and seven
// mapped stretches before it fills, and three predictions that held to fill all of each bubble
// (fill::BubbleDetector).
constexpr int kDetectionWarmup = 10;
// Where a detected run's pipetrain writes its own bubbles (--bubble-log), in the run's dir.
constexpr char kTruthLog[] = "truth-bubbles.txt";

struct Config {
  pipeline::ScheduleKind schedule;
  int microbatches;
  std::string Name() const {
    return absl::StrCat(pipeline::ScheduleKindName(schedule), "-", microbatches);
  }
};

absl::StatusOr<std::vector<Config>> ParseConfigs(const std::string& text) {
  std::vector<Config> configs;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, '-');
    int m = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &m) || m < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--configs: '", item, "' is not SCHEDULE-MICROBATCHES (e.g. gpipe-4)"));
    }
    PSWITCH_ASSIGN_OR_RETURN(pipeline::ScheduleKind kind, pipeline::ParseScheduleKind(parts[0]));
    configs.push_back({kind, m});
  }
  if (configs.empty()) return absl::InvalidArgumentError("--configs names no configuration");
  return configs;
}

enum class Arm {
  kAlone,
  kAloneAgain,
  kFill,
  kCpuOnly,
  kNaive,
  kDetected,
  kOnlineLow,
  kOnlineHigh,
  kCoExecLow,
  kCoExecHigh,
  kIdleLow,
  kIdleHigh,
};
bool IsOnline(Arm arm) { return arm >= Arm::kOnlineLow; }
bool IsIdle(Arm arm) { return arm == Arm::kIdleLow || arm == Arm::kIdleHigh; }
bool HighRate(Arm arm) {
  return arm == Arm::kOnlineHigh || arm == Arm::kCoExecHigh || arm == Arm::kIdleHigh;
}

const char* ArmName(Arm arm) {
  switch (arm) {
    case Arm::kAlone:
      return "alone";
    case Arm::kAloneAgain:
      return "alone-again";
    case Arm::kFill:
      return "fill";
    case Arm::kCpuOnly:
      return "cpu-only";
    case Arm::kDetected:
      return "detected";
    case Arm::kNaive:
      return "naive";
    case Arm::kOnlineLow:
      return "online-low";
    case Arm::kOnlineHigh:
      return "online-high";
    case Arm::kCoExecLow:
      return "co-exec-low";
    case Arm::kCoExecHigh:
      return "co-exec-high";
    case Arm::kIdleLow:
      return "idle-low";
    case Arm::kIdleHigh:
      return "idle-high";
  }
  return "?";
}

// One pipetrain run's figures.
struct MainJobRun {
  double iteration_ms = 0;  // mean over measured iterations
  double busy_ms = 0;       // per stage and iteration: compute, including waits for the device
  double bubble_ratio = 0;
  double wall_s = 0;        // the whole run, start-up included
  double iterations_s = 0;  // every iteration's wall time, warm-up included
  // Waits the fill gate would put steps in (announced length > one step + margin), and those
  // that ended earlier than announced less the margin: a step timed to the announced end still
  // holds the device when the stage wants it back. early_ms sums min(how much earlier, one
  // step) over them: an upper bound on that device wait.
  int fillable_waits = 0;
  int early_waits = 0;
  double early_ms = 0;
  int stage_iterations = 0;
};

// The fill gate's margin (controller::FillManagerOptions::margin, pswitchd's default).
constexpr double kGateMarginMs = 0.3;

void CountEarlyWaits(const nlohmann::json& report, MainJobRun& run) {
  const double step_ms = absl::GetFlag(FLAGS_fill_step_ms);
  for (const nlohmann::json& iteration : report["iterations"]) {
    if (iteration.value("warmup", false)) continue;
    for (const nlohmann::json& stage : iteration["stages"]) {
      ++run.stage_iterations;
      for (const nlohmann::json& wait : stage["waits"]) {
        const double expected = wait["expected_ms"].get<double>();
        if (expected <= step_ms + kGateMarginMs) continue;
        ++run.fillable_waits;
        const double early = expected - kGateMarginMs - wait["duration_ms"].get<double>();
        if (early <= 0) continue;
        ++run.early_waits;
        run.early_ms += std::min(early, step_ms);
      }
    }
  }
}

// `devices`: a private set of simulated devices (PSWITCH_HOST_DEVICE_DIR); empty: the machine's.
absl::StatusOr<MainJobRun> RunPipetrain(const Config& c, int iterations, Arm arm,
                                        const std::string& server, const std::filesystem::path& dir,
                                        const std::string& devices = "") {
  const std::string json = (dir / "pipetrain.json").string();
  const std::string device = absl::GetFlag(FLAGS_device);
  const bool fill = arm == Arm::kFill || arm == Arm::kCpuOnly || IsOnline(arm);
  // A run is a fresh job to the detector (it forgets across the gap between runs): it learns the
  // cycle over extra warm-up iterations, not measured, as a real job's first iterations would be.
  const int warmup = absl::GetFlag(FLAGS_warmup) + (devices.empty() ? 0 : kDetectionWarmup);
  std::string cmd = absl::StrCat(
      tools::SiblingBinary("pipetrain"), " --stages=", kStages, " --microbatches=", c.microbatches,
      " --schedule=", pipeline::ScheduleKindName(c.schedule), " --iterations=", iterations,
      " --warmup=", warmup, " --bubble-free-bytes=", kFreeBytes, " --json=", json);
  if (device.empty()) {
    absl::StrAppend(&cmd, " --simulated-compute --fwd-ms=", absl::GetFlag(FLAGS_fwd_ms),
                    " --bwd-ms=", absl::GetFlag(FLAGS_bwd_ms));
  } else {
    absl::StrAppend(&cmd, " --device=", device);
  }
  if (fill) absl::StrAppend(&cmd, " --server=", server);
  if (!devices.empty()) {
    // The job's own bubbles, to score the detector's against.
    absl::StrAppend(&cmd, " --bubble-log=", (dir / kTruthLog).string());
    cmd = absl::StrCat("PSWITCH_HOST_DEVICE_DIR=", devices, " ", cmd);
  }
  if (arm == Arm::kCpuOnly) absl::StrAppend(&cmd, " --device-lock=false");
  const std::string log = (dir / "pipetrain.log").string();
  absl::StrAppend(&cmd, " > /dev/null 2>> ", log);
  std::filesystem::remove(json);
  const absl::Time start = absl::Now();
  if (std::system(cmd.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("pipetrain failed (log ", log, "): ", cmd));
  }
  MainJobRun run;
  run.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  std::ifstream in(json);
  nlohmann::json report = nlohmann::json::parse(in, nullptr, false);
  if (report.is_discarded() || !report.contains("measured")) {
    return absl::InternalError("pipetrain wrote no summary to " + json);
  }
  const nlohmann::json& measured = report["measured"];
  run.iteration_ms = measured["iteration_ms_mean"].get<double>();
  run.bubble_ratio = measured["bubble_ratio"].get<double>();
  double busy = 0;
  for (const nlohmann::json& stage : measured["stages"]) busy += stage["busy_ms"].get<double>();
  run.busy_ms = measured["stages"].empty() ? 0 : busy / measured["stages"].size();
  if (report.contains("iterations")) {
    for (const nlohmann::json& iteration : report["iterations"]) {
      run.iterations_s += iteration["wall_ms"].get<double>() / 1000;
    }
    CountEarlyWaits(report, run);
  }
  return run;
}

// The online arms' model (tiny_mlp).
constexpr char kOnlineModel[] = "online-mlp";

// The predicted bubble cycle of every stage, registered before the first run so fill jobs can
// be placed; pipetrain replaces it with the cycle it measures over its warm-up.
absl::StatusOr<std::vector<std::string>> Cycles(const Config& c) {
  PSWITCH_ASSIGN_OR_RETURN(pipeline::Schedule schedule,
                           pipeline::BuildSchedule(c.schedule, kStages, c.microbatches));
  std::vector<pipeline::StageCost> costs(kStages,
                                         {absl::Milliseconds(absl::GetFlag(FLAGS_fwd_ms)),
                                          absl::Milliseconds(absl::GetFlag(FLAGS_bwd_ms))});
  PSWITCH_ASSIGN_OR_RETURN(pipeline::SimulatedIteration sim, pipeline::Simulate(schedule, costs));
  std::vector<std::string> cycles;
  for (const pipeline::StageTimeline& stage : sim.stages) {
    nlohmann::json bubbles = nlohmann::json::array();
    for (const pipeline::IdleInterval& idle : stage.idle) {
      bubbles.push_back({{"offset_ns", absl::ToInt64Nanoseconds(idle.start)},
                         {"duration_ns", absl::ToInt64Nanoseconds(idle.duration)},
                         {"free_bytes", kFreeBytes}});
    }
    nlohmann::json cycle;
    cycle["period_ns"] = absl::ToInt64Nanoseconds(sim.iteration);
    cycle["bubbles"] = bubbles;
    cycles.push_back(cycle.dump());
  }
  return cycles;
}

// A pswitchd with one long synthetic fill job per device, waiting for the main job's bubbles.
class FillService {
 public:
  // Starts the daemon, its socket and log (named after `config`) in `dir`, which must outlive
  // the service, and connects to it.
  // `devices` (detect mode): the simulated devices whose activity it watches
  // (--detect-bubbles) instead of taking bubble calls.
  static absl::StatusOr<std::unique_ptr<FillService>> Start(const std::filesystem::path& dir,
                                                            const Config& config,
                                                            const std::string& devices = "") {
    std::vector<std::string> args{
        "--backend=" + absl::GetFlag(FLAGS_backend), "--listen=127.0.0.1:0",
        "--http-listen=127.0.0.1:0", absl::StrCat("--gpus=", kStages), "--standby-workers=1",
        "--preload=", "--arena-bytes=1073741824", "--activation-bytes=16777216",
        // Online arms: inference shares the simulated device.
        "--inference-device-lock",
        absl::StrCat("--fill-resident-runs=", absl::GetFlag(FLAGS_fill_resident_runs))};
    const std::string name = devices.empty() ? "" : "-detect";
    // Its sockets apart from the other daemon's (its Unix socket is named after this one's dir).
    const std::filesystem::path sockets = devices.empty() ? dir : dir / "detect";
    std::filesystem::create_directories(sockets);
    args.push_back("--socket=" + (sockets / "m.sock").string());
    if (!devices.empty()) {
      args.push_back("--detect-bubbles");
      args.push_back(absl::StrCat("--detected-bubble-free-bytes=", kFreeBytes));
      args.push_back(absl::StrCat("--detect-window-ms=", absl::GetFlag(FLAGS_detect_window_ms)));
      // The daemon (and its workers' fill steps) take the private devices.
      ::setenv("PSWITCH_HOST_DEVICE_DIR", devices.c_str(), 1);
    }
    auto daemon = std::make_unique<tools::PswitchdProcess>(
        tools::SiblingBinary("pswitchd"), args,
        (dir / absl::StrCat("pswitchd-", config.Name(), name, ".log")).string());
    if (!devices.empty()) ::unsetenv("PSWITCH_HOST_DEVICE_DIR");
    if (daemon->port() == 0) {
      return absl::UnavailableError(absl::StrCat("pswitchd did not start:\n", daemon->log()));
    }
    PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                             client::Client::Connect(daemon->address()));
    std::unique_ptr<FillService> service(new FillService(std::move(daemon), std::move(client)));
    return service;
  }

  // Registers `config`'s predicted cycles and submits the fill jobs.
  absl::Status Prepare(const Config& config) {
    PSWITCH_ASSIGN_OR_RETURN(std::vector<std::string> cycles, Cycles(config));
    for (int s = 0; s < kStages; ++s) {
      PSWITCH_RETURN_IF_ERROR(client_->RegisterBubbleCycle(s, cycles[s]));
    }
    // One long job per device (the scheduler spreads them); they outlive every run.
    for (int s = 0; s < kStages; ++s) {
      client::FillJobOptions o;
      o.kind = client::FillKind::kSynthetic;
      o.synthetic_step = absl::Milliseconds(absl::GetFlag(FLAGS_fill_step_ms));
      o.steps = 1u << 30;
      o.memory_bytes = 1 << 20;
      PSWITCH_RETURN_IF_ERROR(client_->SubmitFill(o).status());
    }
    return absl::OkStatus();
  }

  // The online arms' model, and one request's input for it (tiny_mlp takes [N, 64] floats).
  absl::Status RegisterOnlineModel() {
    client::RegisterOptions o;
    o.name = kOnlineModel;
    o.zoo_model = "tiny_mlp";
    return client_->Register(o).status();
  }

  client::Client& client() { return *client_; }
  std::string address() const { return daemon_->address(); }
  int http_port() const { return daemon_->http_port(); }

 private:
  FillService(std::unique_ptr<tools::PswitchdProcess> daemon,
              std::unique_ptr<client::Client> client)
      : daemon_(std::move(daemon)), client_(std::move(client)) {}

  // In this order so that the client's connection closes before the daemon is stopped.
  std::unique_ptr<tools::PswitchdProcess> daemon_;
  std::unique_ptr<client::Client> client_;
};

// Naive co-location: one unmanaged fill loop per device, stepping whenever it gets the device.
// flock() is not fair: a loop that re-locks at once can starve a stage for long stretches
// (iterations of 0.3-1.7 s instead of 0.1 s are seen; the arm's median is robust to them).
// --naive-gap-us leaves the device free for that long between steps, so that a waiting stage
// gets it next; the default 0 keeps the loop of the earlier figures.
class NaiveFill {
 public:
  NaiveFill() {
    for (int s = 0; s < kStages; ++s) {
      pid_t pid = ::fork();
      if (pid == 0) {
        auto lock = gpu::ComputeLock::Open(gpu::ComputeLock::DefaultPath(s));
        if (!lock.ok()) ::_exit(1);
        const absl::Duration step = absl::Milliseconds(absl::GetFlag(FLAGS_fill_step_ms));
        const absl::Duration gap = absl::Microseconds(absl::GetFlag(FLAGS_naive_gap_us));
        while (true) {
          {
            gpu::ComputeLock::Hold hold = lock->Acquire();
            absl::SleepFor(step);
          }
          if (gap > absl::ZeroDuration()) absl::SleepFor(gap);
        }
      }
      pids_.push_back(pid);
    }
  }
  ~NaiveFill() {
    for (pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  NaiveFill(const NaiveFill&) = delete;
  NaiveFill& operator=(const NaiveFill&) = delete;

 private:
  std::vector<pid_t> pids_;
};

proto::HostTensor OnlineInput() {
  proto::HostTensor t;
  t.name = "input";
  t.shape = {1, 64};
  t.data.resize(64 * sizeof(float));
  for (size_t i = 0; i < 64; ++i) {
    const float v = static_cast<float>(i) / 64;
    std::memcpy(t.data.data() + i * sizeof(float), &v, sizeof(v));
  }
  return t;
}

// One online arm's requests: the served ones' latencies (arrival at the client to answer), and
// those refused (their objective could not be met) or failed otherwise.
struct OnlineRun {
  std::vector<double> latency_ms;
  int refused = 0;
  int failed = 0;
  std::string first_error;
};

// When an online arm sends requests, from its load's construction.
struct Window {
  absl::Duration start;
  absl::Duration length;
};

// Poisson arrivals of inference requests at `rate` per second over `window`, each sent (and
// waited for) on its own thread; with an objective (`slo`), online fill work.
class OnlineLoad {
 public:
  OnlineLoad(client::Client& client, double rate, std::optional<absl::Duration> slo, uint64_t seed,
             Window window)
      : client_(client), slo_(slo), input_(OnlineInput()), arrivals_([this, rate, seed, window] {
          std::mt19937_64 random(seed);
          std::exponential_distribution<double> gap(rate);
          absl::Time next = absl::Now() + window.start;
          const absl::Time end = next + window.length;
          while (true) {
            next += absl::Seconds(gap(random));
            if (next >= end) return;
            {
              absl::MutexLock lock(&mu_);
              auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
              if (mu_.AwaitWithDeadline(absl::Condition(&stopping), next)) return;
            }
            requests_.emplace_back([this] { Send(); });
          }
        }) {}
  ~OnlineLoad() { (void)Finish(); }
  OnlineLoad(const OnlineLoad&) = delete;
  OnlineLoad& operator=(const OnlineLoad&) = delete;

  // Stops the arrivals and waits for every answer.
  OnlineRun Finish() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (arrivals_.joinable()) arrivals_.join();
    for (std::thread& t : requests_) t.join();
    requests_.clear();
    absl::MutexLock lock(&mu_);
    return run_;
  }

 private:
  void Send() {
    client::InferOptions options;
    if (slo_) options.online_slo = *slo_;
    const absl::Time start = absl::Now();
    absl::StatusOr<client::TaskResult> result = client_.Infer(kOnlineModel, {input_}, options);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    absl::MutexLock lock(&mu_);
    if (result.ok()) {
      run_.latency_ms.push_back(ms);
    } else if (absl::IsDeadlineExceeded(result.status())) {
      ++run_.refused;
    } else {
      if (run_.failed++ == 0) run_.first_error = result.status().ToString();
    }
  }

  client::Client& client_;
  const std::optional<absl::Duration> slo_;
  const proto::HostTensor input_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  OnlineRun run_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> requests_;  // the arrivals thread's until Finish joins it
  std::thread arrivals_;               // last: it uses every member above
};

// What the daemon saw during one fill run.
struct FillRun {
  double used = 0;         // fill step time / bubble time
  double steps_per_s = 0;  // fill steps per second of the main job's iterations
};

// One detected run against the main job's own measure of its bubbles (its stages' idle time).
struct DetectedRun {
  double used = 0;  // fill step time / the job's bubble time, learning iterations included
  tools::DetectionTotals score;  // the bubbles found against the job's own
  // Fill step time / the job's bubble time from each device's first given bubble on.
  double used_learnt = 0;
};

// The job's own bubbles from its --bubble-log, by stage (= device).
absl::StatusOr<std::vector<std::vector<tools::TimeInterval>>> ReadTruth(
    const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no bubble log at ", path.string()));
  std::vector<std::vector<tools::TimeInterval>> truth(kStages);
  int stage = 0;
  int64_t begin_ns = 0, end_ns = 0;
  while (in >> stage >> begin_ns >> end_ns) {
    if (stage < 0 || stage >= kStages || end_ns < begin_ns) {
      return absl::DataLossError(absl::StrCat("bad line in ", path.string()));
    }
    truth[stage].push_back({begin_ns, end_ns});
  }
  for (auto& t : truth) {
    std::sort(t.begin(), t.end(), [](const tools::TimeInterval& a, const tools::TimeInterval& b) {
      return a.begin_ns < b.begin_ns;
    });
  }
  return truth;
}

// The bubbles the daemon found since `from_ns`, from its trace's "detected" track (GET
// /v1/trace on its HTTP port), by GPU.
absl::StatusOr<std::vector<std::vector<tools::FoundBubble>>> FetchFound(int http_port,
                                                                        int64_t from_ns) {
  httplib::Client http("127.0.0.1", http_port);
  http.set_read_timeout(30, 0);
  // The trace keeps the last 600 s (and its newest events): a longer run would lose its first
  // bubbles and score worse than it is.
  const int64_t seconds = (base::MonotonicNowNs() - from_ns) / 1'000'000'000 + 2;
  if (seconds > 600) {
    return absl::OutOfRangeError("a detected run over 598 s: its trace no longer holds it all");
  }
  auto r = http.Get(absl::StrCat("/v1/trace?seconds=", seconds));
  if (!r) return absl::UnavailableError("GET /v1/trace: no answer");
  if (r->status != 200) {
    return absl::UnavailableError(absl::StrCat("GET /v1/trace: HTTP ", r->status, ": ", r->body));
  }
  const nlohmann::json trace = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (!trace.is_object() || !trace.contains("otherData") || !trace["otherData"].is_object() ||
      !trace["otherData"].contains("origin_ns") || !trace["otherData"]["origin_ns"].is_number() ||
      !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    return absl::DataLossError("GET /v1/trace: not a trace with its clock's origin");
  }
  const double origin_ns = trace["otherData"]["origin_ns"].get<double>();
  std::vector<std::vector<tools::FoundBubble>> found(kStages);
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (!e.is_object() || e.value("cat", "") != "detected" || e.value("ph", "") != "X") continue;
    const int gpu = e.value("pid", -1);
    if (gpu < 0 || gpu >= kStages || !e.contains("args") || !e["args"].is_object()) continue;
    double announced_ms = 0, expected_ms = 0;
    if (!absl::SimpleAtod(e["args"].value("announced_ms", ""), &announced_ms) ||
        !absl::SimpleAtod(e["args"].value("expected_ms", ""), &expected_ms)) {
      return absl::DataLossError("GET /v1/trace: a detected bubble without its times");
    }
    const double began = origin_ns + e.value("ts", 0.0) * 1e3;
    if (began < static_cast<double>(from_ns)) continue;
    found[gpu].push_back({std::llround(began), std::llround(began + announced_ms * 1e6),
                          std::llround(began + expected_ms * 1e6),
                          std::llround(began + e.value("dur", 0.0) * 1e3)});
  }
  return found;
}

// All of one configuration's runs, indexed by round.
struct ConfigRuns {
  Config config;
  std::map<Arm, std::vector<MainJobRun>> runs;
  std::vector<FillRun> fill;  // the fill arm's runs
  std::vector<DetectedRun> detected;  // the detected arm's runs
  std::map<Arm, std::vector<OnlineRun>> online;  // the online arms' requests, by round
  double pause_p50_ms = 0, pause_p99_ms = 0;
  uint64_t killed = 0;
  uint64_t fill_runs = 0, bell_wakes = 0;  // how bubbles were started: Run messages, bells
};

// The arms' order in round `round`: a Williams design, i.e. a Latin square in which every arm
// follows every other arm equally often (with its mirror image when the number of arms is odd,
// 2n rounds in all), so that neither an arm's position in the round nor the arm run just before
// it biases a comparison. (A plain rotation keeps each arm's predecessor fixed.)
std::vector<Arm> RoundOrder(const std::vector<Arm>& arms, int round) {
  const int n = static_cast<int>(arms.size());
  std::vector<int> first;  // 0, 1, n-1, 2, n-2, ...
  for (int i = 0, low = 1, high = n - 1; i < n; ++i) {
    first.push_back(i == 0 ? 0 : i % 2 == 1 ? low++ : high--);
  }
  const int r = round % (n % 2 == 0 ? n : 2 * n);
  std::vector<Arm> order;
  for (int i = 0; i < n; ++i) order.push_back(arms[(first[i] + r % n) % n]);
  if (r >= n) std::reverse(order.begin(), order.end());
  return order;
}

// `detect` and `devices`: the detected arm's daemon and simulated devices (null, "": no arm).
// When the online arms send requests: while a run's measured iterations go on (its start-up and
// end told from the configuration's earlier runs, or guessed before the first), so that every
// request meets a main job that runs and the arms compare like with like.
Window OnlineWindow(const ConfigRuns& out, const Config& c, int iterations) {
  // Before any run: a generous start-up either way.
  double earliest_s = 1.0, latest_s = 3.0, iteration_s = 0.1;
  if (absl::StatusOr<pipeline::Schedule> schedule =
          pipeline::BuildSchedule(c.schedule, kStages, c.microbatches);
      schedule.ok()) {
    std::vector<pipeline::StageCost> costs(kStages,
                                           {absl::Milliseconds(absl::GetFlag(FLAGS_fwd_ms)),
                                            absl::Milliseconds(absl::GetFlag(FLAGS_bwd_ms))});
    if (auto sim = pipeline::Simulate(*schedule, costs); sim.ok()) {
      iteration_s = absl::ToDoubleSeconds(sim->iteration);
    }
  }
  // The start-ups of this configuration's runs so far (any arm's: the job's own, whatever runs
  // beside it; a run's wall time less its iterations, so its exit counts too).
  bool seen = false;
  for (const auto& [arm, runs] : out.runs) {
    for (const MainJobRun& run : runs) {
      const double startup = std::max(0.0, run.wall_s - run.iterations_s);
      earliest_s = seen ? std::min(earliest_s, startup) : startup;
      latest_s = seen ? std::max(latest_s, startup) : startup;
      seen = true;
    }
  }
  auto alone = out.runs.find(Arm::kAlone);
  if (alone != out.runs.end() && !alone->second.empty()) {
    iteration_s = alone->second.back().iteration_ms / 1000;
  }
  const int warmup = absl::GetFlag(FLAGS_warmup);
  // From the latest start-up and an iteration's slack, to the earliest end less two
  // iterations and the objective: every request meets a running job for as long as its
  // objective lasts, however this run's start-up falls.
  const double from_s = latest_s + (warmup + 1) * iteration_s;
  const double to_s = earliest_s + (warmup + iterations - 2) * iteration_s -
                      absl::GetFlag(FLAGS_online_slo_ms) / 1000;
  if (to_s - from_s < iteration_s) {
    // Runs too short (or start-ups too uneven) for that: the last iteration before the end,
    // which a request may outlive.
    return {absl::Seconds(std::max(0.0, to_s - iteration_s)), absl::Seconds(iteration_s)};
  }
  return {absl::Seconds(from_s), absl::Seconds(to_s - from_s)};
}

// `online_rates`: the online arms' (low, high) arrival rates.
absl::StatusOr<ConfigRuns> RunConfig(const Config& c, const std::vector<Arm>& arms, int repeats,
                                     int iterations, FillService& service,
                                     const std::filesystem::path& dir, FillService* detect,
                                     const std::string& devices,
                                     std::pair<double, double> online_rates) {
  ConfigRuns out{c};
  PSWITCH_RETURN_IF_ERROR(service.Prepare(c));
  if (std::any_of(arms.begin(), arms.end(), IsOnline)) {
    PSWITCH_RETURN_IF_ERROR(service.RegisterOnlineModel());
  }
  if (detect != nullptr) PSWITCH_RETURN_IF_ERROR(detect->Prepare(c));
  for (int round = 0; round < repeats; ++round) {
    std::fprintf(stderr, "%s round %d/%d:", c.Name().c_str(), round + 1, repeats);
    for (const Arm arm : RoundOrder(arms, round)) {
      std::fprintf(stderr, " %s", ArmName(arm));
      absl::StatusOr<MainJobRun> run;
      if (arm == Arm::kNaive) {
        NaiveFill naive;
        run = RunPipetrain(c, iterations, arm, "", dir);
      } else if (arm == Arm::kFill) {
        PSWITCH_ASSIGN_OR_RETURN(client::FillServerStats before, service.client().FillStats());
        run = RunPipetrain(c, iterations, arm, service.address(), dir);
        PSWITCH_ASSIGN_OR_RETURN(client::FillServerStats after, service.client().FillStats());
        if (run.ok()) {
          const absl::Duration bubble = after.bubble_time - before.bubble_time;
          const absl::Duration used = after.fill_step_time - before.fill_step_time;
          out.fill.push_back({bubble > absl::ZeroDuration() ? absl::FDivDuration(used, bubble) : 0,
                              static_cast<double>(after.steps - before.steps) /
                                  std::max(run->iterations_s, 1e-3)});
        }
      } else if (arm == Arm::kDetected) {
        PSWITCH_ASSIGN_OR_RETURN(client::FillServerStats before, detect->client().FillStats());
        std::filesystem::remove(dir / kTruthLog);
        const int64_t from_ns = base::MonotonicNowNs();
        run = RunPipetrain(c, iterations, arm, "", dir, devices);
        PSWITCH_ASSIGN_OR_RETURN(client::FillServerStats after, detect->client().FillStats());
        if (run.ok()) {
          // The job's bubble time over the whole run (warm-up included: the daemon watched it
          // too), from its own measure.
          const double truth_s = kStages * run->bubble_ratio * run->iterations_s;
          const double used_s = absl::ToDoubleSeconds(after.fill_step_time - before.fill_step_time);
          PSWITCH_ASSIGN_OR_RETURN(auto truth, ReadTruth(dir / kTruthLog));
          PSWITCH_ASSIGN_OR_RETURN(auto found, FetchFound(detect->http_port(), from_ns));
          tools::DetectionTotals score = tools::ScoreDetection(truth, found, from_ns);
          const double learnt_s = static_cast<double>(score.learnt_truth_ns) / 1e9;
          out.detected.push_back({truth_s > 0 ? used_s / truth_s : 0, std::move(score),
                                  learnt_s > 0 ? used_s / learnt_s : 0});
        }
      } else if (IsOnline(arm)) {
        const double rate = HighRate(arm) ? online_rates.second : online_rates.first;
        std::optional<absl::Duration> slo;
        if (arm == Arm::kOnlineLow || arm == Arm::kOnlineHigh) {
          slo = absl::Milliseconds(absl::GetFlag(FLAGS_online_slo_ms));
        }
        // The same arrivals for a rate's three arms in a round, while the main job iterates.
        const Window window = OnlineWindow(out, c, iterations);
        OnlineLoad load(service.client(), rate, slo, 1000 * round + (HighRate(arm) ? 1 : 0),
                        window);
        if (IsIdle(arm)) {
          absl::SleepFor(window.start + window.length);
        } else {
          run = RunPipetrain(c, iterations, arm, service.address(), dir);
        }
        OnlineRun requests = load.Finish();
        if (requests.failed > 0) {
          return absl::InternalError(absl::StrCat(ArmName(arm), ": ", requests.failed,
                                                  " requests failed: ", requests.first_error));
        }
        std::fprintf(stderr, " (p95 %.1f ms, %d refused)",
                     tools::Percentile(requests.latency_ms, 95).value_or(0), requests.refused);
        out.online[arm].push_back(std::move(requests));
        if (IsIdle(arm)) continue;
      } else {
        run = RunPipetrain(c, iterations, arm, service.address(), dir);
      }
      PSWITCH_RETURN_IF_ERROR(run.status());
      std::fprintf(stderr, " %.2f", run->iteration_ms);
      out.runs[arm].push_back(*run);
    }
    std::fprintf(stderr, "\n");
  }
  PSWITCH_ASSIGN_OR_RETURN(client::FillServerStats stats, service.client().FillStats());
  out.pause_p50_ms = absl::ToDoubleMilliseconds(stats.pause_p50);
  out.pause_p99_ms = absl::ToDoubleMilliseconds(stats.pause_p99);
  out.killed = stats.killed;
  out.fill_runs = stats.runs;
  out.bell_wakes = stats.bell_wakes;
  return out;
}

// An arm's increase over its rounds' alone runs.
struct Increase {
  tools::MedianInterval interval;  // of the relative increases (0.01 = 1 %)
  double busy_ms = 0;              // median paired increase of stage busy time per iteration
};

absl::StatusOr<Increase> IncreaseOver(const ConfigRuns& r, Arm arm) {
  std::vector<double> base, treated, busy;
  const std::vector<MainJobRun>& alone = r.runs.at(Arm::kAlone);
  const std::vector<MainJobRun>& other = r.runs.at(arm);
  for (size_t i = 0; i < alone.size() && i < other.size(); ++i) {
    base.push_back(alone[i].iteration_ms);
    treated.push_back(other[i].iteration_ms);
    busy.push_back(other[i].busy_ms - alone[i].busy_ms);
  }
  PSWITCH_ASSIGN_OR_RETURN(std::vector<double> increases,
                           tools::PairedRelativeIncreases(base, treated));
  Increase out;
  PSWITCH_ASSIGN_OR_RETURN(out.interval, tools::MedianConfidenceInterval(increases, kLevel));
  PSWITCH_ASSIGN_OR_RETURN(out.busy_ms, tools::Median(busy));
  return out;
}

std::string Pct(double x) { return absl::StrFormat("%+.2f%%", 100 * x); }

// "+0.40% [95% -0.20, +1.10]"; the label is the interval's real coverage when short of 95 %.
std::string WithInterval(const tools::MedianInterval& i) {
  const int level =
      i.reaches_level ? static_cast<int>(kLevel * 100) : static_cast<int>(i.coverage * 100);
  return absl::StrFormat("%+.2f%% [%d%% %+.2f, %+.2f]", 100 * i.median, level, 100 * i.low,
                         100 * i.high);
}

double MedianOf(const std::vector<double>& v) {
  absl::StatusOr<double> m = tools::Median(v);
  return m.ok() ? *m : 0;
}

// "12% of 40, <= 0.15 ms": the early-ending fillable waits of `runs` (see MainJobRun).
std::string EarlyWaits(const std::vector<MainJobRun>& runs) {
  int fillable = 0, early = 0, stage_iterations = 0;
  double early_ms = 0;
  for (const MainJobRun& run : runs) {
    fillable += run.fillable_waits;
    early += run.early_waits;
    early_ms += run.early_ms;
    stage_iterations += run.stage_iterations;
  }
  if (fillable == 0 || stage_iterations == 0) return "-";
  return absl::StrFormat("%.0f%% of %d, <= %.2f ms", 100.0 * early / fillable, fillable,
                         early_ms / stage_iterations);
}

// A latency percentile of `runs` pooled, a refused request counting as infinitely late (it was
// not served within its objective).
double PooledPercentile(const std::vector<OnlineRun>& runs, double p) {
  std::vector<double> all;
  for (const OnlineRun& r : runs) {
    all.insert(all.end(), r.latency_ms.begin(), r.latency_ms.end());
    all.insert(all.end(), static_cast<size_t>(r.refused), std::numeric_limits<double>::infinity());
  }
  if (all.empty()) return 0;
  // Nearest rank: no interpolation towards an infinite neighbour.
  std::sort(all.begin(), all.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100 * static_cast<double>(all.size())));
  return all[std::clamp<size_t>(rank, 1, all.size()) - 1];
}

absl::Status ReportOnline(const std::vector<ConfigRuns>& all, std::vector<std::string>& figs) {
  const double max_increase = absl::GetFlag(FLAGS_target_increase_pct) / 100;
  const double max_ratio = absl::GetFlag(FLAGS_target_online_p95_ratio);
  std::printf(
      "\nonline fill: Poisson arrivals of tiny_mlp inference requests (batch 1), the same "
      "arrivals in a rate's three arms of a round; objective %.0f ms; latency = the client's, "
      "arrival to answer (ms, every round's requests pooled; a refused request counts as "
      "infinitely late); I = the main job's increase over its round's alone run\n",
      absl::GetFlag(FLAGS_online_slo_ms));
  std::printf("%-8s %-13s %8s %8s %8s %8s %9s  %-27s\n", "config", "arm", "requests", "p50", "p95",
              "p99", "refused", "I");
  for (const ConfigRuns& r : all) {
    if (r.online.empty()) continue;
    for (const bool high : {false, true}) {
      const Arm online = high ? Arm::kOnlineHigh : Arm::kOnlineLow;
      const Arm co_exec = high ? Arm::kCoExecHigh : Arm::kCoExecLow;
      const Arm idle = high ? Arm::kIdleHigh : Arm::kIdleLow;
      std::map<Arm, Increase> increase;
      for (const Arm arm : {online, co_exec, idle}) {
        const std::vector<OnlineRun>& runs = r.online.at(arm);
        size_t requests = 0;
        int refused = 0;
        for (const OnlineRun& run : runs) {
          requests += run.latency_ms.size() + static_cast<size_t>(run.refused);
          refused += run.refused;
        }
        std::string inc = "-";
        if (!IsIdle(arm)) {
          PSWITCH_ASSIGN_OR_RETURN(increase[arm], IncreaseOver(r, arm));
          inc = WithInterval(increase[arm].interval);
        }
        std::printf("%-8s %-13s %8zu %8.2f %8.2f %8.2f %9d  %-27s\n", r.config.Name().c_str(),
                    ArmName(arm), requests, PooledPercentile(runs, 50), PooledPercentile(runs, 95),
                    PooledPercentile(runs, 99), refused, inc.c_str());
      }
      const double p95 = PooledPercentile(r.online.at(online), 95);
      const double co_p95 = PooledPercentile(r.online.at(co_exec), 95);
      const double ratio = co_p95 > 0 ? p95 / co_p95 : std::numeric_limits<double>::infinity();
      const tools::MedianInterval& i = increase[online].interval;
      const bool met = ratio <= max_ratio && i.reaches_level && i.high <= max_increase;
      std::printf("%-8s %-13s p95 online / co-exec = %.2f (target <= %.2f), main job %s: %s\n",
                  r.config.Name().c_str(), high ? "high rate" : "low rate", ratio, max_ratio,
                  WithInterval(i).c_str(), met ? "met" : "not met");
      figs.push_back(absl::StrFormat(
          "FIG bubbles-online %s %s: p95 %.2f ms (co-exec %.2f ms, idle %.2f ms) ratio %.2f, "
          "p99 %.2f ms, main job %s (co-exec %s) verdict %s (target p95 ratio <= %.2f with "
          "<= %.1f%%)",
          r.config.Name(), high ? "high" : "low", p95, co_p95,
          PooledPercentile(r.online.at(idle), 95), ratio, PooledPercentile(r.online.at(online), 99),
          WithInterval(i), WithInterval(increase[co_exec].interval), met ? "met" : "not-met",
          max_ratio, 100 * max_increase));
    }
  }
  return absl::OkStatus();
}

absl::Status Report(const std::vector<ConfigRuns>& all, const std::vector<Arm>& arms, int repeats,
                    int iterations, const std::vector<double>& call_us) {
  const double target = absl::GetFlag(FLAGS_target_increase_pct) / 100;
  const double min_used = absl::GetFlag(FLAGS_target_used_pct) / 100;
  auto uses = [&](Arm a) { return std::find(arms.begin(), arms.end(), a) != arms.end(); };
  const std::string device = absl::GetFlag(FLAGS_device);
  const std::string compute =
      device.empty() ? absl::StrFormat(
                           "simulated compute fwd %.1f ms / bwd %.1f ms per micro-batch on "
                           "host-simulated devices",
                           absl::GetFlag(FLAGS_fwd_ms), absl::GetFlag(FLAGS_bwd_ms))
                     : absl::StrCat("real GPT-2 compute on ", device);
  std::printf(
      "bench-bubbles: pipetrain, %d stages, %s; fill steps %.1f ms; %d measured iterations per "
      "run; %d rounds per configuration, each running %zu arms (and the online arms, 6 more, in "
      "the --online-configs) in a balanced order\n",
      kStages, compute.c_str(), absl::GetFlag(FLAGS_fill_step_ms), iterations, repeats,
      arms.size());
  if (!call_us.empty()) {
    std::printf("bubble instruction: one call costs p50 %.1f us, p99 %.1f us (client-side)\n",
                *tools::Percentile(call_us, 50), *tools::Percentile(call_us, 99));
  }
  std::printf(
      "I: median over rounds of T_arm / T_alone - 1 (each run paired with its round's alone "
      "run) [distribution-free %d%% interval for that median]\n",
      static_cast<int>(kLevel * 100));
  std::printf("%-8s %9s %-27s %-27s %-27s %8s %7s %6s %7s %15s  %s\n", "config", "T alone",
              "I fill", "I alone-again (A/A)", "I cpu-only", "I naive", "bubbles", "used",
              "steps/s", "pause p50/p99", "verdict");
  std::vector<std::string> diagnostics, figs;
  uint64_t killed = 0;  // each configuration has its own daemon
  for (const ConfigRuns& r : all) killed += r.killed;
  for (const ConfigRuns& r : all) {
    std::vector<double> alone_ms, ratio, busy, used, steps;
    for (const MainJobRun& run : r.runs.at(Arm::kAlone)) {
      alone_ms.push_back(run.iteration_ms);
      ratio.push_back(run.bubble_ratio);
      busy.push_back(run.busy_ms);
    }
    for (const FillRun& f : r.fill) {
      used.push_back(f.used);
      steps.push_back(f.steps_per_s);
    }
    PSWITCH_ASSIGN_OR_RETURN(Increase fill, IncreaseOver(r, Arm::kFill));
    PSWITCH_ASSIGN_OR_RETURN(Increase aa, IncreaseOver(r, Arm::kAloneAgain));
    std::optional<Increase> cpu, naive;
    if (uses(Arm::kCpuOnly)) {
      PSWITCH_ASSIGN_OR_RETURN(cpu, IncreaseOver(r, Arm::kCpuOnly));
    }
    if (uses(Arm::kNaive)) {
      PSWITCH_ASSIGN_OR_RETURN(naive, IncreaseOver(r, Arm::kNaive));
    }
    const double used_median = MedianOf(used);
    const tools::Verdict verdict =
        tools::JudgeIncreaseTarget(fill.interval, target, used_median, min_used);
    const std::string name = r.config.Name();
    std::printf("%-8s %7.2fms %-27s %-27s %-27s %8s %6.1f%% %5.1f%% %7.0f %6.2f/%-5.2f ms  %s\n",
                name.c_str(), MedianOf(alone_ms), WithInterval(fill.interval).c_str(),
                WithInterval(aa.interval).c_str(), cpu ? WithInterval(cpu->interval).c_str() : "-",
                naive ? Pct(naive->interval.median).c_str() : "-", 100 * MedianOf(ratio),
                100 * used_median, MedianOf(steps), r.pause_p50_ms, r.pause_p99_ms,
                tools::VerdictName(verdict));
    diagnostics.push_back(
        absl::StrFormat("%-8s %10.2f %10.3f %10s %10s   %-24s %-24s", name, MedianOf(busy),
                        fill.busy_ms, cpu ? absl::StrFormat("%.3f", cpu->busy_ms) : "-",
                        naive ? absl::StrFormat("%.3f", naive->busy_ms) : "-",
                        EarlyWaits(r.runs.at(Arm::kAlone)), EarlyWaits(r.runs.at(Arm::kFill))));
    // One machine-readable line per configuration (validation scripts collect "FIG " lines).
    std::string extra = absl::StrCat("A/A ", WithInterval(aa.interval));
    if (cpu) absl::StrAppend(&extra, ", cpu-only ", WithInterval(cpu->interval));
    if (naive) absl::StrAppend(&extra, ", naive ", Pct(naive->interval.median));
    absl::StrAppend(&extra, absl::StrFormat(", device wait %+.2f ms/stage-iteration, n=%d",
                                            fill.busy_ms - (cpu ? cpu->busy_ms : 0),
                                            static_cast<int>(alone_ms.size())));
    absl::StrAppend(&extra, absl::StrFormat(", runs started %llu, bells rung %llu",
                                            static_cast<unsigned long long>(r.fill_runs),
                                            static_cast<unsigned long long>(r.bell_wakes)));
    figs.push_back(absl::StrFormat(
        "FIG bubbles %s: increase %s used %.0f%% steps/s %.0f pause p50 %.2f ms p99 %.2f ms "
        "verdict %s (%s)",
        name, WithInterval(fill.interval), 100 * used_median, MedianOf(steps), r.pause_p50_ms,
        r.pause_p99_ms, tools::VerdictName(verdict), extra));
  }
  std::printf(
      "target: increase <= %.1f%% (the interval's upper end) with >= %.0f%% of bubble time used; "
      "killed fill tasks: %llu\n",
      100 * target, 100 * min_used, static_cast<unsigned long long>(killed));
  if (uses(Arm::kDetected)) {
    // Bubbles found without the job's calls: shares of the job's own idle time (its stages'
    // waits, warm-up included), not of what a daemon was told.
    const double detected_target = absl::GetFlag(FLAGS_target_detected_increase_pct) / 100;
    const double detected_used = absl::GetFlag(FLAGS_target_detected_used_pct) / 100;
    std::printf(
        "\ndetected: the job makes no bubble call; a pswitchd --detect-bubbles finds its bubbles "
        "from its devices' activity over %d more warm-up iterations (not measured). used = fill "
        "step time over the job's own idle time in the whole run, those iterations included; "
        "once learnt: over its idle time from each device's first given bubble on (the "
        "verdict is on the whole run)\n",
        kDetectionWarmup);
    std::printf("%-8s %-27s %7s %13s  %s\n", "config", "I detected", "used", "once learnt",
                "verdict");
    for (const ConfigRuns& r : all) {
      PSWITCH_ASSIGN_OR_RETURN(Increase detected, IncreaseOver(r, Arm::kDetected));
      std::vector<double> used, used_learnt;
      for (const DetectedRun& d : r.detected) {
        used.push_back(d.used);
        used_learnt.push_back(d.used_learnt);
      }
      const tools::Verdict verdict = tools::JudgeIncreaseTarget(detected.interval, detected_target,
                                                                MedianOf(used), detected_used);
      std::printf("%-8s %-27s %6.1f%% %12.1f%%  %s\n", r.config.Name().c_str(),
                  WithInterval(detected.interval).c_str(), 100 * MedianOf(used),
                  100 * MedianOf(used_learnt), tools::VerdictName(verdict));
      figs.push_back(absl::StrFormat(
          "FIG bubbles-detected %s: increase %s used %.0f%% (learning included; %.0f%% once "
          "learnt) verdict %s (target <= %.1f%% with >= %.0f%% used)",
          r.config.Name(), WithInterval(detected.interval), 100 * MedianOf(used),
          100 * MedianOf(used_learnt), tools::VerdictName(verdict), 100 * detected_target,
          100 * detected_used));
    }
    std::printf(
        "\ndetection against the job's own bubbles (its --bubble-log), every round pooled: "
        "found = idle stretches the detector announced, from their first empty window to the "
        "job's next activity; given = announcement to the end it was given; precision = share "
        "inside the job's bubbles; recall = share of the job's bubble time (learning included); "
        "learnt R = given recall from each device's first given bubble on; delay = announcement "
        "after the true bubble's start\n");
    std::printf("%-8s %9s %9s %9s %9s %10s %11s %11s %8s\n", "config", "found P", "found R",
                "given P", "given R", "learnt R", "delay p50", "delay p95", "bubbles");
    for (const ConfigRuns& r : all) {
      tools::DetectionTotals t;
      for (const DetectedRun& d : r.detected) t.Add(d.score);
      const double p50 = tools::Percentile(t.delay_ms, 50).value_or(0);
      const double p95 = tools::Percentile(t.delay_ms, 95).value_or(0);
      std::printf("%-8s %8.1f%% %8.1f%% %8.1f%% %8.1f%% %9.1f%% %8.2f ms %8.2f ms %8zu\n",
                  r.config.Name().c_str(), 100 * t.FoundPrecision(), 100 * t.FoundRecall(),
                  100 * t.GivenPrecision(), 100 * t.GivenRecall(), 100 * t.LearntRecall(), p50, p95,
                  t.delay_ms.size());
      figs.push_back(absl::StrFormat(
          "FIG bubbles-detection %s: found precision %.1f%% recall %.1f%%, given precision "
          "%.1f%% recall %.1f%% (%.1f%% once learnt), delay p50 %.2f ms p95 %.2f ms",
          r.config.Name(), 100 * t.FoundPrecision(), 100 * t.FoundRecall(),
          100 * t.GivenPrecision(), 100 * t.GivenRecall(), 100 * t.LearntRecall(), p50, p95));
    }
  }
  if (std::any_of(all.begin(), all.end(), [](const ConfigRuns& r) { return !r.online.empty(); })) {
    PSWITCH_RETURN_IF_ERROR(ReportOnline(all, figs));
  }
  std::printf(
      "\ndiagnostics: busy = a stage's compute time per iteration including waits for its device "
      "(ms, median over alone runs); busy+ = paired median increase over alone (fill - cpu-only "
      "= waits for a device a fill step still held); early ends = fillable waits (announced > "
      "one step + %.1f ms margin) that ended before announced - margin, with an upper bound on "
      "the device wait they allow per stage-iteration\n",
      kGateMarginMs);
  std::printf("%-8s %10s %10s %10s %10s   %-24s %-24s\n", "config", "busy", "busy+ fill",
              "busy+ cpu", "busy+ naive", "early ends (alone)", "early ends (fill)");
  for (const std::string& line : diagnostics) std::printf("%s\n", line.c_str());
  std::printf("\n");
  for (const std::string& line : figs) std::printf("%s\n", line.c_str());
  return absl::OkStatus();
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "bench-bubbles: %s\n", status.ToString().c_str());
  return 1;
}

int Main() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int iterations = quick ? 4 : absl::GetFlag(FLAGS_iterations);
  const int repeats = absl::GetFlag(FLAGS_repeats) != 0 ? absl::GetFlag(FLAGS_repeats)
                      : quick                           ? 6
                                                        : 10;
  if (iterations < 1 || repeats < 1) {
    return Fail(absl::InvalidArgumentError("--iterations and --repeats must be >= 1"));
  }
  absl::StatusOr<std::vector<Config>> configs = ParseConfigs(absl::GetFlag(FLAGS_configs));
  if (!configs.ok()) return Fail(configs.status());
  std::vector<Arm> arms = {Arm::kAlone, Arm::kFill, Arm::kAloneAgain};
  const bool host_lock_arms = absl::GetFlag(FLAGS_device).empty();
  if (host_lock_arms && absl::GetFlag(FLAGS_cpu_only_arm)) arms.push_back(Arm::kCpuOnly);
  if (host_lock_arms) arms.push_back(Arm::kNaive);
  if (host_lock_arms && absl::GetFlag(FLAGS_detected_arm)) arms.push_back(Arm::kDetected);
  std::pair<double, double> online_rates;
  std::vector<Arm> online_arms;
  if (const std::string rates = absl::GetFlag(FLAGS_online_rates); !rates.empty()) {
    std::vector<std::string> parts = absl::StrSplit(rates, ',');
    if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &online_rates.first) ||
        !absl::SimpleAtod(parts[1], &online_rates.second) || !(online_rates.first > 0) ||
        !(online_rates.second > 0) || online_rates.first > 1000 || online_rates.second > 1000) {
      return Fail(absl::InvalidArgumentError(
          "--online-rates must be two arrival rates in (0, 1000] per second: LOW,HIGH"));
    }
    if (!host_lock_arms) {
      return Fail(absl::InvalidArgumentError(
          "the online arms need the host's simulated devices (leave --device out, or "
          "--online-rates=)"));
    }
    online_arms = {Arm::kOnlineLow,  Arm::kCoExecLow,  Arm::kIdleLow,
                   Arm::kOnlineHigh, Arm::kCoExecHigh, Arm::kIdleHigh};
  }
  absl::StatusOr<std::vector<Config>> online_configs =
      ParseConfigs(absl::GetFlag(FLAGS_online_configs));
  if (!online_configs.ok()) return Fail(online_configs.status());

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("bench-bubbles-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);

  std::vector<double> call_us;
  std::vector<ConfigRuns> all;
  for (const Config& c : *configs) {
    std::fprintf(stderr, "%s: starting pswitchd (%d simulated devices)...\n", c.Name().c_str(),
                 kStages);
    absl::StatusOr<std::unique_ptr<FillService>> service = FillService::Start(dir, c);
    if (!service.ok()) return Fail(service.status());
    if (call_us.empty()) {
      // The bubble instruction's cost to the main job: one call, measured client-side (no
      // cycle is registered yet, so the server only records the bubble).
      for (int i = 0; i < 2000; ++i) {
        absl::Time t0 = absl::Now();
        (void)(*service)->client().BubbleBegin(3, absl::Milliseconds(1), kFreeBytes);
        absl::Time t1 = absl::Now();
        (void)(*service)->client().BubbleEnd(3);
        call_us.push_back(absl::ToDoubleMicroseconds(t1 - t0));
        call_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t1));
      }
    }
    std::unique_ptr<FillService> detect;
    const std::string devices = (dir / "detect-devices").string();
    if (std::find(arms.begin(), arms.end(), Arm::kDetected) != arms.end()) {
      std::filesystem::create_directories(devices);
      absl::StatusOr<std::unique_ptr<FillService>> started = FillService::Start(dir, c, devices);
      if (!started.ok()) return Fail(started.status());
      detect = std::move(*started);
    }
    std::vector<Arm> config_arms = arms;
    if (std::any_of(online_configs->begin(), online_configs->end(),
                    [&c](const Config& o) { return o.Name() == c.Name(); })) {
      config_arms.insert(config_arms.end(), online_arms.begin(), online_arms.end());
    }
    absl::StatusOr<ConfigRuns> runs = RunConfig(c, config_arms, repeats, iterations, **service, dir,
                                                detect.get(), devices, online_rates);
    if (!runs.ok()) return Fail(runs.status());
    all.push_back(*std::move(runs));
  }
  if (absl::Status reported = Report(all, arms, repeats, iterations, call_us); !reported.ok()) {
    return Fail(reported);
  }
  if (std::getenv("BENCH_BUBBLES_KEEP") != nullptr) {
    std::fprintf(stderr, "kept %s\n", dir.c_str());
  } else {
    (void)base::RemoveTree(dir.string());
  }
  return 0;
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(
      argc, argv,
      "bench-bubbles [--quick] [--repeats 10] [--iterations 12] "
      "[--configs gpipe-4,1f1b-8] [--fwd-ms 4] [--bwd-ms 8] "
      "[--fill-step-ms 1] [--cpu-only-arm=false] [--detected-arm=false] [--device cuda] "
      "[--online-rates 25,100] [--online-configs gpipe-4] [--online-slo-ms 150]");
  return pswitch::Main();
}
