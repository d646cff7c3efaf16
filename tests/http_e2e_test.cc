// End-to-end: pswitchd's HTTP/JSON port (Open Inference Protocol, KServe v2) against a real
// daemon, compared with its TCP client on the same models.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "models/registry.h"
#include "models/zoo_model.h"
#include "nlohmann/json.hpp"
#include "tests/e2e_helpers.h"
#include "tests/test_daemon.h"
#include "worker/host_tensors.h"

namespace pswitch {
namespace {

using e2e::Floats;
using e2e::Input;
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
  }
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

  auto submitted = http.Post("/v1/tasks", bob,
                             R"({"model": "tiny_mlp", "iterations": 3, "optimizer": "adam"})",
                             "application/json");
  ASSERT_TRUE(submitted);
  ASSERT_EQ(submitted->status, 202) << submitted->body;
  const uint64_t id = Body(submitted)["task_id"].get<uint64_t>();
  EXPECT_EQ(submitted->get_header_value("Location"), "/v1/tasks/" + std::to_string(id));
  EXPECT_EQ(await_state(id, "succeeded"), "succeeded");
  // Another user's task is as good as absent.
  auto hidden = http.Get("/v1/tasks/" + std::to_string(id), carol);
  ASSERT_TRUE(hidden);
  EXPECT_EQ(hidden->status, 404);
  auto bobs = http.Get("/v1/tasks", bob);
  auto carols = http.Get("/v1/tasks", carol);
  ASSERT_TRUE(bobs && carols);
  EXPECT_FALSE(Body(bobs)["tasks"].empty());
  EXPECT_TRUE(Body(carols)["tasks"].empty()) << carols->body;

  auto endless = http.Post("/v1/tasks", bob, R"({"model": "tiny_mlp", "iterations": 1000000})",
                           "application/json");
  ASSERT_TRUE(endless);
  ASSERT_EQ(endless->status, 202) << endless->body;
  const uint64_t long_id = Body(endless)["task_id"].get<uint64_t>();
  EXPECT_EQ(await_state(long_id, "running"), "running");
  auto cancelled = http.Delete("/v1/tasks/" + std::to_string(long_id), bob);
  ASSERT_TRUE(cancelled);
  EXPECT_EQ(cancelled->status, 202) << cancelled->body;
  EXPECT_EQ(await_state(long_id, "cancelled"), "cancelled");

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

}  // namespace
}  // namespace pswitch
