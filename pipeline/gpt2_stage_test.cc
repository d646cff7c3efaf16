// The real-compute pipeline trains GPT-2 exactly as the unsplit model does: same losses, same
// gradients, same weights after the optimizer steps. This is what shows that activations and
// gradients cross the stage boundaries (and the tied embedding's gradient the pipeline) intact.
#include "pipeline/gpt2_stage.h"

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/registry.h"
#include "pipeline/bubble_reporter.h"
#include "pipeline/coordinator.h"
#include "pipeline/stage_runner.h"

namespace pswitch::pipeline {
namespace {

TEST(Gpt2StageTest, BlocksAreSplitEvenlyAndCoverTheModel) {
  EXPECT_EQ(StageBlocks(8, 4, 0), std::make_pair(0, 2));
  EXPECT_EQ(StageBlocks(8, 4, 3), std::make_pair(6, 8));
  EXPECT_EQ(StageBlocks(5, 2, 0), std::make_pair(0, 3));
  EXPECT_EQ(StageBlocks(5, 2, 1), std::make_pair(3, 5));
  for (int blocks = 1; blocks <= 12; ++blocks) {
    for (int stages = 1; stages <= blocks; ++stages) {
      int next = 0;
      for (int s = 0; s < stages; ++s) {
        auto [first, end] = StageBlocks(blocks, stages, s);
        EXPECT_EQ(first, next);
        EXPECT_GE(end - first, 1);
        next = end;
      }
      EXPECT_EQ(next, blocks);
    }
  }
}

TEST(Gpt2StageTest, TooFewBlocksForTheStagesIsAnError) {
  Gpt2StageOptions options;
  options.stages = 3;
  options.model_config.values = {{"n_layer", 2}};
  auto compute = Gpt2StageCompute::Create(options);
  EXPECT_EQ(compute.status().code(), absl::StatusCode::kInvalidArgument);
}

struct EquivalenceCase {
  const char* name;
  ScheduleKind kind;
  int stages;
  int microbatches;
  int n_layer;
};

class Gpt2PipelineEquivalenceTest : public ::testing::TestWithParam<EquivalenceCase> {};

TEST_P(Gpt2PipelineEquivalenceTest, MatchesTheUnsplitModel) {
  const EquivalenceCase& c = GetParam();
  const int kIterations = 2;
  const int64_t kMicrobatchSize = 2;
  const uint64_t kSeed = 5;
  models::ModelConfig config{{{"n_layer", c.n_layer},
                              {"n_embd", 32},
                              {"n_head", 2},
                              {"vocab_size", 64},
                              {"n_positions", 8},
                              {"seq_len", 8}}};
  Gpt2StageOptions base;
  base.stages = c.stages;
  base.microbatches = c.microbatches;
  base.microbatch_size = kMicrobatchSize;
  base.model_config = config;
  base.seed = kSeed;
  base.learning_rate = 0.05;
  base.momentum = 0.9;
  base.dropout = false;
  base.profile_microbatches = 1;

  // Built here, one after another: model construction draws from libtorch's global generator.
  std::vector<std::unique_ptr<Gpt2StageCompute>> computes;
  for (int s = 0; s < c.stages; ++s) {
    Gpt2StageOptions options = base;
    options.stage = s;
    auto compute = Gpt2StageCompute::Create(options);
    ASSERT_TRUE(compute.ok()) << compute.status();
    computes.push_back(*std::move(compute));
  }
  PipelineOptions options;
  options.schedule = c.kind;
  options.stages = c.stages;
  options.microbatches = c.microbatches;
  options.warmup = 0;
  options.iterations = kIterations;
  options.tied_link = true;
  options.launch = StageLaunch::kThreads;
  auto report = RunPipeline(options, [&](StageConfig stage_config, StageLinks& links) {
    NullReporter reporter;
    return ServeStage(stage_config, links, *computes[stage_config.stage], reporter);
  });
  ASSERT_TRUE(report.ok()) << report.status();

  // The same training, unsplit: one batch of all micro-batches per step.
  auto model = models::CreateModel("gpt2", config, kSeed);
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->eval();
  torch::optim::SGD sgd((*model)->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int it = 0; it < kIterations; ++it) {
    sgd.zero_grad();
    at::Tensor tokens = IterationTokens(**model, c.microbatches * kMicrobatchSize, kSeed, it);
    at::Tensor loss = (*model)->Loss((*model)->Forward({tokens, {}, {}}), tokens);
    loss.backward();
    EXPECT_NEAR(report->iterations[it].loss, loss.item<double>(), 1e-5) << "iteration " << it;
    if (it + 1 < kIterations) sgd.step();
  }
  // Gradients of the last iteration, then the weights after its step.
  std::map<std::string, at::Tensor> reference;
  for (const auto& p : (*model)->named_parameters()) reference[p.key()] = p.value();
  int compared = 0;
  for (const auto& compute : computes) {
    for (const auto& [name, tensor] : compute->Parameters()) {
      ASSERT_TRUE(reference.count(name)) << name;
      ASSERT_TRUE(tensor.grad().defined()) << name;
      EXPECT_TRUE(at::allclose(tensor.grad(), reference[name].grad(), 1e-4, 1e-6))
          << name << " max grad diff "
          << (tensor.grad() - reference[name].grad()).abs().max().item<float>();
      ++compared;
    }
  }
  // Every parameter is trained by some stage; wte by both ends.
  EXPECT_EQ(compared, static_cast<int>(reference.size()) + 1);
  sgd.step();
  for (const auto& compute : computes) {
    for (const auto& [name, tensor] : compute->Parameters()) {
      EXPECT_TRUE(at::allclose(tensor, reference[name], 1e-4, 1e-6)) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Splits, Gpt2PipelineEquivalenceTest,
    ::testing::Values(EquivalenceCase{"gpipe_2_stages", ScheduleKind::kGpipe, 2, 2, 2},
                      EquivalenceCase{"onefoneb_3_stages", ScheduleKind::kOneFOneB, 3, 4, 3}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pswitch::pipeline
