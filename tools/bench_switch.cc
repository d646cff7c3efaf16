// bench-switch: what a switch costs a client. With a training task running, inference requests
// arrive for a model that is not on the device; the client-measured latency is compared with:
//   ready model      the same request when its model is already active (no switch),
//   stop-and-start   a fresh process that builds the model and runs the request (run-model),
//   pswitch          pipelined switching with one group, per-layer groups, and optimal groups.
// Everything is measured in this run against a pswitchd this tool starts.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "models/registry.h"
#include "models/safetensors.h"
#include "models/zoo_model.h"
#include "tools/cli.h"
#include "tools/pswitchd_process.h"
#include "worker/host_tensors.h"

ABSL_FLAG(std::string, backend, "host", "device backend: host or cuda");
ABSL_FLAG(std::string, model, "resnet50", "zoo model served by inference");
ABSL_FLAG(std::string, trainer, "tiny_cnn", "zoo model of the running training task");
ABSL_FLAG(uint32_t, batch, 8, "inference batch size");
ABSL_FLAG(double, bandwidth_cap, 0, "host backend: copy cap in bytes/s (12e9 = PCIe 3 x16)");
ABSL_FLAG(int, repeats, 10, "measured requests per row (median reported)");
ABSL_FLAG(uint64_t, arena_bytes, 2ull << 30, "arena size for the pswitchd it starts");

namespace pswitch {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::Status WritePlan(const std::string& path, int layers, bool per_layer) {
  std::ofstream out(path);
  out << "{\"groups\": [";
  if (per_layer) {
    for (int l = 0; l < layers; ++l) out << (l ? "," : "") << "[" << l << "," << l << "]";
  } else {
    out << "[0," << layers - 1 << "]";
  }
  out << "]}\n";
  return out ? absl::OkStatus() : absl::InternalError("cannot write " + path);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "bench-switch: %s\n", status.ToString().c_str());
  return 1;
}

