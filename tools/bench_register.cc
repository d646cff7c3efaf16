// bench-register: how long registering a model takes, phase by phase (read, inspect, profile,
// plan, pin, load: docs/architecture.md), against loading the same weights into the same model
// once in a plain process, measured in the same run. One pswitchd; each model registered
// --rounds times (a new name each round, unloaded after it) with its weights as a safetensors
// file passed over the Unix socket and an "auto" plan, as a user registers a model of their own.
//
//   bench-register [--models resnet152,bert_base,archive] [--rounds 3] [--backend host]
//                  [--batch 1] [--warm-up auto]
//
// "archive" is tests/data/archives/residual_cnn.pswitch.pt (a pswitch.export archive). Prints,
// per model, the median of each phase and of the whole registration as the client saw it, the
// baseline's median (build the model, load the checkpoint: what any server must do once), and
// their ratio. Target (issue 28): ResNet-152 in at most 3 s on the 2-core host, 2 s on an H100.
//
// Then, for each registration, its first two requests at the registered batch: the first one's
// compute (its first layer's start to its completion, server-side: the switch that brings the
// weights in is before it) against the second one's, on the now resident model. With warm-ups
// (--warm-up, on by default on CUDA) the first pays no one-off costs: target within 10 %.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "client/client.h"
#include "models/model_dtype.h"
#include "models/model_inspection.h"
#include "models/model_source.h"
#include "models/registry.h"
#include "models/script_model.h"
#include "models/weights.h"
#include "tools/bench_stats.h"
#include "tools/cli.h"
#include "tools/pswitchd_process.h"
#include "worker/host_tensors.h"
#include "worker/model_binding.h"

ABSL_FLAG(std::string, models, "resnet152,bert_base,archive",
          "zoo models to register, and \"archive\" for a pswitch.export archive");
ABSL_FLAG(int, rounds, 3, "registrations of each model (medians are printed)");
ABSL_FLAG(std::string, backend, "host", "pswitchd's backend");
ABSL_FLAG(uint32_t, batch, 1, "the registered batch (the profile's)");
ABSL_FLAG(std::string, warm_up, "auto", "pswitchd's --warm-up (auto, on, off)");
ABSL_FLAG(bool, inspector_standby, true,
          "pswitchd's --inspector-standby (false: each registration starts its inspector)");
ABSL_FLAG(std::string, dtype, "",
          "zoo models' registered precision (float16, bfloat16); empty: float32");
ABSL_FLAG(std::string, archive, PSWITCH_TEST_DATA_DIR "/archives/residual_cnn.pswitch.pt",
          "the archive registered as \"archive\"");

namespace pswitch {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "bench-register: %s\n", status.ToString().c_str());
  return 1;
}

// What registering one model is compared with: its weights file and how to build it here.
struct Subject {
  std::string label;
  std::string zoo;      // empty: the archive
  std::string weights;  // a safetensors file of its weights (zoo models)
};

// The baseline: build the model and load its checkpoint once in this process, what any server
// must do before it can serve a model it is given.
absl::StatusOr<double> BaselineSeconds(const Subject& s, const std::string& archive_path) {
  const absl::Time start = absl::Now();
  if (s.zoo.empty()) {
    PSWITCH_ASSIGN_OR_RETURN(std::string bytes,
                             base::ReadRegularFile(archive_path, "archive", 8ull << 30));
    PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<models::ZooModel> model,
                             models::LoadScriptModel(s.label, bytes, archive_path));
  } else {
    PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<models::ZooModel> model, models::CreateModel(s.zoo));
    PSWITCH_RETURN_IF_ERROR(models::LoadWeights(*model, s.weights));
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// A worker's load of `s` measured in this process: building the model and binding it by name to
// a region at the registered layout (what a worker does), and the two forward passes (train and
// eval mode) a worker recorded per load before registration sent it the layout. Seconds.
struct WorkerLoad {
  double bind = 0;
  double recordings = 0;
};
absl::StatusOr<WorkerLoad> WorkerLoadSeconds(const Subject& s, const std::string& archive_path) {
  models::ModelSource source{s.zoo, nullptr, archive_path};
  if (s.zoo.empty()) {
    source.zoo_model = models::kScriptArchitecture;
    PSWITCH_ASSIGN_OR_RETURN(std::string bytes,
                             base::ReadRegularFile(archive_path, "archive", 8ull << 30));
    source.archive = std::make_shared<const std::string>(std::move(bytes));
  }
  PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<models::ZooModel> reference,
                           models::CreateModelFrom(source, s.label));
  if (const std::string dtype = absl::GetFlag(FLAGS_dtype); !dtype.empty()) {
    // The registered precision: LayoutOf records it, and the bind converts to it.
    PSWITCH_ASSIGN_OR_RETURN(models::ModelDType parsed, models::ParseModelDType(dtype));
    reference->to(models::TorchDType(parsed));
  }
  WorkerLoad load;
  absl::Time start = absl::Now();
  PSWITCH_ASSIGN_OR_RETURN(worker::ModelLayout layout, worker::LayoutOf(*reference));
  load.recordings = absl::ToDoubleSeconds(absl::Now() - start);
  reference.reset();
  std::vector<std::byte> region(layout.total_bytes);
  start = absl::Now();
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<worker::BoundModel> bound,
                           worker::BoundModel::Create(source, s.label, region.data(), layout));
  load.bind = absl::ToDoubleSeconds(absl::Now() - start);
  return load;
}

