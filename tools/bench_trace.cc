// bench-trace: the weights cache under a request trace (issue 29). N models (zoo models and
// pswitch.export archives, each registered under its own name with weights of its own) on one
// pswitchd GPU; requests from --clients clients with Poisson arrivals (--rate per second) over
// a Zipf(--zipf) popularity. The same seeded trace is replayed against a fresh pswitchd per arm:
//
//   warm        every model resident: the trace's requests one after another (each model's warm
//               latency and compute), then replayed paced like the other arms (the reference:
//               the same queueing, no copies)
//   cost, lru   the weights cache with either eviction policy, at two sizes: every model fits
//               (--weights-cache-bytes = their total), and a third of them fit
//   off         --weights-cache=false: one model at a time (PipeSwitch's switch)
//   stop-and-start (modelled): a request whose model differs from the previous request's pays
//               a fresh process that builds the model, loads its weights and runs it (run-model,
//               timed once per model kind in this run); the others pay their warm latency
//
// Per arm: p50 and p99 latency (the request's scheduled arrival to its answer, as the client
// saw it, so queueing counts), p99 against the warm p99, hit rate, bytes copied, copies after
// each model's first request, throughput, and for misses the share within the cost model's
// bound (the model's warm latency plus the part of its copy its compute cannot hide, + 1 ms).
// Targets: when the models fit, p99 <= 1.2x warm p99 and no copy after a model's first request;
// when they do not, misses within their bound and the cost-aware hit rate >= LRU's. The lines
// starting "FIG " are what tools/gpu/validate.sh collects.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/files.h"
#include "base/status.h"
#include "client/client.h"
#include "memdaemon/arena_layout.h"
#include "models/registry.h"
#include "models/safetensors.h"
#include "models/weights.h"
#include "tools/bench_stats.h"
#include "tools/cli.h"
#include "tools/pswitchd_process.h"
#include "worker/host_tensors.h"

ABSL_FLAG(std::string, backend, "host", "pswitchd's backend");
ABSL_FLAG(std::string, kinds,
          "resnet18,tiny_cnn,archive:residual_cnn,tiny_mlp,archive:tiny_transformer",
          "model kinds, cycled over the --models models: zoo names, and archive:NAME for "
          "tests/data/archives/NAME.pswitch.pt");
ABSL_FLAG(int, models, 12, "models registered (each under its own name, with its own weights)");
ABSL_FLAG(int, requests, 200, "requests in the trace");
ABSL_FLAG(double, rate, 6, "mean arrivals per second (Poisson)");
ABSL_FLAG(double, zipf, 1.0,
          "popularity skew: model of rank k is asked for in proportion to 1/k^s");
ABSL_FLAG(int, clients, 4, "concurrent clients (each its own connection)");
ABSL_FLAG(uint64_t, seed, 1, "the trace's seed");
ABSL_FLAG(uint64_t, arena_bytes, 2ull << 30, "pswitchd's --arena-bytes");
ABSL_FLAG(std::string, arms, "warm,cost,lru,off,cost-third,lru-third,stop-and-start",
          "which arms to run");
ABSL_FLAG(std::string, daemon_flags, "",
          "extra pswitchd flags for every arm, comma-separated (e.g. "
          "--weights-cache-compaction=false)");
ABSL_FLAG(bool, keep, false,
          "keep the working directory (each arm's pswitchd.log) and print its path");

namespace pswitch {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "bench-trace: %s\n", status.ToString().c_str());
  return 1;
}

struct Kind {
  std::string label;       // "resnet18", "archive:residual_cnn"
  std::string zoo;         // empty for an archive
  std::string archive;     // the archive's path
  std::string weights;     // a zoo model's safetensors (seeded, written once)
  std::string input_file;  // an archive's recorded input alone, for run-model
  std::vector<proto::HostTensor> inputs;
};

struct Request {
  double at_s = 0;  // scheduled arrival, from the replay's start
  int model = 0;
};

