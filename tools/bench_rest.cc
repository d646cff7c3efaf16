// bench-rest: what the HTTP port costs over the TCP client, measured in the same run on the same
// daemon and model: tiny_mlp inference (resident, so no switch), interleaved TCP / HTTP JSON /
// HTTP binary requests, each a fresh request on a kept-alive connection.
//
//   bench-rest [--model tiny_mlp] [--requests 300] [--backend host]
//
// Prints each path's p50 and p99 client latency and the p50 overhead over TCP (absolute and as a
// ratio), the TCP client being the baseline.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/files.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "httplib.h"
#include "models/registry.h"
#include "models/zoo_model.h"
#include "nlohmann/json.hpp"
#include "tools/bench_stats.h"
#include "tools/cli.h"
#include "tools/pswitchd_process.h"
#include "worker/host_tensors.h"

ABSL_FLAG(std::string, model, "tiny_mlp", "zoo model (a small one shows the port's own cost)");
ABSL_FLAG(int, requests, 300, "requests per path");
ABSL_FLAG(std::string, backend, "host", "pswitchd's backend");

namespace pswitch {
namespace {

using nlohmann::json;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "bench-rest: %s\n", status.ToString().c_str());
  return 1;
}

int Run() {
  const std::string zoo = absl::GetFlag(FLAGS_model);
  const int n = absl::GetFlag(FLAGS_requests);
  if (n < 10) return Fail(absl::InvalidArgumentError("--requests must be >= 10"));
  char tmpl[] = "/tmp/bench-rest-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Fail(absl::InternalError("mkdtemp failed"));
  const std::filesystem::path dir = tmpl;
  tools::PswitchdProcess daemon(
      tools::SiblingBinary("pswitchd"),
      {"--backend=" + absl::GetFlag(FLAGS_backend), "--listen=127.0.0.1:0",
       "--http-listen=127.0.0.1:0", "--preload=" + zoo, "--standby-workers=1",
       "--socket=" + (dir / "m.sock").string()},
      (dir / "pswitchd.log").string());
  if (daemon.port() == 0 || daemon.http_port() == 0) {
    return Fail(absl::UnavailableError("pswitchd did not start:\n" + daemon.log()));
  }
  auto tcp = client::Client::Connect(daemon.address());
  if (!tcp.ok()) return Fail(tcp.status());
  httplib::Client http("127.0.0.1", daemon.http_port());
  http.set_keep_alive(true);
  http.set_tcp_nodelay(true);  // as standard clients do
  http.set_read_timeout(60, 0);

  auto model = models::CreateModel(zoo);
  if (!model.ok()) return Fail(model.status());
  auto input = worker::ToHostTensor("input", (*model)->ExampleInput(1, 3).input);
  if (!input.ok()) return Fail(input.status());
  if (input->dtype != proto::DType::F32) {
    return Fail(absl::InvalidArgumentError("bench-rest sends FP32 inputs: pick an image or MLP model"));
  }
  std::vector<float> values(input->data.size() / 4);
  std::memcpy(values.data(), input->data.data(), input->data.size());
  const std::string json_body =
      json{{"inputs", {{{"name", "input"}, {"shape", input->shape}, {"datatype", "FP32"},
                        {"data", values}}}}}
          .dump();
  const std::string header =
      json{{"inputs", {{{"name", "input"}, {"shape", input->shape}, {"datatype", "FP32"},
                        {"parameters", {{"binary_data_size", input->data.size()}}}}}},
           {"outputs", {{{"name", "output"}, {"parameters", {{"binary_data", true}}}}}}}
          .dump();
  const std::string binary_body = header + std::string(input->data.begin(), input->data.end());
  const std::string path = "/v2/models/" + zoo + "/infer";

  std::vector<double> tcp_ms, json_ms, binary_ms;
  auto timed = [](std::vector<double>& into, auto&& call) -> absl::Status {
    const absl::Time start = absl::Now();
    absl::Status status = call();
    into.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    return status;
  };
  auto tcp_call = [&]() { return (*tcp)->Infer(zoo, {*input}).status(); };
  auto http_call = [&](const std::string& body, const httplib::Headers& headers) {
    return [&, headers]() -> absl::Status {
      auto r = http.Post(path, headers, body, "application/octet-stream");
      if (!r) return absl::UnavailableError("HTTP request failed");
      if (r->status != 200) return absl::InternalError(absl::StrCat("HTTP ", r->status, ": ", r->body));
      return absl::OkStatus();
    };
  };
  auto json_call = http_call(json_body, {});
  auto binary_call =
      http_call(binary_body, {{"Inference-Header-Content-Length", std::to_string(header.size())}});
  std::fprintf(stderr, "warming up...\n");
  for (int i = 0; i < 10; ++i) {
    std::vector<double> ignored;
    for (auto status : {timed(ignored, tcp_call), timed(ignored, json_call),
                        timed(ignored, binary_call)}) {
      if (!status.ok()) return Fail(status);
    }
  }
  std::fprintf(stderr, "measuring %d requests per path, interleaved...\n", n);
  for (int i = 0; i < n; ++i) {
    for (auto status : {timed(tcp_ms, tcp_call), timed(json_ms, json_call),
                        timed(binary_ms, binary_call)}) {
      if (!status.ok()) return Fail(status);
    }
  }
  (void)base::RemoveTree(dir.string());

  auto p = [](const std::vector<double>& v, double q) { return *tools::Percentile(v, q); };
  const double base = p(tcp_ms, 50);
  std::printf("bench-rest: %s batch %lld, %d requests per path (baseline: the TCP client, same run)\n",
              zoo.c_str(), static_cast<long long>(input->shape[0]), n);
  std::printf("%-14s %10s %10s %16s %8s\n", "path", "p50_ms", "p99_ms", "p50_overhead_ms", "ratio");
  for (const auto& [name, v] : {std::pair{"tcp", &tcp_ms}, std::pair{"http-json", &json_ms},
                                std::pair{"http-binary", &binary_ms}}) {
    std::printf("%-14s %10.3f %10.3f %16.3f %8.2f\n", name, p(*v, 50), p(*v, 99),
                p(*v, 50) - base, p(*v, 50) / base);
  }
  return 0;
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv,
                                 "HTTP infer latency over the TCP client's, in the same run.");
  return pswitch::Run();
}