// A request's inputs at `batch` for `s`, as a client sends them.
absl::StatusOr<std::vector<proto::HostTensor>> RequestInputs(const Subject& s, uint32_t batch,
                                                             const std::string& archive_path) {
  std::shared_ptr<models::ZooModel> model;
  if (s.zoo.empty()) {
    PSWITCH_ASSIGN_OR_RETURN(std::string bytes,
                             base::ReadRegularFile(archive_path, "archive", 8ull << 30));
    PSWITCH_ASSIGN_OR_RETURN(model, models::LoadScriptModel(s.label, bytes, archive_path));
  } else {
    PSWITCH_ASSIGN_OR_RETURN(model, models::CreateModel(s.zoo));
  }
  // In the registered precision, as a client of a half-precision model sends them.
  std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (!s.zoo.empty() && !dtype.empty()) {
    PSWITCH_ASSIGN_OR_RETURN(models::ModelDType parsed, models::ParseModelDType(dtype));
    model->to(models::TorchDType(parsed));
  }
  return worker::ToHostTensors(model->InModelDType(model->ExampleInput(batch, 1)));
}

// The inspection's steps of each registration as pswitchd logged them ("inspection_step"), one
// line each: where the inspect phase's time goes on a machine a reader cannot look at.
void PrintInspectionSteps(const std::string& log) {
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (!absl::StrContains(line, "event=inspection_step ")) continue;
    std::map<std::string, std::string> fields;
    for (absl::string_view item : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
      fields[kv.first] = kv.second;
    }
    std::printf("inspection-step %-12s %-10s %8s ms%s\n", fields["model"].c_str(),
                fields["step"].c_str(), fields["ms"].c_str(),
                fields["with_facts_returned"] == "yes" ? " (to the facts' arrival)" : "");
  }
}

// A request's compute as the server saw it: its first layer's start to its completion.
double ComputeSeconds(const client::TaskResult& r) {
  return absl::ToDoubleSeconds(r.latency - r.breakdown.first_layer_start);
}

