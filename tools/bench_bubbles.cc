// bench-bubbles: the main job (pipetrain, 4 pipeline stages, simulated compute on the host's
// simulated devices) run without fill tasks, with pswitch fill tasks in its bubbles, and with
// naive co-location (fill work running unmanaged on the same devices), all in one run. Prints
// the main job's iteration time and its increase I = (T_with - T_without) / T_without, the
// bubble ratio, the fraction of bubble time fill steps used, fill throughput and the pause
// latency (bubble end -> fill task paused), plus the cost of one bubble-instruction call.
//
// Host figures: every stage "computes" by holding its device's compute lock for the profiled
// time (gpu/host/compute_lock.h), and fill steps are synthetic steps that hold the same lock,
// so the contention measured is that of a time-sliced GPU, not of the 2 CPU cores.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "gpu/host/compute_lock.h"
#include "nlohmann/json.hpp"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "proto/status.h"
#include "tools/cli.h"
#include "tools/pswitchd_process.h"

ABSL_FLAG(bool, quick, false, "a reduced run (fewer iterations) that finishes in under 50 s");
ABSL_FLAG(double, fwd_ms, 4, "simulated forward time per micro-batch and stage");
ABSL_FLAG(double, bwd_ms, 8, "simulated backward time per micro-batch and stage");
ABSL_FLAG(double, fill_step_ms, 1, "fill tasks' step time (synthetic steps on the device)");
ABSL_FLAG(int, iterations, 12, "measured main-job iterations per run (--quick: 4)");

