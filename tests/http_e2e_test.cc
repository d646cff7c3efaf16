// End-to-end: pswitchd's HTTP/JSON port (Open Inference Protocol, KServe v2) against a real
// daemon, compared with its TCP client on the same models.
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/files.h"
#include "client/client.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "models/registry.h"
#include "models/zoo_model.h"
#include "nlohmann/json.hpp"
#include "tests/e2e_helpers.h"
#include "tests/raw_socket.h"
#include "tests/test_daemon.h"
#include "worker/host_tensors.h"

namespace pswitch {
namespace {

using e2e::Floats;
using e2e::Input;
using e2e::StagingMappings;
using e2e::TokenFile;
using nlohmann::json;

// The KServe v2 JSON body for one FP32 input.
std::string InferBody(const proto::HostTensor& t) {
  return json{{"id", "req-1"},
              {"inputs",
               {{{"name", t.name}, {"shape", t.shape}, {"datatype", "FP32"}, {"data", Floats(t)}}}}}
      .dump();
}

json Body(const httplib::Result& r) { return json::parse(r->body, nullptr, false); }

class HttpE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<e2e::TestDaemon>(std::vector<std::string>{
        "--preload=tiny_cnn,tiny_mlp", "--standby-workers=1", "--max-frame-bytes=65536"});
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
    ASSERT_GT(daemon_->http_port(), 0) << daemon_->log();
    http_ = std::make_unique<httplib::Client>("127.0.0.1", daemon_->http_port());
    http_->set_read_timeout(60, 0);
  }
  std::unique_ptr<e2e::TestDaemon> daemon_;
  std::unique_ptr<httplib::Client> http_;
};