struct Answer {
  double latency_s = -1;  // arrival to answer; -1: failed
  bool copied = false;
  double copy_s = 0;
  double compute_s = 0;     // first layer's start to the answer, server-side
  double server_s = 0;      // submission to answer, server-side
  double copy_start_s = 0;  // the copy's start after submission (a miss)
};

std::string ModelName(int m) { return absl::StrCat("m", m); }

absl::StatusOr<Kind> MakeKind(const std::string& label, const std::filesystem::path& dir) {
  Kind k;
  k.label = label;
  if (absl::StartsWith(label, "archive:")) {
    const std::string name = label.substr(8);
    k.archive = absl::StrCat(PSWITCH_TEST_DATA_DIR, "/archives/", name, ".pswitch.pt");
    PSWITCH_ASSIGN_OR_RETURN(
        auto io, models::ReadTensors(
                     absl::StrCat(PSWITCH_TEST_DATA_DIR, "/archives/", name, ".io.safetensors")));
    for (const auto& [tensor_name, tensor] : io) {
      if (tensor_name != "input") continue;
      PSWITCH_ASSIGN_OR_RETURN(proto::HostTensor host, worker::ToHostTensor("input", tensor));
      k.inputs.push_back(std::move(host));
      k.input_file = (dir / (name + ".input.safetensors")).string();
      PSWITCH_RETURN_IF_ERROR(models::WriteTensors(k.input_file, {{"input", tensor}}));
    }
    if (k.inputs.empty()) return absl::NotFoundError(absl::StrCat(label, ": no recorded input"));
    return k;
  }
  k.zoo = label;
  PSWITCH_ASSIGN_OR_RETURN(auto model, models::CreateModel(label, {}, /*seed=*/3));
  PSWITCH_ASSIGN_OR_RETURN(auto tensors, models::StateDict(*model));
  k.weights = (dir / (label + ".safetensors")).string();
  PSWITCH_RETURN_IF_ERROR(models::WriteTensors(k.weights, tensors));
  PSWITCH_ASSIGN_OR_RETURN(k.inputs, worker::ToHostTensors(model->ExampleInput(1, 1)));
  return k;
}

std::vector<Request> MakeTrace(int models, int requests, double rate, double zipf, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // Popularity ranks fall on a shuffled order of the models, so the hottest is not always the
  // first kind.
  std::vector<int> by_rank(models);
  std::iota(by_rank.begin(), by_rank.end(), 0);
  std::shuffle(by_rank.begin(), by_rank.end(), rng);
  std::vector<double> weight(models);
  for (int r = 0; r < models; ++r) weight[r] = 1.0 / std::pow(r + 1, zipf);
  std::discrete_distribution<int> rank(weight.begin(), weight.end());
  std::exponential_distribution<double> gap(rate);
  std::vector<Request> trace;
  double t = 0;
  for (int i = 0; i < requests; ++i) {
    t += gap(rng);
    trace.push_back({t, by_rank[rank(rng)]});
  }
  return trace;
}

