// Runs the built find-grouping binary on real files and checks its output and exit codes.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "grouping/plan.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

using ::testing::HasSubstr;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A per-test, per-process temp path: ctest runs the tests of this file in parallel.
std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/find_grouping_test_" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
         std::to_string(getpid()) + "_" + name;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path) << text;
  return path;
}

RunResult RunFindGrouping(const std::string& args) {
  const std::string err_path = TempPath("stderr");
  const std::string command = std::string(FIND_GROUPING_PATH) + " " + args + " 2>" + err_path;
  RunResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = ReadFile(err_path);
  return result;
}

// 6 layers; transmission and execution are comparable, so the optimum is neither extreme.
constexpr char kProfile[] = R"({
  "model": "cli-net", "bandwidth_bytes_per_s": 1e9, "transfer_overhead_s": 1e-5,
  "group_sync_overhead_s": 1e-5,
  "layers": [
    {"name": "conv1", "param_bytes": 1000000, "exec_s": 0.0008},
    {"name": "relu1", "param_bytes": 0, "exec_s": 0.00002},
    {"name": "conv2", "param_bytes": 2000000, "exec_s": 0.0015},
    {"name": "relu2", "param_bytes": 0, "exec_s": 0.00002},
    {"name": "conv3", "param_bytes": 3000000, "exec_s": 0.001},
    {"name": "fc", "param_bytes": 4000000, "exec_s": 0.0001}
  ]})";

void ExpectValidOutput(const nlohmann::json& json, const std::string& algorithm) {
  ASSERT_TRUE(json.is_object());
  EXPECT_EQ(json.at("model"), "cli-net");
  EXPECT_EQ(json.at("algorithm"), algorithm);
  EXPECT_GT(json.at("total_s").get<double>(), 0.0);
  EXPECT_GE(json.at("search_s").get<double>(), 0.0);
  absl::StatusOr<pswitch::grouping::GroupPlan> plan =
      pswitch::grouping::PlanFromJson(json.at("groups"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(pswitch::grouping::ValidatePlan(*plan, 6).ok());
}

TEST(FindGroupingCliTest, WritesAValidPlanToStdoutForEveryAlgorithm) {
  const std::string profile = WriteTemp("profile.json", kProfile);
  double optimal_s = 0;
  for (const std::string algorithm : {"dp", "bnb", "single", "per-layer", "every-k"}) {
    const RunResult run =
        RunFindGrouping("--profile " + profile + " --algorithm=" + algorithm + " --k 2");
    ASSERT_EQ(run.exit_code, 0) << algorithm << ": " << run.err;
    const nlohmann::json json = nlohmann::json::parse(run.out);
    ExpectValidOutput(json, algorithm);
    if (algorithm == "dp") optimal_s = json.at("total_s").get<double>();
    if (algorithm == "bnb") {
      EXPECT_TRUE(json.at("proven_optimal").get<bool>());
      EXPECT_NEAR(json.at("total_s").get<double>(), optimal_s, 1e-15);
    } else if (algorithm != "dp") {
      EXPECT_GE(json.at("total_s").get<double>(), optimal_s);
    }
  }
}

TEST(FindGroupingCliTest, OutputFieldsComeInTheDocumentedOrder) {
  const RunResult run = RunFindGrouping("--profile " + WriteTemp("p2.json", kProfile));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out.rfind(R"({"model":"cli-net","algorithm":"dp","total_s":)", 0), 0u) << run.out;
  EXPECT_NE(run.out.find(R"(,"groups":[[0,)"), std::string::npos) << run.out;
}

TEST(FindGroupingCliTest, WritesToOutFile) {
  const std::string out = TempPath("plan.json");
  std::remove(out.c_str());
  const RunResult run = RunFindGrouping("--profile " + WriteTemp("p3.json", kProfile) +
                                        " --algorithm bnb --time-limit 5 --out " + out);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "");
  ExpectValidOutput(nlohmann::json::parse(ReadFile(out)), "bnb");
}

TEST(FindGroupingCliTest, BnbOutOfTimeSaysItIsNotProvenOptimal) {
  const RunResult run = RunFindGrouping("--profile " + WriteTemp("p4.json", kProfile) +
                                        " --algorithm bnb --time-limit 0");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json json = nlohmann::json::parse(run.out);
  ExpectValidOutput(json, "bnb");
  EXPECT_FALSE(json.at("proven_optimal").get<bool>());
  EXPECT_THAT(run.err, HasSubstr("not proven optimal"));
}

TEST(FindGroupingCliTest, FailsClearlyOnBadInput) {
  const std::string good = WriteTemp("good.json", kProfile);
  std::string bad_text = kProfile;
  bad_text.replace(bad_text.find("\"exec_s\": 0.0015"), 16, "\"exec_s\": -1");
  const std::string bad = WriteTemp("bad.json", bad_text);
  const std::string broken = WriteTemp("broken.json", "{\"model\": ");

  RunResult run = RunFindGrouping("--profile " + bad);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_EQ(run.out, "");
  EXPECT_THAT(run.err, HasSubstr("layers[2] 'conv2'"));
  EXPECT_THAT(run.err, HasSubstr("exec_s"));

  run = RunFindGrouping("--profile /nonexistent/profile.json");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("/nonexistent/profile.json"));

  run = RunFindGrouping("--profile " + broken);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("invalid JSON"));

  run = RunFindGrouping("--profile " + good + " --algorithm fastest");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("unknown algorithm 'fastest'"));

  run = RunFindGrouping("--profile " + good + " --algorithm every-k --k 0");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("--k must be a positive integer"));

  run = RunFindGrouping("--profile " + good + " --time-limit -1");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("--time-limit"));

  run = RunFindGrouping("--profile " + good + " --verbose 1");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("unknown flag --verbose"));

  run = RunFindGrouping("");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("--profile is required"));
}

}  // namespace