TEST_F(HttpE2eTest, HealthAndMetadataFollowTheOpenInferenceProtocol) {
  auto live = http_->Get("/v2/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  int ready_status = 0;
  for (int i = 0; i < 200 && ready_status != 200; ++i) {  // standby workers may still load
    auto ready = http_->Get("/v2/health/ready");
    ASSERT_TRUE(ready);
    ready_status = ready->status;
    if (ready_status != 200) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(ready_status, 200);
  auto server = http_->Get("/v2");
  ASSERT_TRUE(server);
  EXPECT_EQ(Body(server)["name"], "pswitch");

  auto meta = http_->Get("/v2/models/tiny_mlp");
  ASSERT_TRUE(meta);
  ASSERT_EQ(meta->status, 200) << meta->body;
  const json m = Body(meta);
  EXPECT_EQ(m["name"], "tiny_mlp");
  const proto::HostTensor in = Input("tiny_mlp", 1);
  ASSERT_EQ(m["inputs"].size(), 1u);
  EXPECT_EQ(m["inputs"][0]["name"], "input");
  EXPECT_EQ(m["inputs"][0]["datatype"], "FP32");
  EXPECT_EQ(m["inputs"][0]["shape"], json({-1, in.shape[1]}));
  EXPECT_EQ(m["outputs"][0]["datatype"], "FP32");
  EXPECT_EQ(m["outputs"][0]["shape"][0], -1);
  auto model_ready = http_->Get("/v2/models/tiny_mlp/ready");
  ASSERT_TRUE(model_ready);
  EXPECT_EQ(model_ready->status, 200);

  auto unknown = http_->Get("/v2/models/nope");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_TRUE(Body(unknown).contains("error")) << unknown->body;
  auto no_route = http_->Get("/v9/nothing");
  ASSERT_TRUE(no_route);
  EXPECT_EQ(no_route->status, 404);
  EXPECT_TRUE(Body(no_route).contains("error")) << no_route->body;
}

// The same inputs through HTTP and through the TCP client give the same output values.
TEST_F(HttpE2eTest, InferOverHttpGivesWhatTheTcpClientGets) {
  auto tcp = client::Client::Connect(daemon_->address());
  ASSERT_TRUE(tcp.ok());
  for (const std::string model : {"tiny_mlp", "tiny_cnn", "tiny_mlp"}) {  // switches between
    const proto::HostTensor in = Input(model, 7);
    auto expected = (*tcp)->Infer(model, {in});
    ASSERT_TRUE(expected.ok()) << expected.status();
    auto r = http_->Post("/v2/models/" + model + "/infer", InferBody(in), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json out = Body(r);
    EXPECT_EQ(out["model_name"], model);
    EXPECT_EQ(out["id"], "req-1");
    ASSERT_EQ(out["outputs"].size(), 1u);
    const json& o = out["outputs"][0];
    EXPECT_EQ(o["datatype"], "FP32");
    EXPECT_EQ(o["shape"], json(expected->outputs[0].shape));
    EXPECT_EQ(o["data"].get<std::vector<float>>(), Floats(expected->outputs[0]));
    // The server-side breakdown, from the request's head: its first layer started inside it.
    double first_layer_ms = -1, total_ms = -1;
    for (absl::string_view metric : absl::StrSplit(r->get_header_value("Server-Timing"), ", ")) {
      std::pair<std::string, std::string> kv = absl::StrSplit(metric, ";dur=");
      double ms = -1;
      ASSERT_TRUE(absl::SimpleAtod(kv.second, &ms)) << metric;
      (kv.first == "first-layer" ? first_layer_ms : total_ms) = ms;
    }
    EXPECT_GT(first_layer_ms, 0);
    EXPECT_LE(first_layer_ms, total_ms);
  }
}

// REST and TCP clients at once on the same two models (so the requests switch between them):
// every answer is the one the model gives that input alone.
TEST_F(HttpE2eTest, ConcurrentRestAndTcpClientsOnTheSameModelsGetTheirOwnAnswers) {
  auto reference = client::Client::Connect(daemon_->address());
  ASSERT_TRUE(reference.ok());
  const std::vector<std::string> models = {"tiny_mlp", "tiny_cnn"};
  std::map<std::pair<std::string, int>, std::vector<float>> expected;
  for (const std::string& m : models) {
    for (int seed = 0; seed < 4; ++seed) {
      auto r = (*reference)->Infer(m, {Input(m, seed)});
      ASSERT_TRUE(r.ok()) << r.status();
      expected[{m, seed}] = Floats(r->outputs[0]);
    }
  }
  constexpr int kEach = 12;
  std::atomic<int> wrong{0}, failed{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    const bool rest = c % 2 == 0;
    clients.emplace_back([&, c, rest] {
      std::unique_ptr<client::Client> tcp;
      std::unique_ptr<httplib::Client> http;
      if (rest) {
        http = std::make_unique<httplib::Client>("127.0.0.1", daemon_->http_port());
        http->set_read_timeout(60, 0);
      } else {
        auto connected = client::Client::Connect(daemon_->address());
        if (!connected.ok()) {
          failed += kEach;
          return;
        }
        tcp = std::move(*connected);
      }
      for (int i = 0; i < kEach; ++i) {
        const std::string& m = models[(c + i) % 2];
        const int seed = (c + i) % 4;
        std::vector<float> got;
        if (rest) {
          auto r = http->Post("/v2/models/" + m + "/infer", InferBody(Input(m, seed)),
                              "application/json");
          if (!r || r->status != 200) {
            ++failed;
            continue;
          }
          got = Body(r)["outputs"][0]["data"].get<std::vector<float>>();
        } else {
          auto r = tcp->Infer(m, {Input(m, seed)});
          if (!r.ok()) {
            ++failed;
            continue;
          }
          got = Floats(r->outputs[0]);
        }
        if (got != expected[{m, seed}]) ++wrong;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
}

// 429 once the GPU's queue is full, and 503 for a waiting infer request whose model was unloaded
// before its task started.
TEST(HttpLimitsE2eTest, AFullQueueIs429AndAnUnloadedWaitingInferIs503) {
  // tiny_cnn takes about 1.2 s to switch in at this cap: a window with one batch switching and
  // one queued behind it (inference never preempts inference).
  // One model at a time (no weights cache), so a batch of the other model switches, slowly.
  e2e::TestDaemon daemon({"--preload=tiny_cnn,tiny_mlp", "--standby-workers=1",
                          "--max-queued-tasks=2", "--bandwidth-cap=8000", "--weights-cache=false"});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  httplib::Client http("127.0.0.1", daemon.http_port());
  http.set_read_timeout(60, 0);
  auto state_of = [&](const std::string& model) {
    const json body = Body(http.Get("/v1/tasks"));
    for (const json& t : body["tasks"]) {
      if (t["model"] == model) return t["state"].get<std::string>();
    }
    return std::string();
  };
  auto await_state = [&](const std::string& model, const std::string& want) {
    for (int i = 0; i < 400 && state_of(model) != want; ++i) absl::SleepFor(absl::Milliseconds(5));
    return state_of(model);
  };
  struct Answer {
    int status = 0;
    std::string body;
  };
  auto infer_in_background = [&](const std::string& model, Answer& answer) {
    return std::thread([&, model] {
      httplib::Client own("127.0.0.1", daemon.http_port());
      own.set_read_timeout(60, 0);
      auto r = own.Post("/v2/models/" + model + "/infer", InferBody(Input(model, 1)),
                        "application/json");
      answer = {r ? r->status : -1, r ? r->body : ""};
    });
  };
  Answer switching, queued;
  std::thread a = infer_in_background("tiny_cnn", switching);
  const std::string a_state = await_state("tiny_cnn", "switching");
  std::thread b = infer_in_background("tiny_mlp", queued);
  const std::string b_state = await_state("tiny_mlp", "queued");
  auto full = http.Post("/v1/tasks", R"({"model": "tiny_mlp", "iterations": 3})",
                        "application/json");
  auto unloaded = http.Post("/v2/repository/models/tiny_mlp/unload", "", "application/json");
  a.join();
  b.join();
  ASSERT_EQ(a_state, "switching") << daemon.log();
  ASSERT_EQ(b_state, "queued") << daemon.log();
  EXPECT_EQ(full->status, 429) << full->body;
  EXPECT_TRUE(Body(full).contains("error"));
  EXPECT_EQ(unloaded->status, 200) << unloaded->body;
  EXPECT_EQ(switching.status, 200) << switching.body;
  EXPECT_EQ(queued.status, 503) << queued.body;
  const json error = json::parse(queued.body, nullptr, false);
  ASSERT_TRUE(error.is_object() && error.contains("error")) << queued.body;
  EXPECT_NE(error["error"].get<std::string>().find("unloaded before it started"),
            std::string::npos)
      << queued.body;
}

// The binary tensor data extension, as standard clients send it by default: a JSON header of
// Inference-Header-Content-Length bytes, then raw tensors; outputs asked for as binary come back
// the same way, byte for byte what the TCP client gets.
TEST_F(HttpE2eTest, BinaryTensorDataGivesTheTcpClientsBytes) {
  auto tcp = client::Client::Connect(daemon_->address());
  ASSERT_TRUE(tcp.ok());
  const proto::HostTensor in = Input("tiny_cnn", 9);
  auto expected = (*tcp)->Infer("tiny_cnn", {in});
  ASSERT_TRUE(expected.ok()) << expected.status();
  const std::string header =
      json{{"inputs",
            {{{"name", "input"},
              {"shape", in.shape},
              {"datatype", "FP32"},
              {"parameters", {{"binary_data_size", in.data.size()}}}}}},
           {"outputs", {{{"name", "output"}, {"parameters", {{"binary_data", true}}}}}}}
          .dump();
  const std::string body = header + std::string(in.data.begin(), in.data.end());
  auto r = http_->Post("/v2/models/tiny_cnn/infer",
                       {{"Inference-Header-Content-Length", std::to_string(header.size())}}, body,
                       "application/octet-stream");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  size_t json_bytes = 0;
  ASSERT_TRUE(absl::SimpleAtoi(r->get_header_value("Inference-Header-Content-Length"), &json_bytes));
  const json out = json::parse(r->body.substr(0, json_bytes));
  const proto::HostTensor& want = expected->outputs[0];
  EXPECT_EQ(out["outputs"][0]["parameters"]["binary_data_size"], want.data.size());
  EXPECT_EQ(out["outputs"][0]["shape"], json(want.shape));
  EXPECT_EQ(r->body.substr(json_bytes), std::string(want.data.begin(), want.data.end()));

  // Sizes that do not add up are refused.
  auto bad = http_->Post("/v2/models/tiny_cnn/infer",
                         {{"Inference-Header-Content-Length", std::to_string(header.size())}},
                         body + "extra", "application/octet-stream");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
}

// One HTTP response read whole from a raw socket: its head and its body (Content-Length).
std::pair<std::string, std::string> ReadHttpResponse(int fd) {
  std::string in;
  char buf[65536];
  const absl::Time end = absl::Now() + absl::Seconds(30);
  size_t head_end = std::string::npos, length = 0;
  while (absl::Now() < end) {
    if (head_end == std::string::npos && (head_end = in.find("\r\n\r\n")) != std::string::npos) {
      const std::string head = absl::AsciiStrToLower(in.substr(0, head_end));
      const size_t at = head.find("\r\ncontent-length: ");
      if (at == std::string::npos) return {in, ""};
      (void)absl::SimpleAtoi(head.substr(at + 18, head.find("\r\n", at + 2) - at - 18), &length);
      head_end += 4;
    }
    if (head_end != std::string::npos && in.size() >= head_end + length) {
      return {in.substr(0, head_end), in.substr(head_end, length)};
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
  }
  return {in, ""};
}

// The binary extension's body received in place (its header first, its tensor bytes straight
// into a staging region): sent in many small writes, its answer is bit for bit the JSON path's
// and the TCP client's; the connection's staging region goes when the connection does, and a
// body cut short leaves none behind either. A declared body over the cap is refused unread.
TEST_F(HttpE2eTest, ABinaryBodyReceivedInPlaceAnswersAsTheJsonPathAndLeavesNoStaging) {
  auto tcp = client::Client::Connect(daemon_->address());
  ASSERT_TRUE(tcp.ok());
  const proto::HostTensor in = Input("tiny_cnn", 5);
  auto expected = (*tcp)->Infer("tiny_cnn", {in});
  ASSERT_TRUE(expected.ok()) << expected.status();
  const std::string want(expected->outputs[0].data.begin(), expected->outputs[0].data.end());
  const json binary_output = {{{"name", "output"}, {"parameters", {{"binary_data", true}}}}};
  // The JSON path, its output asked for as binary data.
  json as_json = json::parse(InferBody(in));
  as_json["outputs"] = binary_output;
  auto by_json = http_->Post("/v2/models/tiny_cnn/infer", as_json.dump(), "application/json");
  ASSERT_TRUE(by_json);
  ASSERT_EQ(by_json->status, 200) << by_json->body;
  size_t json_bytes = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(by_json->get_header_value("Inference-Header-Content-Length"), &json_bytes));
  EXPECT_TRUE(by_json->body.substr(json_bytes) == want);

  const std::string header = json{
      {"inputs",
       {{{"name", "input"},
         {"shape", in.shape},
         {"datatype", "FP32"},
         {"parameters", {{"binary_data_size", in.data.size()}}}}}},
      {"outputs", binary_output}}.dump();
  const std::string request = absl::StrCat(
      "POST /v2/models/tiny_cnn/infer HTTP/1.1\r\nHost: x\r\n",
      "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: ", header.size(),
      "\r\nContent-Length: ", header.size() + in.data.size(), "\r\n\r\n", header,
      std::string(in.data.begin(), in.data.end()));
  // The comparisons' connections go first, with their staging: the TCP client's is kept for
  // its connection and the JSON request's goes only once the server has closed its connection
  // (the client asked it to), at a moment a loaded machine can put after any count taken here.
  tcp->reset();
  http_.reset();
  const pid_t pid = daemon_->pid();
  for (int i = 0; i < 500 && StagingMappings(pid) > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  const int before = StagingMappings(pid);
  ASSERT_EQ(before, 0) << "staging left behind by connections that have closed";
  int fd = pswitch::testing::ConnectLoopback(daemon_->http_port());
  ASSERT_GE(fd, 0);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  for (int round = 0; round < 2; ++round) {  // the second reuses the connection's region
    for (size_t at = 0; at < request.size(); at += 61) {
      ASSERT_EQ(
          ::send(fd, request.data() + at, std::min<size_t>(61, request.size() - at), MSG_NOSIGNAL),
          static_cast<ssize_t>(std::min<size_t>(61, request.size() - at)));
      if (at % 6100 == 0) absl::SleepFor(absl::Microseconds(200));
    }
    auto [head, body] = ReadHttpResponse(fd);
    ASSERT_NE(head.find("200 OK"), std::string::npos) << head << body;
    const size_t at = absl::AsciiStrToLower(head).find("inference-header-content-length: ");
    ASSERT_NE(at, std::string::npos) << head;
    size_t n = 0;
    ASSERT_TRUE(absl::SimpleAtoi(head.substr(at + 33, head.find("\r\n", at) - at - 33), &n));
    EXPECT_TRUE(body.substr(n) == want)
        << "round " << round << " got " << body.size() - n << " bytes, want " << want.size() << ": "
        << absl::BytesToHexString(body.substr(n, 16)) << " vs "
        << absl::BytesToHexString(want.substr(0, 16));
    EXPECT_EQ(json::parse(body.substr(0, n))["outputs"][0]["shape"],
              json(expected->outputs[0].shape));
  }
  EXPECT_EQ(StagingMappings(pid), before + 1) << "one region, kept for the connection";
  ::close(fd);
  for (int i = 0; i < 200 && StagingMappings(pid) > before; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(StagingMappings(pid), before) << "the connection's staging went with it";

  // Cut short: half the tensor's bytes, then the client goes.
  fd = pswitch::testing::ConnectLoopback(daemon_->http_port());
  ASSERT_GE(fd, 0);
  const size_t cut = request.size() - in.data.size() / 2;
  ASSERT_EQ(::send(fd, request.data(), cut, MSG_NOSIGNAL), static_cast<ssize_t>(cut));
  for (int i = 0; i < 200 && StagingMappings(pid) == before; ++i)
    absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(StagingMappings(pid), before + 1) << "the body was being received into staging";
  ::close(fd);
  for (int i = 0; i < 200 && StagingMappings(pid) > before; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(StagingMappings(pid), before) << "a body cut short leaves no staging behind";

  // Declared over the body cap: refused on its headers, the body never sent.
  fd = pswitch::testing::ConnectLoopback(daemon_->http_port());
  ASSERT_GE(fd, 0);
  const std::string huge =
      absl::StrCat("POST /v2/models/tiny_cnn/infer HTTP/1.1\r\nHost: x\r\n",
                   "Inference-Header-Content-Length: ", header.size(),
                   "\r\nContent-Length: ", uint64_t{1} << 40, "\r\n\r\n", header);
  ASSERT_EQ(::send(fd, huge.data(), huge.size(), MSG_NOSIGNAL), static_cast<ssize_t>(huge.size()));
  auto [head, body] = ReadHttpResponse(fd);
  EXPECT_NE(head.find(" 413 "), std::string::npos) << head << body;
  ::close(fd);
  EXPECT_EQ(StagingMappings(pid), before);
}

TEST_F(HttpE2eTest, BadRequestsGetJsonErrorsWithTheirStatusCodes) {
  const proto::HostTensor in = Input("tiny_mlp", 1);
  struct Case {
    std::string path, body;
    int status;
  };
  json wrong_type = json::parse(InferBody(in));
  wrong_type["inputs"][0]["datatype"] = "FP64";
  json short_data = json::parse(InferBody(in));
  short_data["inputs"][0]["data"] = {1.0, 2.0};
  const std::vector<Case> cases = {
      {"/v2/models/tiny_mlp/infer", "{not json", 400},
      {"/v2/models/tiny_mlp/infer", std::string(30000, '[') + std::string(30000, ']'), 400},
      {"/v2/models/tiny_mlp/infer", R"({"inputs": 3})", 400},
      {"/v2/models/tiny_mlp/infer", wrong_type.dump(), 400},
      {"/v2/models/tiny_mlp/infer", short_data.dump(), 400},
      {"/v2/models/nope/infer", InferBody(in), 404},
      {"/v2/models/tiny_mlp/infer", std::string(100000, ' '), 413},  // over --max-frame-bytes
  };
  for (const Case& c : cases) {
    auto r = http_->Post(c.path, c.body, "application/json");
    ASSERT_TRUE(r) << c.path;
    EXPECT_EQ(r->status, c.status) << c.body.substr(0, 60) << " -> " << r->body;
    EXPECT_TRUE(Body(r).contains("error")) << r->body;
  }
  // Still serving.
  auto r = http_->Post("/v2/models/tiny_mlp/infer", InferBody(in), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// With --auth-tokens, every route but the health probes needs Authorization: Bearer.
TEST(HttpAuthE2eTest, TokensGuardEverythingButHealth) {
  TokenFile tokens("user-token-bob-0123456789 bob user\n");
  e2e::TestDaemon daemon({"--preload=tiny_mlp", "--standby-workers=0", tokens.flag()});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  httplib::Client http("127.0.0.1", daemon.http_port());
  auto live = http.Get("/v2/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  auto refused = http.Get("/v2/models/tiny_mlp");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_TRUE(Body(refused).contains("error"));
  auto wrong = http.Get("/v2/models/tiny_mlp", {{"Authorization", "Bearer user-token-bob-0123456780"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto allowed = http.Get("/v2/models/tiny_mlp", {{"Authorization", "Bearer user-token-bob-0123456789"}});
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->status, 200) << allowed->body;
}

// pswitch's own v1 resources: training tasks submitted, polled, listed and cancelled over HTTP,
// each user seeing only its own, as on the TCP port.
TEST(HttpTasksE2eTest, TrainingTasksAreSubmittedPolledListedAndCancelled) {
  TokenFile tokens(e2e::kThreeTokens);
  e2e::TestDaemon daemon({"--preload=tiny_mlp", "--standby-workers=1", tokens.flag()});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  httplib::Client http("127.0.0.1", daemon.http_port());
  const httplib::Headers bob = {{"Authorization", "Bearer user-token-bob-0123456789"}};
  const httplib::Headers carol = {{"Authorization", "Bearer user-token-carol-0123456789"}};
  auto state_of = [&](uint64_t id, const httplib::Headers& who) {
    auto r = http.Get("/v1/tasks/" + std::to_string(id), who);
    return r && r->status == 200 ? Body(r)["state"].get<std::string>() : std::string("?");
  };
  auto await_state = [&](uint64_t id, const std::string& want) {
    std::string state;
    for (int i = 0; i < 600 && state != want; ++i) {
      state = state_of(id, bob);
      if (state != want) absl::SleepFor(absl::Milliseconds(50));
    }
    return state;
  };

  // A user may not change a shared model for everyone: it trains a copy of its own.
  auto refused = http.Post("/v1/tasks", bob,
                           R"({"model": "tiny_mlp", "iterations": 3, "optimizer": "adam"})",
                           "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 403) << refused->body;
  auto submitted = http.Post(
      "/v1/tasks", bob,
      R"({"model": "tiny_mlp", "iterations": 3, "optimizer": "adam", "as_model": "bob_mlp"})",
      "application/json");
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 202) << submitted->body;
  EXPECT_EQ(Body(submitted)["model"], "bob_mlp");
  const uint64_t id = Body(submitted)["task_id"].get<uint64_t>();
  EXPECT_EQ(submitted->get_header_value("Location"), "/v1/tasks/" + std::to_string(id));
  EXPECT_EQ(await_state(id, "succeeded"), "succeeded")
      << http.Get("/v1/tasks/" + std::to_string(id), bob)->body << daemon.log();
  // Another user's task is as good as absent.
  auto hidden = http.Get("/v1/tasks/" + std::to_string(id), carol);
  ASSERT_TRUE(hidden);
  EXPECT_EQ(hidden->status, 404);
  auto bobs = http.Get("/v1/tasks", bob);
  auto carols = http.Get("/v1/tasks", carol);
  ASSERT_TRUE(bobs && carols);
  EXPECT_FALSE(Body(bobs)["tasks"].empty());
  EXPECT_TRUE(Body(carols)["tasks"].empty()) << carols->body;

  // Its copy is its own: it trains it in place; nobody else sees it.
  auto endless = http.Post("/v1/tasks", bob, R"({"model": "bob_mlp", "iterations": 1000000})",
                           "application/json");
  ASSERT_TRUE(endless);
  ASSERT_EQ(endless->status, 202) << endless->body;
  const uint64_t long_id = Body(endless)["task_id"].get<uint64_t>();
  EXPECT_EQ(await_state(long_id, "running"), "running");
  // Cancelled once it has done some iterations: "running" comes before the first one ends, and
  // on a loaded machine that can take a while.
  auto iterations_done = [&] {
    auto r = http.Get("/v1/tasks/" + std::to_string(long_id), bob);
    return r && r->status == 200 ? Body(r)["iterations_done"].get<uint64_t>() : 0;
  };
  for (int i = 0; i < 600 && iterations_done() == 0; ++i) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_GT(iterations_done(), 0u);
  auto cancelled = http.Delete("/v1/tasks/" + std::to_string(long_id), bob);
  ASSERT_TRUE(cancelled);
  EXPECT_EQ(cancelled->status, 202) << cancelled->body;
  EXPECT_EQ(await_state(long_id, "cancelled"), "cancelled");
  auto task_after = http.Get("/v1/tasks/" + std::to_string(long_id), bob);
  ASSERT_TRUE(task_after);
  EXPECT_GT(Body(task_after)["iterations_done"].get<uint64_t>(), 0u) << task_after->body;
  EXPECT_EQ(http.Get("/v2/models/bob_mlp", bob)->status, 200);
  EXPECT_EQ(http.Get("/v2/models/bob_mlp", carol)->status, 404);
  auto carol_index = http.Post("/v2/repository/index", carol, "", "application/json");
  ASSERT_TRUE(carol_index);
  EXPECT_EQ(carol_index->body.find("bob_mlp"), std::string::npos) << carol_index->body;
  auto bob_index = http.Post("/v2/repository/index", bob, "", "application/json");
  ASSERT_TRUE(bob_index);
  EXPECT_NE(bob_index->body.find("bob_mlp"), std::string::npos) << bob_index->body;
  const std::string row = R"({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                                          "data": [0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}]})";
  EXPECT_EQ(http.Post("/v2/models/bob_mlp/infer", carol, row, "application/json")->status, 404);
  EXPECT_EQ(http.Post("/v2/repository/models/bob_mlp/unload", carol, "", "application/json")->status,
            404);
  EXPECT_EQ(http.Post("/v2/repository/models/tiny_mlp/unload", bob, "", "application/json")->status,
            403);
  auto unloaded = http.Post("/v2/repository/models/bob_mlp/unload", bob, "", "application/json");
  ASSERT_TRUE(unloaded);
  EXPECT_EQ(unloaded->status, 200) << unloaded->body;
  EXPECT_EQ(http.Get("/v2/models/bob_mlp", bob)->status, 404);

  for (const auto& [body, status] : std::vector<std::pair<std::string, int>>{
           {"[1]", 400},
           {R"({"model": "tiny_mlp", "iterations": "many"})", 400},
           {R"({"model": "tiny_mlp", "optimizer": "rmsprop"})", 400},
           {R"({"model": "nope", "iterations": 1})", 404}}) {
    auto r = http.Post("/v1/tasks", bob, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    EXPECT_TRUE(Body(r).contains("error"));
  }
}


// Prometheus text exposition, read strictly: every sample belongs to a family declared by HELP
// and TYPE lines before it, label values are validly escaped, and each histogram series' buckets
// are cumulative and end at +Inf equal to its _count. Returns samples by "name{labels}".
std::map<std::string, double> ParsePrometheusText(const std::string& text) {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
  std::string helped;
  std::map<std::string, std::vector<std::pair<double, double>>> buckets;  // series -> (le, v)
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("# HELP ", 0) == 0) {
      helped = line.substr(7, line.find(' ', 7) - 7);
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_EQ(name, helped) << "TYPE without its HELP: " << line;
      const std::string type = line.substr(line.find(' ', 7) + 1);
      EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram") << line;
      types[name] = type;
      continue;
    }
    EXPECT_NE(line[0], '#') << line;
    // name{k="v",...} value
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    EXPECT_NE(space, std::string::npos) << line;
    std::string name = line.substr(0, std::min(brace, space));
    std::string labels;
    std::string le;
    if (brace != std::string::npos) {
      size_t i = brace + 1;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        EXPECT_NE(eq, std::string::npos) << line;
        const std::string key = line.substr(i, eq - i);
        EXPECT_EQ(line[eq + 1], '"') << line;
        std::string value;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\') {
            ++j;
            EXPECT_TRUE(line[j] == '\\' || line[j] == '"' || line[j] == 'n') << "bad escape: " << line;
          }
          value += line[j];
        }
        EXPECT_LT(j, line.size()) << "unterminated label value: " << line;
        if (key == "le") {
          le = value;
        } else {
          labels += key + "=" + value + ",";
        }
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
    }
    double value = 0;
    EXPECT_TRUE(absl::SimpleAtod(line.substr(space + 1), &value)) << line;
    // The family a sample belongs to: histograms add _bucket, _sum and _count.
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx(suffix);
      if (!types.count(family) && name.size() > sfx.size() &&
          name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0 &&
          types.count(name.substr(0, name.size() - sfx.size())) &&
          types[name.substr(0, name.size() - sfx.size())] == "histogram") {
        family = name.substr(0, name.size() - sfx.size());
      }
    }
    EXPECT_TRUE(types.count(family)) << "sample of an undeclared family: " << line;
    if (name == family + "_bucket") {
      double bound = 0;
      if (le == "+Inf") {
        bound = std::numeric_limits<double>::infinity();
      } else {
        EXPECT_TRUE(absl::SimpleAtod(le, &bound)) << line;
      }
      buckets[family + "{" + labels + "}"].push_back({bound, value});
      continue;
    }
    samples[name + "{" + labels + "}"] = value;
  }
  for (const auto& [series, bs] : buckets) {
    if (bs.empty()) continue;  // a series appears only with a bucket
    for (size_t i = 1; i < bs.size(); ++i) {
      EXPECT_LT(bs[i - 1].first, bs[i].first) << series << ": bucket bounds not increasing";
      EXPECT_LE(bs[i - 1].second, bs[i].second) << series << ": buckets not cumulative";
    }
    EXPECT_TRUE(std::isinf(bs.back().first)) << series << ": last bucket is not +Inf";
    const std::string count = series.substr(0, series.find('{')) + "_count" +
                              series.substr(series.find('{'));
    EXPECT_EQ(bs.back().second, samples[count]) << series << ": +Inf bucket != _count";
  }
  return samples;
}

TEST(ParsePrometheusTextTest, RefusesWhatAStrictScraperWouldRefuse) {
  // The checker itself must fail on broken input, or the metrics test proves nothing.
  EXPECT_NONFATAL_FAILURE(ParsePrometheusText("x_total 1\n"), "undeclared family");
  EXPECT_NONFATAL_FAILURE(
      ParsePrometheusText("# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                          "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"),
      "not cumulative");
  EXPECT_NONFATAL_FAILURE(
      ParsePrometheusText("# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"),
      "not +Inf");
  EXPECT_NONFATAL_FAILURE(ParsePrometheusText("# HELP g x\n# TYPE g gauge\ng{a=\"\\q\"} 1\n"),
                          "bad escape");
}

// The operator's side of the HTTP port: GPUs, bubble cycles and fill jobs.
TEST(HttpOperationsE2eTest, GpusBubbleCyclesAndFillJobs) {
  TokenFile tokens(e2e::kThreeTokens);
  e2e::TestDaemon daemon({"--preload=tiny_mlp", "--standby-workers=1", tokens.flag()});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  httplib::Client http("127.0.0.1", daemon.http_port());
  http.set_read_timeout(60, 0);
  const httplib::Headers admin = {{"Authorization", "Bearer admin-token-0123456789"}};
  const httplib::Headers bob = {{"Authorization", "Bearer user-token-bob-0123456789"}};
  auto infer = http.Post("/v2/models/tiny_mlp/infer", admin, InferBody(Input("tiny_mlp", 1)),
                         "application/json");
  ASSERT_TRUE(infer);
  ASSERT_EQ(infer->status, 200) << infer->body;

  // GET /v1/gpus: the resident model, live worker processes, the arena adding up.
  EXPECT_EQ(http.Get("/v1/gpus")->status, 401);
  auto gpus = http.Get("/v1/gpus", bob);  // any role may look
  ASSERT_TRUE(gpus);
  ASSERT_EQ(gpus->status, 200) << gpus->body;
  json g = Body(gpus)["gpus"];
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0]["gpu"], 0);
  EXPECT_EQ(g[0]["resident_model"], "tiny_mlp");
  ASSERT_EQ(g[0]["workers"].size(), 2u);
  int active = 0;
  for (const json& w : g[0]["workers"]) {
    const int pid = w["pid"].get<int>();
    EXPECT_GT(pid, 0);
    EXPECT_EQ(kill(pid, 0), 0) << "worker " << pid << " is not a live process";
    active += w["role"] == "active" ? 1 : 0;
  }
  EXPECT_EQ(active, 1);
  EXPECT_EQ(g[0]["arena_used_bytes"].get<uint64_t>() + g[0]["arena_free_bytes"].get<uint64_t>(),
            g[0]["arena_bytes"].get<uint64_t>());
  EXPECT_GT(g[0]["arena_used_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(g[0]["queue_depth"], 0);
  EXPECT_TRUE(g[0]["bubble_cycle"].is_null());

  // PUT a bubble cycle: admin only, validated, then shown on the GPU.
  const std::string cycle =
      R"({"period_ns": 100000000, "bubbles": [{"offset_ns": 10000000, "duration_ns": 30000000, "free_bytes": 1000000}]})";
  EXPECT_EQ(http.Put("/v1/gpus/0/bubble-cycle", bob, cycle, "application/json")->status, 403);
  EXPECT_EQ(http.Put("/v1/gpus/7/bubble-cycle", admin, cycle, "application/json")->status, 404);
  EXPECT_EQ(http.Put("/v1/gpus/0/bubble-cycle", admin, "{\"period_ns\": 10", "application/json")
                ->status,
            400);
  auto past = http.Put("/v1/gpus/0/bubble-cycle", admin,
                       R"({"period_ns": 1000, "bubbles": [{"offset_ns": 0, "duration_ns": 2000, "free_bytes": 0}]})",
                       "application/json");
  EXPECT_EQ(past->status, 400) << past->body;
  auto put = http.Put("/v1/gpus/0/bubble-cycle", admin, cycle, "application/json");
  ASSERT_EQ(put->status, 200) << put->body;
  g = Body(http.Get("/v1/gpus", admin))["gpus"];
  EXPECT_EQ(g[0]["bubble_cycle"]["period_ns"], 100000000);
  EXPECT_EQ(g[0]["bubble_cycle"]["bubbles"][0]["duration_ns"], 30000000);

  // Fill jobs: estimate, submit (201 + Location), query, cancel; errors with their codes.
  const std::string job =
      R"({"kind": "synthetic", "steps": 5, "synthetic_step_us": 1000, "memory_bytes": 1000})";
  EXPECT_EQ(http.Post("/v1/fill/jobs", bob, job, "application/json")->status, 403);
  auto estimate = http.Post("/v1/fill/estimate", admin, job, "application/json");
  ASSERT_EQ(estimate->status, 200) << estimate->body;
  EXPECT_GT(Body(estimate)["predicted_remaining_s"].get<double>(), 0);
  EXPECT_EQ(http.Post("/v1/fill/jobs", admin, R"({"kind": "bogus"})", "application/json")->status,
            400);
  EXPECT_EQ(http.Post("/v1/fill/jobs", admin, R"({"kind": "synthetic", "stepz": 5})",
                      "application/json")->status,
            400);
  EXPECT_EQ(http.Post("/v1/fill/jobs", admin, R"({"kind": "synthetic", "steps": "5"})",
                      "application/json")->status,
            400);
  auto submitted = http.Post("/v1/fill/jobs", admin, job, "application/json");
  ASSERT_EQ(submitted->status, 201) << submitted->body;
  const uint64_t id = Body(submitted)["job_id"].get<uint64_t>();
  EXPECT_EQ(submitted->get_header_value("Location"), "/v1/fill/jobs/" + std::to_string(id));
  auto queried = http.Get("/v1/fill/jobs/" + std::to_string(id), admin);
  ASSERT_EQ(queried->status, 200);
  EXPECT_EQ(Body(queried)["steps_total"], 5);
  EXPECT_EQ(http.Get("/v1/fill/jobs/999", admin)->status, 404);
  EXPECT_EQ(http.Get("/v1/fill/jobs/abc", admin)->status, 404);
  auto cancelled = http.Delete("/v1/fill/jobs/" + std::to_string(id), admin);
  ASSERT_EQ(cancelled->status, 200) << cancelled->body;
  EXPECT_EQ(Body(cancelled)["state"], "STOPPED");
  EXPECT_EQ(http.Delete("/v1/fill/jobs/" + std::to_string(id), admin)->status, 409);
  auto stats = http.Get("/v1/fill/stats", admin);
  ASSERT_EQ(stats->status, 200);
  EXPECT_TRUE(Body(stats).contains("pause_p99_seconds"));
}

// GET /metrics after real work: a strict Prometheus parse, and counts that match what was done.
TEST(HttpMetricsE2eTest, AScrapeIsStrictPrometheusTextAndCountsWhatHappened) {
  e2e::TestDaemon daemon({"--preload=tiny_cnn,tiny_mlp", "--standby-workers=1"});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  httplib::Client http("127.0.0.1", daemon.http_port());
  http.set_read_timeout(60, 0);
  // Start-up's own requests (the preload's check) count too: compare with a scrape before.
  const std::string latency_count =
      "pswitch_task_latency_seconds_count{gpu=0,kind=inference,model=tiny_mlp,}";
  auto before = http.Get("/metrics");
  ASSERT_TRUE(before);
  const double done_before = ParsePrometheusText(before->body)[latency_count];
  // A long training task, then inferences that preempt it (each switches tiny_mlp in).
  auto training = http.Post("/v1/tasks", R"({"model": "tiny_cnn", "iterations": 1000000})",
                            "application/json");
  ASSERT_EQ(training->status, 202) << training->body;
  const uint64_t task = Body(training)["task_id"].get<uint64_t>();
  for (int i = 0; i < 100; ++i) {
    auto t = http.Get("/v1/tasks/" + std::to_string(task));
    if (t && Body(t)["state"] == "running") break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  constexpr int kInferences = 3;
  for (int i = 0; i < kInferences; ++i) {
    auto r = http.Post("/v2/models/tiny_mlp/infer", InferBody(Input("tiny_mlp", 1)),
                       "application/json");
    ASSERT_EQ(r->status, 200) << r->body;
  }
  auto scrape = http.Get("/metrics");
  ASSERT_TRUE(scrape);
  ASSERT_EQ(scrape->status, 200) << scrape->body;
  EXPECT_EQ(scrape->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  std::map<std::string, double> m = ParsePrometheusText(scrape->body);
  EXPECT_EQ(m[latency_count] - done_before, kInferences) << scrape->body;
  EXPECT_GE(m["pswitch_switches_total{gpu=0,model=tiny_mlp,}"], 1);
  EXPECT_GE(m["pswitch_preemptions_total{gpu=0,}"], 1);
  EXPECT_GT(m["pswitch_transmitted_bytes_total{gpu=0,}"], 0);
  EXPECT_EQ(m["pswitch_worker_kills_total{gpu=0,}"], 0);
  EXPECT_GT(m["pswitch_arena_used_bytes{gpu=0,}"], 0);
  EXPECT_EQ(m.count("pswitch_queue_depth{gpu=0,}"), 1u);
  EXPECT_EQ(m.count("pswitch_fill_jobs{state=PAUSED,}"), 1u);
  // Every phase histogram that exists comes with a count.
  EXPECT_GE(m["pswitch_switch_phase_seconds_count{gpu=0,model=tiny_mlp,phase=result,}"], 1);
  EXPECT_EQ(http.Delete("/v1/tasks/" + std::to_string(task))->status, 202);
}


// GET /v1/trace: a Chrome trace-event timeline of the last seconds, with the switch's copies on
// the copy track, tasks on worker tracks and the preemption, in time order.
TEST(HttpTraceE2eTest, TheTraceShowsCopiesTasksAndPreemptionsInTimeOrder) {
  TokenFile tokens(e2e::kThreeTokens);
  e2e::TestDaemon daemon({"--preload=tiny_cnn,tiny_mlp", "--standby-workers=1", tokens.flag()});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  httplib::Client http("127.0.0.1", daemon.http_port());
  http.set_read_timeout(60, 0);
  const httplib::Headers admin = {{"Authorization", "Bearer admin-token-0123456789"}};
  const httplib::Headers bob = {{"Authorization", "Bearer user-token-bob-0123456789"}};
  auto training = http.Post("/v1/tasks", admin, R"({"model": "tiny_cnn", "iterations": 1000000})",
                            "application/json");
  ASSERT_EQ(training->status, 202) << training->body;
  const uint64_t task = Body(training)["task_id"].get<uint64_t>();
  for (int i = 0; i < 100; ++i) {
    auto t = http.Get("/v1/tasks/" + std::to_string(task), admin);
    if (t && Body(t)["state"] == "running") break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  for (int i = 0; i < 2; ++i) {
    auto r = http.Post("/v2/models/tiny_mlp/infer", admin, InferBody(Input("tiny_mlp", 1)),
                       "application/json");
    ASSERT_EQ(r->status, 200) << r->body;
  }
  // tiny_mlp with a group per layer: its run shows each group's compute from its gate.
  const std::string plan = (daemon.dir() / "per-layer.json").string();
  std::ofstream(plan) << R"({"groups": [[0, 0], [1, 1], [2, 2]]})";
  client::ClientOptions options;
  options.token = "admin-token-0123456789";
  auto tcp = client::Client::Connect(daemon.address(), options);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  auto three = (*tcp)->Register({"mlp3", "tiny_mlp", "", 1, plan});
  ASSERT_TRUE(three.ok()) << three.status();
  ASSERT_EQ(three->groups, 3u);
  auto grouped = http.Post("/v2/models/mlp3/infer", admin, InferBody(Input("tiny_mlp", 1)),
                           "application/json");
  ASSERT_EQ(grouped->status, 200) << grouped->body;
  EXPECT_EQ(http.Get("/v1/trace?seconds=10", bob)->status, 403);  // every user's tasks are in it
  EXPECT_EQ(http.Get("/v1/trace?seconds=0", admin)->status, 400);
  EXPECT_EQ(http.Get("/v1/trace?seconds=601", admin)->status, 400);
  auto r = http.Get("/v1/trace?seconds=60", admin);
  ASSERT_EQ(r->status, 200) << r->body;
  const json trace = json::parse(r->body);
  ASSERT_TRUE(trace["traceEvents"].is_array());
  std::map<int, std::string> tracks;  // tid -> name
  bool gpu_named = false;
  double last_ts = -1;
  int copies = 0, mlp_runs = 0, preempts = 0;
  std::map<std::string, std::vector<std::string>> groups_seen;  // task -> its group spans
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "M") {
      if (e["name"] == "thread_name") tracks[e["tid"].get<int>()] = e["args"]["name"];
      if (e["name"] == "process_name") gpu_named |= e["args"]["name"] == "GPU 0";
      continue;
    }
    EXPECT_EQ(e["pid"], 0);
    ASSERT_TRUE(tracks.count(e["tid"].get<int>())) << "event on an unnamed track: " << e.dump();
    const double ts = e["ts"].get<double>();
    EXPECT_GE(ts, last_ts) << "events out of time order: " << e.dump();
    last_ts = ts;
    const std::string& track = tracks[e["tid"].get<int>()];
    if (e["ph"] == "X") {
      EXPECT_GE(e["dur"].get<double>(), 0) << e.dump();
    }
    if (track == "copy") {
      EXPECT_EQ(e["name"].get<std::string>().rfind("group ", 0), 0u) << e.dump();
      copies += e["args"]["model"] == "tiny_mlp" ? 1 : 0;
    }
    if (track.rfind("worker ", 0) == 0 && e["name"].get<std::string>().rfind("tiny_mlp (task", 0) == 0) {
      ++mlp_runs;
    }
    if (track == "scheduler" && e["name"] == "preempt") ++preempts;
    // Each group's compute on its worker, from its gate's release, in group order.
    if (track.rfind("worker ", 0) == 0 && e["name"].get<std::string>().rfind("group ", 0) == 0) {
      const std::string task_of = e["args"]["task"];
      groups_seen[task_of].push_back(e["name"]);
    }
  }
  // pswitchctl trace saves the same to a new file, and never replaces one.
  const std::string ctl = (std::filesystem::path(PSWITCHD_PATH).parent_path() / "pswitchctl").string();
  const std::string out = "/tmp/pswitch-trace-" + std::to_string(getpid()) + ".json";
  std::filesystem::remove(out);
  const std::string command = ctl + " trace --http 127.0.0.1:" + std::to_string(daemon.http_port()) +
                              " --token admin-token-0123456789 --seconds 60 --out " + out +
                              " > /dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream saved(out);
  const json file = json::parse(saved, nullptr, false);
  ASSERT_FALSE(file.is_discarded());
  EXPECT_GT(file["traceEvents"].size(), 0u);
  const auto size = std::filesystem::file_size(out);
  EXPECT_NE(std::system(command.c_str()), 0) << "an existing file was replaced";
  EXPECT_EQ(std::filesystem::file_size(out), size);
  std::filesystem::remove(out);

  EXPECT_TRUE(gpu_named);
  EXPECT_GE(copies, 1) << r->body;
  EXPECT_GE(mlp_runs, 2) << r->body;
  EXPECT_GE(preempts, 1) << r->body;
  const std::vector<std::string> three_groups = {"group 0", "group 1", "group 2"};
  EXPECT_TRUE(std::any_of(groups_seen.begin(), groups_seen.end(),
                          [&](const auto& task) { return task.second == three_groups; }))
      << r->body;
  for (const auto& [task_of, names] : groups_seen) {
    EXPECT_EQ(names.front(), "group 0") << "task " << task_of;
  }
  EXPECT_EQ(http.Delete("/v1/tasks/" + std::to_string(task), admin)->status, 202);
}

// Triton's repository extension: index, then explicit loads (--load-repository=false), with a
// config in place of the folder's, the files it names still confined to the model's folder.
TEST(HttpRepositoryE2eTest, IndexAndLoadFollowTritonsRepositoryExtension) {
  char tmpl[] = "/tmp/pswitch-http-repo-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::filesystem::path repo = tmpl;
  std::filesystem::create_directories(repo / "mlp");
  std::filesystem::create_directories(repo / "cnn");
  std::ofstream(repo / "mlp" / "config.json") << R"({"architecture": "tiny_mlp", "batch": 2})";
  std::ofstream(repo / "cnn" / "config.json") << R"({"architecture": "tiny_cnn", "batch": 2})";
  TokenFile tokens(e2e::kThreeTokens);
  e2e::TestDaemon daemon({"--preload=", "--standby-workers=1", tokens.flag(),
                          "--model-repository=" + repo.string(), "--load-repository=false"});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  httplib::Client http("127.0.0.1", daemon.http_port());
  http.set_read_timeout(120, 0);
  const httplib::Headers admin = {{"Authorization", "Bearer admin-token-0123456789"}};
  const httplib::Headers bob = {{"Authorization", "Bearer user-token-bob-0123456789"}};
  auto index = http.Post("/v2/repository/index", bob, "", "application/json");
  ASSERT_EQ(index->status, 200) << index->body;
  EXPECT_EQ(Body(index), json::parse(R"([
      {"name": "cnn", "version": "1", "state": "UNAVAILABLE", "reason": "not loaded"},
      {"name": "mlp", "version": "1", "state": "UNAVAILABLE", "reason": "not loaded"}])"));
  EXPECT_EQ(Body(http.Post("/v2/repository/index", bob, R"({"ready": true})", "application/json")),
            json::array());

  EXPECT_EQ(http.Post("/v2/repository/models/mlp/load", bob, "", "application/json")->status, 403);
  EXPECT_EQ(http.Post("/v2/repository/models/ghost/load", admin, "", "application/json")->status,
            404);
  auto loaded = http.Post("/v2/repository/models/mlp/load", admin, "", "application/json");
  ASSERT_EQ(loaded->status, 200) << loaded->body;
  EXPECT_EQ(http.Post("/v2/repository/models/mlp/load", admin, "", "application/json")->status,
            409);
  auto infer = http.Post("/v2/models/mlp/infer", bob, InferBody(Input("tiny_mlp", 2)),
                         "application/json");
  EXPECT_EQ(infer->status, 200) << infer->body;

  // A config that names a file outside the model's folder is refused, and nothing is loaded.
  auto escape = http.Post(
      "/v2/repository/models/cnn/load", admin,
      json{{"parameters", {{"config", R"({"architecture": "tiny_cnn", "weights": "../mlp/config.json"})"}}}}
          .dump(),
      "application/json");
  EXPECT_EQ(escape->status, 400) << escape->body;
  EXPECT_EQ(http.Get("/v2/models/cnn/ready", bob)->status, 404);
  auto bad_type = http.Post("/v2/repository/models/cnn/load", admin,
                            R"({"parameters": {"config": 5}})", "application/json");
  EXPECT_EQ(bad_type->status, 400) << bad_type->body;
  auto with_config = http.Post(
      "/v2/repository/models/cnn/load", admin,
      json{{"parameters", {{"config", R"({"architecture": "tiny_cnn", "batch": 4})"}}}}.dump(),
      "application/json");
  ASSERT_EQ(with_config->status, 200) << with_config->body;
  index = http.Post("/v2/repository/index", bob, R"({"ready": true})", "application/json");
  EXPECT_EQ(Body(index).size(), 2u) << index->body;
  (void)base::RemoveTree(repo);
}

// Issue 28: a model being registered is in the index as LOADING, its reason what it has done so
// far, until its workers have it; then READY.
TEST(HttpRepositoryE2eTest, TheIndexShowsARegistrationUnderWayAsLoadingWithItsPhases) {
  char tmpl[] = "/tmp/pswitch-http-repo-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::filesystem::path repo = tmpl;
  std::filesystem::create_directories(repo / "r18");
  std::ofstream(repo / "r18" / "config.json") << R"({"architecture": "resnet18", "batch": 2})";
  e2e::TestDaemon daemon({"--preload=", "--standby-workers=0",
                          "--model-repository=" + repo.string(), "--load-repository=false"});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  std::thread load([&] {
    httplib::Client loader("127.0.0.1", daemon.http_port());
    loader.set_read_timeout(120, 0);
    auto loaded = loader.Post("/v2/repository/models/r18/load", "", "application/json");
    ASSERT_TRUE(loaded);
    EXPECT_EQ(loaded->status, 200) << loaded->body;
  });
  httplib::Client http("127.0.0.1", daemon.http_port());
  std::set<std::string> reasons;
  for (int i = 0; i < 3000; ++i) {
    auto index = http.Post("/v2/repository/index", "", "application/json");
    ASSERT_TRUE(index && index->status == 200);
    const json list = Body(index);
    ASSERT_EQ(list.size(), 1u) << index->body;
    if (list[0]["state"] == "READY") break;
    if (list[0]["state"] == "LOADING") {
      reasons.insert(list[0]["reason"].get<std::string>());
      // Not ready while it loads, even once the catalog has it: listed as ready only once a
      // full index taken after says READY too.
      const json ready =
          Body(http.Post("/v2/repository/index", R"({"ready": true})", "application/json"));
      if (!ready.empty()) {
        EXPECT_EQ(Body(http.Post("/v2/repository/index", "", "application/json"))[0]["state"],
                  "READY");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  load.join();
  ASSERT_FALSE(reasons.empty()) << "never seen loading";
  // What it has done so far, phase by phase: some reason names a finished phase.
  bool named_a_phase = false, named_a_step = false;
  for (const std::string& r : reasons) {
    EXPECT_TRUE(absl::StartsWith(r, "registering") || absl::StartsWith(r, "loading on the workers"))
        << r;
    named_a_phase |= absl::StrContains(r, "inspect ");
    // And how far the running inspection had come: "registering (read 0.00 s; inspect: ...)".
    named_a_step |= absl::StrContains(r, "inspect: ");
  }
  EXPECT_TRUE(named_a_phase) << absl::StrJoin(reasons, " | ");
  EXPECT_TRUE(named_a_step) << absl::StrJoin(reasons, " | ");
  auto index = http.Post("/v2/repository/index", "", "application/json");
  EXPECT_EQ(Body(index), json::parse(R"([{"name": "r18", "version": "1", "state": "READY",
                                          "reason": ""}])"));
  (void)base::RemoveTree(repo);
}

// A sample's value in a scrape ("name" or "name{labels}"); NaN when absent.
double Sample(const std::string& scrape, const std::string& series) {
  const std::map<std::string, double> samples = ParsePrometheusText(scrape);
  auto it = samples.find(series);
  return it == samples.end() ? std::nan("") : it->second;
}

// Unload (Triton's repository extension, the TCP protocol and pswitchctl): a running inference
// batch finishes first, a running training task is cancelled, queued tasks fail, and the model's
// pinned weights, catalog entry and worker structures go.
TEST(HttpUnloadE2eTest, UnloadWaitsForInferenceCancelsTrainingAndFreesTheModel) {
  TokenFile tokens(e2e::kThreeTokens);
  // tiny_cnn's 9728 bytes take about 1.2 s to switch in at this cap: long enough to unload it
  // while an inference on it is still switching.
  // One model at a time (no weights cache): tiny_cnn's batch must switch, slowly, so the unload
  // arrives while its copy runs.
  e2e::TestDaemon daemon({"--preload=tiny_cnn,tiny_mlp", "--standby-workers=1", tokens.flag(),
                          "--bandwidth-cap=8000", "--weights-cache=false"});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  httplib::Client http("127.0.0.1", daemon.http_port());
  http.set_read_timeout(120, 0);
  const httplib::Headers admin = {{"Authorization", "Bearer admin-token-0123456789"}};
  const httplib::Headers bob = {{"Authorization", "Bearer user-token-bob-0123456789"}};
  auto scrape = [&] { return http.Get("/metrics", admin)->body; };
  auto unload = [&](const std::string& model, const httplib::Headers& who) {
    return http.Post("/v2/repository/models/" + model + "/unload", who, "", "application/json");
  };
  auto state_of = [&](uint64_t id) {
    auto r = http.Get("/v1/tasks/" + std::to_string(id), admin);
    return r && r->status == 200 ? Body(r) : json{{"state", r ? r->body : "no answer"}};
  };
  auto await_state = [&](uint64_t id, const std::string& want) {
    json t = json::object();
    for (int i = 0; i < 600 && t.value("state", "") != want; ++i) {
      t = state_of(id);
      if (t.value("state", "") != want) absl::SleepFor(absl::Milliseconds(50));
    }
    return t;
  };
  const double pinned_both = Sample(scrape(), "pswitch_pinned_weight_bytes{}");
  EXPECT_EQ(Sample(scrape(), "pswitch_models{}"), 2);

  EXPECT_EQ(unload("tiny_cnn", bob)->status, 403);
  EXPECT_EQ(unload("ghost", admin)->status, 404);
  EXPECT_EQ(unload("fill-3", admin)->status, 404);
  EXPECT_EQ(http.Post("/v2/repository/models/tiny_cnn/unload", admin, "[", "application/json")
                ->status,
            400);

  // 1. A running inference finishes: tiny_mlp is resident, so tiny_cnn's batch is switching
  //    (slowly) when the unload arrives, and is answered before the unload is.
  ASSERT_EQ(http.Post("/v2/models/tiny_mlp/infer", admin, InferBody(Input("tiny_mlp", 1)),
                      "application/json")->status, 200);
  int infer_status = 0;
  std::string infer_body;
  std::thread inference([&] {
    httplib::Client own("127.0.0.1", daemon.http_port());
    own.set_read_timeout(120, 0);
    auto r = own.Post("/v2/models/tiny_cnn/infer", bob, InferBody(Input("tiny_cnn", 1)),
                      "application/json");
    infer_status = r ? r->status : -1;
    infer_body = r ? r->body : "";
  });
  bool started = false;
  uint64_t batch = 0;
  std::string tasks;
  for (int i = 0; i < 400 && !started; ++i) {
    auto listed = http.Get("/v1/tasks", admin);
    tasks = listed ? listed->body : "no answer";
    const json body = Body(listed);
    for (const json& t : body["tasks"]) {
      if (t["model"] == "tiny_cnn" && (t["state"] == "switching" || t["state"] == "running")) {
        started = true;
        batch = t["task_id"].get<uint64_t>();
      }
    }
    if (!started) absl::SleepFor(absl::Milliseconds(5));
  }
  int unload_status = 0;
  std::string unload_body;
  if (started) {
    auto r = unload("tiny_cnn", admin);
    unload_status = r ? r->status : -1;
    unload_body = r ? r->body : "";
  }
  inference.join();
  ASSERT_TRUE(started) << tasks << "\n" << daemon.log();
  ASSERT_EQ(unload_status, 200) << unload_body;
  EXPECT_EQ(infer_status, 200) << infer_body;
  // On the scheduler's loop (one thread, so its log lines are in order): the batch's switch
  // completed, then the model was dropped.
  {
    const std::string log = daemon.log();
    const size_t switched =
        log.find("event=task_switch gpu=0 task=" + std::to_string(batch) + " model=tiny_cnn");
    const size_t dropped = log.find("event=model_unloaded gpu=0 model=tiny_cnn");
    ASSERT_NE(switched, std::string::npos) << log;
    ASSERT_NE(dropped, std::string::npos) << log;
    EXPECT_LT(switched, dropped) << log;
  }
  EXPECT_EQ(http.Get("/v2/models/tiny_cnn", bob)->status, 404);
  EXPECT_EQ(http.Get("/v2/models/tiny_cnn/ready", bob)->status, 404);
  EXPECT_EQ(http.Post("/v2/models/tiny_cnn/infer", bob, InferBody(Input("tiny_cnn", 1)),
                      "application/json")->status, 404);
  EXPECT_EQ(unload("tiny_cnn", admin)->status, 404);
  EXPECT_EQ(Sample(scrape(), "pswitch_models{}"), 1);
  EXPECT_EQ(pinned_both - Sample(scrape(), "pswitch_pinned_weight_bytes{}"), 9728);
  // Each worker that held it dropped it (both had loaded it at start-up).
  const std::string log = daemon.log();
  size_t drops = 0;
  for (size_t at = log.find("event=worker_model_unloaded"); at != std::string::npos;
       at = log.find("event=worker_model_unloaded", at + 1)) {
    const std::string line = log.substr(at, log.find('\n', at) - at);
    if (line.find("model=tiny_cnn") != std::string::npos &&
        line.find("was_loaded=1") != std::string::npos) {
      ++drops;
    }
  }
  EXPECT_EQ(drops, 2u) << log;

  // 2. Registered again under the same name (through the TCP client), then unloaded while one
  //    training task on it runs and another waits: the first is cancelled, the second fails.
  client::ClientOptions options;
  options.token = "admin-token-0123456789";
  auto tcp = client::Client::Connect(daemon.address(), options);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  client::RegisterOptions again;
  again.name = "tiny_cnn";
  again.zoo_model = "tiny_cnn";
  ASSERT_TRUE((*tcp)->Register(again).ok());
  EXPECT_EQ(Sample(scrape(), "pswitch_pinned_weight_bytes{}"), pinned_both);
  auto first = http.Post("/v1/tasks", admin, R"({"model": "tiny_cnn", "iterations": 1000000})",
                         "application/json");
  auto second = http.Post("/v1/tasks", admin, R"({"model": "tiny_cnn", "iterations": 5})",
                          "application/json");
  ASSERT_EQ(first->status, 202) << first->body;
  ASSERT_EQ(second->status, 202) << second->body;
  const uint64_t running = Body(first)["task_id"].get<uint64_t>();
  const uint64_t queued = Body(second)["task_id"].get<uint64_t>();
  EXPECT_EQ(await_state(running, "running").value("state", ""), "running");
  EXPECT_EQ(state_of(queued).value("state", ""), "queued");
  absl::Status by_tcp = (*tcp)->Unload("tiny_cnn");
  ASSERT_TRUE(by_tcp.ok()) << by_tcp;
  const json cancelled = await_state(running, "cancelled");
  EXPECT_EQ(cancelled.value("state", ""), "cancelled") << cancelled.dump();
  EXPECT_NE(cancelled.value("error", "").find("unloaded"), std::string::npos) << cancelled.dump();
  const json failed = await_state(queued, "failed");
  EXPECT_EQ(failed.value("state", ""), "failed") << failed.dump();
  EXPECT_NE(failed.value("error", "").find("was unloaded before it started"), std::string::npos)
      << failed.dump();

  // 3. pswitchctl unload: an admin's works, a user's is refused.
  const std::string ctl = (std::filesystem::path(PSWITCHD_PATH).parent_path() / "pswitchctl").string();
  auto ctl_unload = [&](const std::string& token) {
    const std::string command = ctl + " --server " + daemon.address() + " --token " + token +
                                " unload --name tiny_mlp > /dev/null 2>&1";
    return std::system(command.c_str());
  };
  EXPECT_NE(ctl_unload("user-token-bob-0123456789"), 0);
  EXPECT_EQ(ctl_unload("admin-token-0123456789"), 0);
  EXPECT_EQ(Sample(scrape(), "pswitch_models{}"), 0);
  EXPECT_EQ(Sample(scrape(), "pswitch_pinned_weight_bytes{}"), 0);
  EXPECT_EQ(Body(http.Post("/v2/repository/index", admin, "", "application/json")), json::array());
}

// The OpenAPI document served at /openapi.json (docs/openapi.json) names exactly the routes
// the daemon serves, which it lists at start-up.
TEST(HttpOpenApiE2eTest, TheDocumentDescribesExactlyTheRoutesServed) {
  e2e::TestDaemon daemon({"--preload=", "--standby-workers=0"});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  httplib::Client http("127.0.0.1", daemon.http_port());
  auto r = http.Get("/openapi.json");  // open, like the health checks
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const json doc = json::parse(r->body);
  EXPECT_EQ(doc["openapi"].get<std::string>().rfind("3.", 0), 0u);
  std::set<std::string> documented;
  for (const auto& [path, item] : doc["paths"].items()) {
    for (const auto& [method, op] : item.items()) {
      if (method == "parameters") continue;
      documented.insert(absl::AsciiStrToUpper(method) + " " + path);
    }
  }
  std::set<std::string> served;
  const std::string log = daemon.log();
  const size_t at = log.find("event=http_routes routes=");
  ASSERT_NE(at, std::string::npos) << log;
  std::string list = log.substr(at + std::strlen("event=http_routes routes="));
  list = list.substr(0, list.find('\n'));
  if (!list.empty() && list.front() == '"') list = list.substr(1, list.rfind('"') - 1);
  for (absl::string_view route : absl::StrSplit(list, ',')) served.insert(std::string(route));
  EXPECT_EQ(documented, served);
}

}  // namespace
}  // namespace pswitch