class Arm {
 public:
  // A fresh pswitchd with `flags`, every model registered on it.
  static absl::StatusOr<std::unique_ptr<Arm>> Start(const std::filesystem::path& parent,
                                                    const std::string& name,
                                                    const std::vector<std::string>& flags,
                                                    const std::vector<Kind>& kinds, int models) {
    // Each arm in a directory of its own: nothing of the last daemon's is in the way.
    const std::filesystem::path dir = parent / name;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", dir.string(), ": ", ec.message()));
    std::unique_ptr<Arm> arm(new Arm());
    arm->socket_ = (dir / "pswitchd.sock").string();
    std::vector<std::string> args = {
        "--backend=" + absl::GetFlag(FLAGS_backend),
        "--listen=127.0.0.1:0",
        "--http-listen=",
        "--preload=",
        "--unix-socket=" + arm->socket_,
        "--socket=" + (dir / "m.sock").string(),
        absl::StrCat("--arena-bytes=", absl::GetFlag(FLAGS_arena_bytes)),
        absl::StrCat("--standby-workers=", std::max(2, absl::GetFlag(FLAGS_clients) - 1))};
    args.insert(args.end(), flags.begin(), flags.end());
    for (absl::string_view extra :
         absl::StrSplit(absl::GetFlag(FLAGS_daemon_flags), ',', absl::SkipEmpty())) {
      args.emplace_back(extra);
    }
    arm->daemon_ = std::make_unique<tools::PswitchdProcess>(tools::SiblingBinary("pswitchd"), args,
                                                            (dir / "pswitchd.log").string());
    if (arm->daemon_->port() == 0) {
      return absl::UnavailableError("pswitchd did not start:\n" + arm->daemon_->log());
    }
    PSWITCH_ASSIGN_OR_RETURN(auto client, arm->Connect());
    for (int m = 0; m < models; ++m) {
      const Kind& k = kinds[m % kinds.size()];
      client::RegisterOptions options;
      options.name = ModelName(m);
      options.zoo_model = k.zoo;
      options.weights_path = k.weights;
      options.archive_path = k.archive;
      options.batch_size = 1;
      options.plan = "auto";
      auto registered = client->Register(options);
      if (!registered.ok()) {
        return absl::Status(registered.status().code(),
                            absl::StrCat("registering ", options.name, " (", k.label,
                                         "): ", registered.status().message()));
      }
    }
    PSWITCH_ASSIGN_OR_RETURN(auto listed, client->ListModels());
    for (const client::ModelInfo& info : listed) arm->bytes_[info.name] = info.param_bytes;
    return arm;
  }

  absl::StatusOr<std::unique_ptr<client::Client>> Connect() const {
    return client::Client::Connect("unix:" + socket_);
  }
  uint64_t bytes(int m) const { return bytes_.at(ModelName(m)); }

  // Replays `trace`: paced (each request sent at its arrival by the next free of `clients`
  // clients), or not (one client, one after another).
  absl::StatusOr<std::vector<Answer>> Replay(const std::vector<Request>& trace,
                                             const std::vector<Kind>& kinds, int clients,
                                             bool paced) {
    std::vector<Answer> answers(trace.size());
    std::atomic<size_t> next{0};
    std::vector<absl::Status> errors(clients);
    const absl::Time start = absl::Now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        auto client = Connect();
        if (!client.ok()) {
          errors[c] = client.status();
          return;
        }
        for (size_t i = next++; i < trace.size(); i = next++) {
          const absl::Time arrival = paced ? start + absl::Seconds(trace[i].at_s) : absl::Now();
          absl::SleepFor(arrival - absl::Now());
          const Kind& k = kinds[trace[i].model % kinds.size()];
          auto result = (*client)->Infer(ModelName(trace[i].model), k.inputs);
          if (!result.ok()) {
            errors[c] = result.status();
            return;
          }
          Answer& a = answers[i];
          a.latency_s = absl::ToDoubleSeconds(absl::Now() - arrival);
          a.copied = result->switch_time > absl::ZeroDuration();
          a.copy_s = absl::ToDoubleSeconds(result->switch_time);
          a.compute_s =
              absl::ToDoubleSeconds(result->latency - result->breakdown.first_layer_start);
          a.server_s = absl::ToDoubleSeconds(result->latency);
          a.copy_start_s = absl::ToDoubleSeconds(result->breakdown.drained);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& e : errors) PSWITCH_RETURN_IF_ERROR(e);
    wall_s_ = absl::ToDoubleSeconds(absl::Now() - start);
    return answers;
  }
  double wall_s() const { return wall_s_; }

 private:
  Arm() = default;
  std::string socket_;
  std::unique_ptr<tools::PswitchdProcess> daemon_;
  std::map<std::string, uint64_t> bytes_;
  double wall_s_ = 0;
};

double P(const std::vector<double>& v, double p) {
  absl::StatusOr<double> x = tools::Percentile(v, p);
  return x.ok() ? *x : -1;
}