namespace pswitch {
namespace {

constexpr int kStages = 4;
constexpr uint64_t kFreeBytes = 256ull << 20;

struct Config {
  pipeline::ScheduleKind schedule;
  int microbatches;
};

struct MainJobRun {
  double iteration_ms = 0;
  double bubble_ratio = 0;
  double wall_s = 0;
};

absl::StatusOr<MainJobRun> RunPipetrain(const Config& c, int iterations, const std::string& server,
                                        const std::string& json) {
  std::string cmd = absl::StrCat(
      tools::SiblingBinary("pipetrain"), " --simulated-compute --stages=", kStages,
      " --microbatches=", c.microbatches, " --schedule=", pipeline::ScheduleKindName(c.schedule),
      " --fwd-ms=", absl::GetFlag(FLAGS_fwd_ms), " --bwd-ms=", absl::GetFlag(FLAGS_bwd_ms),
      " --iterations=", iterations, " --warmup=1 --bubble-free-bytes=", kFreeBytes,
      " --json=", json, server.empty() ? "" : " --server=" + server, " > /dev/null");
  absl::Time start = absl::Now();
  if (std::system(cmd.c_str()) != 0) return absl::InternalError("pipetrain failed: " + cmd);
  MainJobRun run;
  run.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  std::ifstream in(json);
  nlohmann::json report = nlohmann::json::parse(in, nullptr, false);
  if (report.is_discarded() || !report.contains("measured")) {
    return absl::InternalError("pipetrain wrote no summary to " + json);
  }
  run.iteration_ms = report["measured"]["iteration_ms_mean"].get<double>();
  run.bubble_ratio = report["measured"]["bubble_ratio"].get<double>();
  return run;
}

// The predicted bubble cycle of every stage, registered before the run so fill jobs can be
// placed; pipetrain replaces it with the cycle it measures over its warm-up.
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

// Naive co-location: one unmanaged fill loop per device, stepping whenever it gets the device.
class NaiveFill {
 public:
  NaiveFill() {
    for (int s = 0; s < kStages; ++s) {
      pid_t pid = ::fork();
      if (pid == 0) {
        auto lock = gpu::ComputeLock::Open(gpu::ComputeLock::DefaultPath(s));
        if (!lock.ok()) ::_exit(1);
        const absl::Duration step = absl::Milliseconds(absl::GetFlag(FLAGS_fill_step_ms));
        while (true) {
          gpu::ComputeLock::Hold hold = lock->Acquire();
          absl::SleepFor(step);
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

 private:
  std::vector<pid_t> pids_;
};

double Percent(double x) { return 100 * x; }

int Main() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int iterations = quick ? 4 : absl::GetFlag(FLAGS_iterations);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("bench-bubbles-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string json = (dir / "pipetrain.json").string();

  std::fprintf(stderr, "starting pswitchd (4 simulated devices)...\n");
  tools::PswitchdProcess daemon(
      tools::SiblingBinary("pswitchd"),
      {"--backend=host", "--listen=127.0.0.1:0", "--gpus=4", "--standby-workers=1",
       "--preload=", "--arena-bytes=1073741824", "--activation-bytes=16777216",
       "--socket=" + (dir / "m.sock").string()},
      (dir / "pswitchd.log").string());
  if (daemon.port() == 0) {
    std::fprintf(stderr, "bench-bubbles: pswitchd did not start:\n%s\n", daemon.log().c_str());
    return 1;
  }
  auto client = client::Client::Connect(daemon.address());
  if (!client.ok()) {
    std::fprintf(stderr, "bench-bubbles: %s\n", client.status().ToString().c_str());
    return 1;
  }

  // The bubble instruction's cost to the main job: one call, measured client-side (no fill job
  // is placed yet, so the server only records the bubble).
  std::vector<double> call_us;
  for (int i = 0; i < 2000; ++i) {
    absl::Time t0 = absl::Now();
    (void)(*client)->BubbleBegin(3, absl::Milliseconds(1), kFreeBytes);
    absl::Time t1 = absl::Now();
    (void)(*client)->BubbleEnd(3);
    call_us.push_back(absl::ToDoubleMicroseconds(t1 - t0));
    call_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t1));
  }
  std::sort(call_us.begin(), call_us.end());

  std::vector<Config> configs;
  for (pipeline::ScheduleKind kind :
       {pipeline::ScheduleKind::kGpipe, pipeline::ScheduleKind::kOneFOneB}) {
    for (int m : {4, 8}) configs.push_back({kind, m});
  }
  struct Row {
    Config config;
    MainJobRun without, with, naive;
    double used = 0, steps_per_s = 0, pause_p50_ms = 0, pause_p99_ms = 0;
    uint64_t killed = 0;
  };
  std::vector<Row> rows;
  bool jobs_submitted = false;
  for (const Config& c : configs) {
    Row row{c};
    std::fprintf(stderr, "%s, %d micro-batches: ", pipeline::ScheduleKindName(c.schedule).data(),
                 c.microbatches);
    auto cycles = Cycles(c);
    if (!cycles.ok()) {
      std::fprintf(stderr, "bench-bubbles: %s\n", cycles.status().ToString().c_str());
      return 1;
    }
    for (int s = 0; s < kStages; ++s) {
      absl::Status registered = (*client)->RegisterBubbleCycle(s, (*cycles)[s]);
      if (!registered.ok()) {
        std::fprintf(stderr, "bench-bubbles: %s\n", registered.ToString().c_str());
        return 1;
      }
    }
    if (!jobs_submitted) {
      // One long fill job per device (the scheduler spreads them); they live across configs.
      for (int s = 0; s < kStages; ++s) {
        client::FillJobOptions o;
        o.kind = client::FillKind::kSynthetic;
        o.synthetic_step = absl::Milliseconds(absl::GetFlag(FLAGS_fill_step_ms));
        o.steps = 1u << 30;
        o.memory_bytes = 1 << 20;
        auto job = (*client)->SubmitFill(o);
        if (!job.ok()) {
          std::fprintf(stderr, "bench-bubbles: %s\n", job.status().ToString().c_str());
          return 1;
        }
      }
      jobs_submitted = true;
    }
    std::fprintf(stderr, "without... ");
    auto without = RunPipetrain(c, iterations, "", json);
    auto before = (*client)->FillStats();
    std::fprintf(stderr, "pswitch... ");
    auto with = RunPipetrain(c, iterations, daemon.address(), json);
    auto after = (*client)->FillStats();
    std::fprintf(stderr, "naive...\n");
    absl::StatusOr<MainJobRun> naive;
    {
      NaiveFill fill;
      naive = RunPipetrain(c, iterations, "", json);
    }
    for (const auto* s : {&without, &with, &naive}) {
      if (!s->ok()) {
        std::fprintf(stderr, "bench-bubbles: %s\n", s->status().ToString().c_str());
        return 1;
      }
    }
    if (!before.ok() || !after.ok()) {
      std::fprintf(stderr, "bench-bubbles: fill stats unavailable\n");
      return 1;
    }
    row.without = *without;
    row.with = *with;
    row.naive = *naive;
    absl::Duration bubble = after->bubble_time - before->bubble_time;
    absl::Duration used = after->fill_step_time - before->fill_step_time;
    row.used = bubble > absl::ZeroDuration() ? absl::FDivDuration(used, bubble) : 0;
    row.steps_per_s = static_cast<double>(after->steps - before->steps) / with->wall_s;
    row.pause_p50_ms = absl::ToDoubleMilliseconds(after->pause_p50);
    row.pause_p99_ms = absl::ToDoubleMilliseconds(after->pause_p99);
    row.killed = after->killed;
    rows.push_back(row);
  }

  std::printf(
      "bench-bubbles: pipetrain, %d stages, simulated compute fwd %.1f ms / bwd %.1f ms per "
      "micro-batch on host-simulated devices; fill steps %.1f ms; %d measured iterations per run\n",
      kStages, absl::GetFlag(FLAGS_fwd_ms), absl::GetFlag(FLAGS_bwd_ms),
      absl::GetFlag(FLAGS_fill_step_ms), iterations);
  std::printf("bubble instruction: one call costs p50 %.1f us, p99 %.1f us (client-side)\n",
              call_us[call_us.size() / 2], call_us[call_us.size() * 99 / 100]);
  std::printf("%-6s %3s %9s %9s %8s %9s %8s %8s %8s %10s %9s %9s\n", "sched", "M", "T_none ms",
              "T_fill ms", "I", "T_naive", "I_naive", "bubbles", "used", "steps/s", "pause p50",
              "pause p99");
  for (const Row& r : rows) {
    auto increase = [&](const MainJobRun& run) {
      return Percent(run.iteration_ms / r.without.iteration_ms - 1);
    };
    std::printf(
        "%-6s %3d %9.2f %9.2f %7.2f%% %9.2f %7.2f%% %7.1f%% %7.1f%% %10.1f %7.3fms %7.3fms\n",
        pipeline::ScheduleKindName(r.config.schedule).data(), r.config.microbatches,
        r.without.iteration_ms, r.with.iteration_ms, increase(r.with), r.naive.iteration_ms,
        increase(r.naive), Percent(r.without.bubble_ratio), Percent(r.used), r.steps_per_s,
        r.pause_p50_ms, r.pause_p99_ms);
  }
  std::printf("targets: I <= 1%% with fill using >= 80%% of bubble time; killed tasks: %llu\n",
              static_cast<unsigned long long>(rows.empty() ? 0 : rows.back().killed));
  if (std::getenv("BENCH_BUBBLES_KEEP") != nullptr) {
    std::fprintf(stderr, "kept %s\n", dir.c_str());
  } else {
    std::filesystem::remove_all(dir);
  }
  return 0;
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv,
                                 "bench-bubbles [--quick] [--fwd-ms 4] [--bwd-ms 8] "
                                 "[--fill-step-ms 1] [--iterations 12]");
  return pswitch::Main();
}