// Waits (bounded) until the training task is running again, so the next request preempts it.
bool AwaitTraining(client::Client& c, uint64_t id) {
  for (int i = 0; i < 20000; ++i) {
    auto s = c.Status(id);
    // "switching" counts: the task is on its worker while its model streams in.
    if (s.ok() &&
        (s->state == client::TaskState::kRunning || s->state == client::TaskState::kSwitching)) {
      return true;
    }
    if (s.ok() && s->state >= client::TaskState::kSucceeded) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

int Main() {
  const std::string zoo = absl::GetFlag(FLAGS_model);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const uint32_t batch = absl::GetFlag(FLAGS_batch);
  if (repeats < 1 || batch < 1) return Fail(absl::InvalidArgumentError("--repeats, --batch >= 1"));
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("bench-switch-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto model = models::CreateModel(zoo);
  if (!model.ok()) return Fail(model.status());
  auto input = worker::ToHostTensor("input", (*model)->ExampleInput(batch, 1).input);
  if (!input.ok()) return Fail(input.status());

  std::fprintf(stderr, "starting pswitchd...\n");
  tools::PswitchdProcess daemon(
      tools::SiblingBinary("pswitchd"),
      {"--backend=" + absl::GetFlag(FLAGS_backend),
       absl::StrCat("--bandwidth-cap=", absl::GetFlag(FLAGS_bandwidth_cap)),
       absl::StrCat("--arena-bytes=", absl::GetFlag(FLAGS_arena_bytes)), "--listen=127.0.0.1:0",
       "--preload=", "--socket=" + (dir / "m.sock").string()},
      (dir / "pswitchd.log").string());
  if (daemon.port() == 0) {
    return Fail(absl::UnavailableError("pswitchd did not start:\n" + daemon.log()));
  }
  auto c = client::Client::Connect(daemon.address());
  if (!c.ok()) return Fail(c.status());
  client::Client& client = **c;

  std::fprintf(stderr, "registering %s (profile + optimal grouping)...\n", zoo.c_str());
  auto optimal = client.Register({"optimal", zoo, "", batch, "auto"});
  if (!optimal.ok()) return Fail(optimal.status());
  std::string one = (dir / "one.json").string(), per = (dir / "per.json").string();
  if (auto s = WritePlan(one, optimal->layers, false); !s.ok()) return Fail(s);
  if (auto s = WritePlan(per, optimal->layers, true); !s.ok()) return Fail(s);
  for (auto [name, plan] : {std::pair{"one-group", one}, std::pair{"per-layer", per}}) {
    std::fprintf(stderr, "registering %s...\n", name);
    auto r = client.Register({name, zoo, "", batch, plan});
    if (!r.ok()) return Fail(r.status());
  }
  auto trainer = client.Register({"trainer", absl::GetFlag(FLAGS_trainer), "", 1, "auto"});
  if (!trainer.ok()) return Fail(trainer.status());

  // Ready model: the same request with its model already active.
  std::vector<double> ready;
  for (int r = 0; r < repeats + 1; ++r) {
    absl::Time t0 = absl::Now();
    auto out = client.Infer("optimal", {*input});
    if (!out.ok()) return Fail(out.status());
    if (r > 0) ready.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }

  // Stop-and-start: a fresh process builds the model and serves the request.
  std::vector<double> cold;
  std::string in_path = (dir / "x.safetensors").string(),
              out_path = (dir / "y.safetensors").string();
  models::SafetensorsEntry entry{"input", models::DType::kF32, input->shape, input->data.data(),
                                 input->data.size()};
  if (auto s = models::WriteSafetensors(in_path, {entry}); !s.ok()) return Fail(s);
  for (int r = 0; r < std::min(repeats, 3); ++r) {
    std::string cmd = absl::StrCat(tools::SiblingBinary("run-model"), " --model ", zoo, " --input ",
                                   in_path, " --output ", out_path, " > /dev/null 2>&1");
    absl::Time t0 = absl::Now();
    if (std::system(cmd.c_str()) != 0) return Fail(absl::InternalError("run-model failed"));
    cold.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }

  // pswitch: a training task runs; each request preempts it and switches the model in.
  auto training = client.TrainAsync("trainer", {1000000, 1, 0});
  uint64_t training_id = 0;
  // Its id is the next one after this client's requests; find it once it is queued.
  for (int attempt = 0; attempt < 10000 && training_id == 0; ++attempt) {
    for (uint64_t id = 1; id < 1000 && training_id == 0; ++id) {
      auto s = client.Status(id);
      if (!s.ok()) break;
      if (s->model == "trainer") training_id = id;
    }
    if (training_id == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  struct Row {
    std::string name;
    std::vector<double> latency, switch_ms;
  };
  std::vector<Row> rows = {{"one-group", {}, {}}, {"per-layer", {}, {}}, {"optimal", {}, {}}};
  std::vector<double> cleaning_us;  // the preempted trainer's cleaning, after its drain
  int cleaned_before_drain = 0;
  for (Row& row : rows) {
    std::fprintf(stderr, "measuring %s...\n", row.name.c_str());
    for (int r = 0; r < repeats; ++r) {
      if (!AwaitTraining(client, training_id)) {
        return Fail(absl::InternalError("training task is not running"));
      }
      absl::Time t0 = absl::Now();
      auto out = client.Infer(row.name, {*input});
      if (!out.ok()) return Fail(out.status());
      row.latency.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      row.switch_ms.push_back(absl::ToDoubleMilliseconds(out->switch_time));
      auto trainer = client.Status(training_id);
      if (trainer.ok() && trainer->clean_time > absl::ZeroDuration()) {
        cleaning_us.push_back(absl::ToDoubleMicroseconds(trainer->clean_time));
        cleaned_before_drain += trainer->cleaned_after_drain ? 0 : 1;
      }
    }
  }
  (void)client.Cancel(training_id);
  (void)training.wait_for(std::chrono::seconds(30));

  const double base = Median(ready);
  std::printf(
      "bench-switch: %s, batch %u, backend %s%s, trainer %s, median of %d requests\n", zoo.c_str(),
      batch, absl::GetFlag(FLAGS_backend).c_str(),
      absl::GetFlag(FLAGS_bandwidth_cap) > 0
          ? absl::StrCat(" (copy cap ", absl::GetFlag(FLAGS_bandwidth_cap) / 1e9, " GB/s)").c_str()
          : "",
      absl::GetFlag(FLAGS_trainer).c_str(), repeats);
  std::printf("%-16s %12s %14s %16s\n", "method", "latency ms", "overhead ms", "transmission ms");
  std::printf("%-16s %12.3f %14s %16s\n", "ready model", base, "-", "-");
  std::printf("%-16s %12.3f %14.3f %16s\n", "stop-and-start", Median(cold), Median(cold) - base,
              "-");
  for (const Row& row : rows) {
    std::printf("%-16s %12.3f %14.3f %16.3f\n", ("pswitch " + row.name).c_str(),
                Median(row.latency), Median(row.latency) - base, Median(row.switch_ms));
  }
  if (!cleaning_us.empty()) {
    std::printf(
        "cleaning after the trainer's drain (overlaps the next transmission): median %.1f us, "
        "max %.1f us over %zu preemptions; %d cleaned before their drain\n",
        Median(cleaning_us), *std::max_element(cleaning_us.begin(), cleaning_us.end()),
        cleaning_us.size(), cleaned_before_drain);
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv,
                                 "bench-switch [--model resnet50] [--batch 8] [--bandwidth-cap B]");
  return pswitch::Main();
}