// The arm's three slowest requests, split into where their time went (what p99 is made of):
// before pswitchd had the request (the client's send, or a client still busy with its previous
// request), queued in pswitchd until its switch began, the copy, and compute.
void PrintSlowest(const std::string& arm, const std::vector<Request>& trace,
                  const std::vector<Answer>& answers) {
  std::vector<size_t> order(answers.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t n = std::min<size_t>(3, order.size());
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](size_t a, size_t b) {
    return answers[a].latency_s > answers[b].latency_s;
  });
  for (size_t k = 0; k < n; ++k) {
    const Answer& a = answers[order[k]];
    std::printf(
        "  %s slowest %zu: m%d %.2f ms = %.2f before pswitchd + %.2f in it (copy from %.2f, "
        "%s%.2f ms, compute %.2f)\n",
        arm.c_str(), k + 1, trace[order[k]].model, a.latency_s * 1e3,
        (a.latency_s - a.server_s) * 1e3, a.server_s * 1e3, a.copy_start_s * 1e3,
        a.copied ? "copied " : "resident ", a.copy_s * 1e3, a.compute_s * 1e3);
  }
}

// A fresh process per model change: run-model builds the model, loads its weights and runs one
// request. Its wall time, once per kind.
absl::StatusOr<double> StopAndStartSeconds(const Kind& k, const std::filesystem::path& dir) {
  std::string command = tools::SiblingBinary("run-model") +
                        " --device=" + (absl::GetFlag(FLAGS_backend) == "cuda" ? "cuda" : "cpu") +
                        " --batch=1";
  if (k.zoo.empty()) {
    absl::StrAppend(&command, " --archive=", k.archive, " --input=", k.input_file);
  } else {
    absl::StrAppend(&command, " --model=", k.zoo, " --weights=", k.weights);
  }
  absl::StrAppend(&command, " --output=", (dir / "run-model-out.safetensors").string(), " > ",
                  (dir / "run-model.log").string(), " 2>&1");
  const absl::Time start = absl::Now();
  if (std::system(command.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("run-model failed: ", command));
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

int Run() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int models = absl::GetFlag(FLAGS_models), clients = absl::GetFlag(FLAGS_clients);
  if (models < 1 || clients < 1 || absl::GetFlag(FLAGS_requests) < 1 ||
      absl::GetFlag(FLAGS_rate) <= 0) {
    return Fail(absl::InvalidArgumentError("--models, --clients, --requests, --rate must be > 0"));
  }
  char tmpl[] = "/tmp/bench-trace-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Fail(absl::InternalError("mkdtemp failed"));
  const std::filesystem::path dir = tmpl;
  std::vector<Kind> kinds;
  for (absl::string_view label :
       absl::StrSplit(absl::GetFlag(FLAGS_kinds), ',', absl::SkipEmpty())) {
    auto k = MakeKind(std::string(label), dir);
    if (!k.ok()) return Fail(k.status());
    kinds.push_back(*std::move(k));
  }
  const std::vector<Request> trace =
      MakeTrace(models, absl::GetFlag(FLAGS_requests), absl::GetFlag(FLAGS_rate),
                absl::GetFlag(FLAGS_zipf), absl::GetFlag(FLAGS_seed));
  std::vector<std::string> arms = absl::StrSplit(absl::GetFlag(FLAGS_arms), ',', absl::SkipEmpty());
  auto wants = [&arms](const std::string& a) {
    return std::find(arms.begin(), arms.end(), a) != arms.end();
  };
  std::printf(
      "bench-trace: %s backend, %d models (%s), %zu requests at %.1f/s (Poisson), Zipf %.2f, %d "
      "clients, seed %llu; latency from the scheduled arrival, ms\n",
      absl::GetFlag(FLAGS_backend).c_str(), models, absl::GetFlag(FLAGS_kinds).c_str(),
      trace.size(), absl::GetFlag(FLAGS_rate), absl::GetFlag(FLAGS_zipf), clients,
      static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)));

  // The warm reference: every model resident. The trace one request after another gives each
  // model's warm latency and compute (the misses' bound); then the same paced replay as the
  // other arms, whose p99 is the reference: a GPU runs one task at a time, so requests that
  // arrive together queue behind each other whether or not their weights are resident.
  uint64_t total_bytes = 0, largest = 0;
  std::vector<double> warm_latency, warm_sequential;
  std::vector<Answer> warm_answers;                                         // the paced replay's
  std::map<int, std::vector<double>> warm_by_model, warm_compute_by_model;  // server-side
  std::vector<uint64_t> bytes(models);
  {
    auto arm = Arm::Start(dir, "warm", {"--weights-cache=true"}, kinds, models);
    if (!arm.ok()) return Fail(arm.status());
    for (int m = 0; m < models; ++m) {
      bytes[m] = (*arm)->bytes(m);
      // The room the weights cache gives a model (WeightsCache::RegionBytes).
      total_bytes += memdaemon::WholePages(bytes[m]);
      largest = std::max(largest, memdaemon::WholePages(bytes[m]));
    }
    std::vector<Request> touch;
    for (int m = 0; m < models; ++m) touch.push_back({0, m});
    if (auto t = (*arm)->Replay(touch, kinds, 1, false); !t.ok()) return Fail(t.status());
    auto warm = (*arm)->Replay(trace, kinds, 1, false);
    if (!warm.ok()) return Fail(warm.status());
    for (size_t i = 0; i < trace.size(); ++i) {
      warm_sequential.push_back((*warm)[i].latency_s);
      warm_by_model[trace[i].model].push_back((*warm)[i].server_s);
      warm_compute_by_model[trace[i].model].push_back((*warm)[i].compute_s);
    }
    auto paced = (*arm)->Replay(trace, kinds, clients, true);
    if (!paced.ok()) return Fail(paced.status());
    for (const Answer& a : *paced) warm_latency.push_back(a.latency_s);
    warm_answers = *std::move(paced);
  }
  const double warm_p99 = P(warm_latency, 99);
  std::printf("%-16s %8s %8s %9s %9s %8s %10s %14s %8s %12s\n", "arm", "p50", "p99", "p99/warm",
              "(after 1st)", "hits", "copied MB", "copies after 1st", "req/s", "misses in bound");
  std::printf("%-16s %8.2f %8.2f %9.2f %9s %8s %10s %14s %8s %12s  (one by one, no queueing)\n",
              "warm, sequential", P(warm_sequential, 50) * 1e3, P(warm_sequential, 99) * 1e3,
              P(warm_sequential, 99) / warm_p99, "-", "-", "-", "-", "-", "-");
  std::printf("%-16s %8.2f %8.2f %9.2f %9s %8s %10s %14s %8s %12s\n", "warm",
              P(warm_latency, 50) * 1e3, warm_p99 * 1e3, 1.0, "-", "-", "-", "-", "-", "-");
  PrintSlowest("warm", trace, warm_answers);
  std::map<std::string, double> hit_rates;
  for (const std::string name : {"cost", "lru", "off", "cost-third", "lru-third"}) {
    if (!wants(name)) continue;
    std::vector<std::string> flags;
    const bool third = absl::EndsWith(name, "-third");
    if (name == "off") {
      flags = {"--weights-cache=false"};
    } else {
      flags = {
          "--weights-cache=true",
          absl::StrCat("--weights-cache-policy=", absl::StartsWith(name, "lru") ? "lru" : "cost"),
          // A third of the models' bytes, never less than the largest model.
          absl::StrCat("--weights-cache-bytes=",
                       third ? std::max(total_bytes / 3, largest) : total_bytes)};
    }
    auto arm = Arm::Start(dir, name, flags, kinds, models);
    if (!arm.ok()) return Fail(arm.status());
    auto answers = (*arm)->Replay(trace, kinds, clients, true);
    if (!answers.ok()) return Fail(answers.status());
    std::vector<double> latency, after_first;  // after_first: each model's first request aside
    std::vector<bool> seen(models, false);
    int hits = 0, copies_after_first = 0, misses = 0, in_bound = 0;
    uint64_t copied = 0;
    for (size_t i = 0; i < trace.size(); ++i) {
      const Answer& a = (*answers)[i];
      latency.push_back(a.latency_s);
      const int m = trace[i].model;
      if (seen[m]) after_first.push_back(a.latency_s);
      if (!a.copied) {
        ++hits;
      } else {
        copied += bytes[m];
        if (seen[m]) ++copies_after_first;
        ++misses;
        // The cost model's bound for a miss: its warm latency plus what of its copy compute
        // cannot hide, from the copy's start (the wait for the GPU before it is queueing).
        const double warm = P(warm_by_model[m], 50), compute = P(warm_compute_by_model[m], 50);
        if (a.server_s - a.copy_start_s <= warm + std::max(a.copy_s - compute, 0.0) + 1e-3) {
          ++in_bound;
        }
      }
      seen[m] = true;
    }
    hit_rates[name] = static_cast<double>(hits) / trace.size();
    const double p99 = P(latency, 99), p99_after = P(after_first, 99);
    std::printf("%-16s %8.2f %8.2f %9.2f %9.2f %7.1f%% %10.1f %14d %8.2f %6d/%-5d\n", name.c_str(),
                P(latency, 50) * 1e3, p99 * 1e3, p99 / warm_p99, p99_after / warm_p99,
                100.0 * hits / trace.size(), copied / 1e6, copies_after_first,
                trace.size() / (*arm)->wall_s(), in_bound, misses);
    std::printf(
        "FIG trace %s p99_over_warm=%.2f (after each model's first request %.2f) "
        "hit_rate=%.3f copies_after_first=%d misses_in_bound=%d/%d copied_mb=%.1f\n",
        name.c_str(), p99 / warm_p99, p99_after / warm_p99, hit_rates[name], copies_after_first,
        in_bound, misses, copied / 1e6);
    PrintSlowest(name, trace, *answers);
  }
  if (hit_rates.contains("cost-third") && hit_rates.contains("lru-third")) {
    std::printf("FIG trace cost_vs_lru_hit_rate=%.3f/%.3f (%s)\n", hit_rates["cost-third"],
                hit_rates["lru-third"],
                hit_rates["cost-third"] >= hit_rates["lru-third"] ? "met" : "not met");
  }
  if (wants("stop-and-start")) {
    // Modelled from measured parts: a model change pays run-model's time, the rest warm.
    std::vector<double> per_kind(kinds.size(), 0);
    for (size_t k = 0; k < kinds.size(); ++k) {
      auto s = StopAndStartSeconds(kinds[k], dir);
      if (!s.ok()) return Fail(s.status());
      per_kind[k] = *s;
    }
    std::vector<double> latency;
    for (size_t i = 0; i < trace.size(); ++i) {
      const bool change = i == 0 || trace[i].model != trace[i - 1].model;
      latency.push_back(change ? per_kind[trace[i].model % kinds.size()] : warm_sequential[i]);
    }
    // No queueing modelled, so against the sequential warm p99.
    std::printf(
        "%-16s %8.2f %8.2f %9.2f %9s %8s %10s %14s %8s %12s  (modelled, no queueing; "
        "p99 / sequential warm)\n",
        "stop-and-start", P(latency, 50) * 1e3, P(latency, 99) * 1e3,
        P(latency, 99) / P(warm_sequential, 99), "-", "-", "-", "-", "-", "-");
  }
  if (absl::GetFlag(FLAGS_keep)) {
    std::printf("kept: %s\n", dir.c_str());
  } else {
    (void)base::RemoveTree(dir);
  }
  return 0;
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv,
                                 "the weights cache under a Poisson/Zipf request trace.");
  return pswitch::Run();
}