int Run() {
  // Line-buffered even into a pipe: what was measured survives a crash later in the run.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (rounds < 1) return Fail(absl::InvalidArgumentError("--rounds must be at least 1"));
  char tmpl[] = "/tmp/bench-register-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Fail(absl::InternalError("mkdtemp failed"));
  const std::filesystem::path dir = tmpl;

  // Each zoo model's weights as a user brings them: a safetensors file (seeded, written here).
  std::vector<Subject> subjects;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty())) {
    Subject s{std::string(name), name == "archive" ? "" : std::string(name), ""};
    if (!s.zoo.empty()) {
      auto model = models::CreateModel(s.zoo, {}, /*seed=*/7);
      if (!model.ok()) return Fail(model.status());
      auto tensors = models::StateDict(**model);
      if (!tensors.ok()) return Fail(tensors.status());
      s.weights = (dir / (s.zoo + ".safetensors")).string();
      if (absl::Status w = models::WriteTensors(s.weights, *tensors); !w.ok()) return Fail(w);
    }
    subjects.push_back(std::move(s));
  }

  tools::PswitchdProcess daemon(
      tools::SiblingBinary("pswitchd"),
      {"--backend=" + absl::GetFlag(FLAGS_backend), "--listen=127.0.0.1:0",
       "--preload=", "--unix-socket=" + (dir / "pswitchd.sock").string(),
       "--warm-up=" + absl::GetFlag(FLAGS_warm_up),
       absl::StrCat("--inspector-standby=", absl::GetFlag(FLAGS_inspector_standby)),
       "--socket=" + (dir / "m.sock").string()},
      (dir / "pswitchd.log").string());
  if (daemon.port() == 0)
    return Fail(absl::UnavailableError("pswitchd did not start:\n" + daemon.log()));
  // A failure once pswitchd runs says what its log says: the bench's own status alone rarely
  // tells why (a worker's warning, say).
  auto fail = [&daemon](const absl::Status& status) {
    const std::string log = daemon.log();
    const size_t from = log.size() > 8000 ? log.find('\n', log.size() - 8000) : 0;
    std::fprintf(stderr, "pswitchd's log (end):\n%s\n",
                 log.substr(from == std::string::npos ? 0 : from).c_str());
    return Fail(status);
  };
  auto client = client::Client::Connect("unix:" + (dir / "pswitchd.sock").string());
  if (!client.ok()) return fail(client.status());

  std::printf(
      "bench-register: %s backend, warm-up %s, inspector standby %s, batch %u, dtype %s, %d "
      "rounds; baseline: build "
      "the model and load its checkpoint in this process, same run (medians, seconds; first "
      "and next: the first two requests' compute, ms)\n",
      absl::GetFlag(FLAGS_backend).c_str(), absl::GetFlag(FLAGS_warm_up).c_str(),
      absl::GetFlag(FLAGS_inspector_standby) ? "on" : "off", absl::GetFlag(FLAGS_batch),
      absl::GetFlag(FLAGS_dtype).empty() ? "float32" : absl::GetFlag(FLAGS_dtype).c_str(), rounds);
  const std::vector<std::string> phase_names = {"read", "inspect", "profile",
                                                "plan", "pin",     "load"};
  std::printf("%-10s", "model");
  for (const std::string& p : phase_names) std::printf(" %8s", p.c_str());
  std::printf(" %9s %9s %9s %9s %9s %9s\n", "total", "baseline", "x", "first", "next",
              "first/next");
  for (const Subject& s : subjects) {
    std::map<std::string, std::vector<double>> phases;
    std::vector<double> totals, baselines, firsts, nexts;
    auto inputs = RequestInputs(s, absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_archive));
    if (!inputs.ok()) return fail(inputs.status());
    for (int r = 0; r < rounds; ++r) {
      // The baseline and the registration alternate, so both see the same machine.
      auto baseline = BaselineSeconds(s, absl::GetFlag(FLAGS_archive));
      if (!baseline.ok()) return fail(baseline.status());
      baselines.push_back(*baseline);
      client::RegisterOptions options;
      options.name = absl::StrCat(s.label, "-", r);
      options.zoo_model = s.zoo;
      options.weights_path = s.weights;
      options.archive_path = s.zoo.empty() ? absl::GetFlag(FLAGS_archive) : "";
      options.batch_size = absl::GetFlag(FLAGS_batch);
      options.plan = "auto";
      if (!s.zoo.empty()) options.dtype = absl::GetFlag(FLAGS_dtype);
      const absl::Time start = absl::Now();
      auto registered = (*client)->Register(options);
      const double total = absl::ToDoubleSeconds(absl::Now() - start);
      if (!registered.ok()) return fail(registered.status());
      totals.push_back(total);
      for (const auto& [phase, took] : registered->phases) {
        phases[phase].push_back(absl::ToDoubleSeconds(took));
      }
      for (std::vector<double>* into : {&firsts, &nexts}) {
        auto result = (*client)->Infer(options.name, *inputs);
        if (!result.ok()) return fail(result.status());
        into->push_back(ComputeSeconds(*result) * 1e3);
      }
      if (absl::Status unloaded = (*client)->Unload(options.name); !unloaded.ok()) {
        return fail(unloaded);
      }
    }
    std::printf("%-10s", s.label.c_str());
    for (const std::string& p : phase_names) {
      absl::StatusOr<double> m =
          phases.contains(p) ? tools::Median(phases[p]) : absl::StatusOr<double>(0.0);
      std::printf(" %8.3f", m.ok() ? *m : -1.0);
    }
    const double total = *tools::Median(totals), baseline = *tools::Median(baselines);
    const double first = *tools::Median(firsts), next = *tools::Median(nexts);
    std::printf(" %9.3f %9.3f %9.2f %9.2f %9.2f %9.2f\n", total, baseline, total / baseline, first,
                next, first / next);
  }
  PrintInspectionSteps(daemon.log());
  // Not a 13-field row: validate.sh reads those as the table above.
  std::printf(
      "worker load of each zoo model in this process (medians, s): build and bind by name at the "
      "registered layout, what a worker does; the train- and eval-mode recordings a worker ran "
      "per load before\n");
  for (const Subject& s : subjects) {
    // An archive's loader records its gate paths in every worker still (its runtime needs them).
    if (s.zoo.empty()) continue;
    std::vector<double> binds, recordings;
    for (int r = 0; r < rounds; ++r) {
      auto load = WorkerLoadSeconds(s, absl::GetFlag(FLAGS_archive));
      if (!load.ok()) return fail(load.status());
      binds.push_back(load->bind);
      recordings.push_back(load->recordings);
    }
    std::printf("worker-load %-10s bind %.3f recordings %.3f\n", s.label.c_str(),
                *tools::Median(binds), *tools::Median(recordings));
  }
  (void)base::RemoveTree(dir);
  return 0;
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv,
                                 "registration time per phase against a plain build and load.");
  return pswitch::Run();
}
