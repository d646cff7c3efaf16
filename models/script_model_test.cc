#include "models/script_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

#include "base/files.h"
#include "models/training.h"
#include "models/weights.h"
#include "nlohmann/json.hpp"

namespace pswitch::models {
namespace {

using ::testing::HasSubstr;

// Made by tests/data/make_archives.py with Debian's torch 1.13 (committed).
const std::string kArchives = std::string(PSWITCH_TEST_DATA_DIR) + "/archives/";

std::shared_ptr<ZooModel> Load(const std::string& file) {
  auto bytes = base::ReadRegularFile(kArchives + file, "archive", 64 << 20);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  auto model = LoadScriptModel(file, *bytes, file);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : nullptr;
}

absl::Status LoadError(const std::string& file) {
  auto bytes = base::ReadRegularFile(kArchives + file, "archive", 64 << 20);
  if (!bytes.ok()) return bytes.status();
  return LoadScriptModel(file, *bytes, file).status();
}

// The input the archive was checked on in Python, and Python's output.
std::pair<at::Tensor, at::Tensor> PythonIo(const std::string& name) {
  auto io = ReadTensors(kArchives + name + ".io.safetensors");
  EXPECT_TRUE(io.ok()) << io.status();
  std::map<std::string, at::Tensor> by_name(io->begin(), io->end());
  return {by_name.at("input"), by_name.at("output")};
}

void ExpectMatchesPython(ZooModel& model, const std::string& name) {
  auto [input, expected] = PythonIo(name);
  ModelInput in;
  in.input = input;
  auto out = RunForward(model, in);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->output.sizes(), expected.sizes());
  const double scale = expected.abs().max().item<double>();
  EXPECT_LT((out->output - expected).abs().max().item<double>(), 1e-5 * std::max(scale, 1.0));
}

TEST(ScriptModelTest, ACustomCnnWithAResidualBranchMatchesPython) {
  auto model = Load("residual_cnn.pswitch.pt");
  ASSERT_NE(model, nullptr);
  EXPECT_TRUE(IsScriptModel(*model));
  ExpectMatchesPython(*model, "residual_cnn");
}

TEST(ScriptModelTest, ATransformerWithTiedEmbeddingsMatchesPython) {
  auto model = Load("tiny_transformer.pswitch.pt");
  ASSERT_NE(model, nullptr);
  ExpectMatchesPython(*model, "tiny_transformer");
}

// A fine-tuned-BERT shape: input, attention_mask and token_type_ids, as the protocol names them.
TEST(ScriptModelTest, AModelWithAnAttentionMaskAndTokenTypesMatchesPython) {
  auto model = Load("masked_classifier.pswitch.pt");
  ASSERT_NE(model, nullptr);
  auto io = ReadTensors(kArchives + "masked_classifier.io.safetensors");
  ASSERT_TRUE(io.ok()) << io.status();
  std::map<std::string, at::Tensor> by_name(io->begin(), io->end());
  ModelInput in;
  in.input = by_name.at("input");
  in.attention_mask = by_name.at("attention_mask");
  in.token_type_ids = by_name.at("token_type_ids").to(at::kInt);  // int32, as clients may send
  ASSERT_FALSE(in.attention_mask.all().item<bool>());  // some positions are padding
  auto out = RunForward(*model, in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_LT((out->output - by_name.at("output")).abs().max().item<double>(), 1e-5);
  // The mask matters: without it (all ones) the output changes.
  ModelInput unmasked = in;
  unmasked.attention_mask = at::ones_like(in.attention_mask);
  auto all_ones = RunForward(*model, unmasked);
  ASSERT_TRUE(all_ones.ok());
  EXPECT_GT((all_ones->output - out->output).abs().max().item<double>(), 1e-4);
  // Left out, a mask is all ones and type ids are zeros.
  ModelInput defaults;
  defaults.input = in.input;
  unmasked.token_type_ids = at::zeros_like(in.input);
  auto explicit_defaults = RunForward(*model, unmasked);
  auto implicit_defaults = RunForward(*model, defaults);
  ASSERT_TRUE(explicit_defaults.ok() && implicit_defaults.ok()) << implicit_defaults.status();
  EXPECT_TRUE(at::equal(explicit_defaults->output, implicit_defaults->output));
  // A mask of the wrong shape is an error naming it.
  ModelInput bad = in;
  bad.attention_mask = in.attention_mask.flatten();
  EXPECT_THAT(std::string(RunForward(*model, bad).status().message()),
              HasSubstr("'attention_mask'"));
  // Training draws all three, with masks of ones.
  ModelInput example = model->ExampleInput(3, 7);
  ASSERT_TRUE(example.attention_mask.defined() && example.token_type_ids.defined());
  EXPECT_TRUE(example.attention_mask.all().item<bool>());
  EXPECT_EQ(example.attention_mask.sizes(), example.input.sizes());
}

TEST(ScriptModelTest, LayersStartWithTheModelAndCoverEveryTensorOnce) {
  for (const std::string file : {"residual_cnn.pswitch.pt", "tiny_transformer.pswitch.pt"}) {
    SCOPED_TRACE(file);
    auto model = Load(file);
    ASSERT_NE(model, nullptr);
    for (bool training : {false, true}) {
      model->train(training);
      auto layers = model->Layers();
      ASSERT_TRUE(layers.ok()) << layers.status();
      ASSERT_FALSE((*layers)->empty());
      EXPECT_EQ((**layers)[0].name, "(model)");
      std::multiset<std::string> covered;
      for (const Layer& layer : **layers) {
        for (const LayerTensor& t : layer.tensors) covered.insert(t.name);
      }
      std::multiset<std::string> expected;
      for (const auto& p : model->named_parameters()) expected.insert(p.key());
      for (const auto& b : model->named_buffers()) expected.insert(b.key());
      EXPECT_EQ(covered, expected);
    }
  }
}

TEST(ScriptModelTest, TiedWeightsGoWithTheirFirstUserAndRootTensorsWithGateZero) {
  auto model = Load("tiny_transformer.pswitch.pt");
  ASSERT_NE(model, nullptr);
  auto layers = model->Layers();
  ASSERT_TRUE(layers.ok()) << layers.status();
  std::map<std::string, std::string> owner;
  for (const Layer& layer : **layers) {
    for (const LayerTensor& t : layer.tensors) owner[t.name] = layer.name;
  }
  EXPECT_EQ(owner.at("embed.weight"), "embed");
  EXPECT_EQ(owner.at("pos"), "(model)");  // a parameter of the model itself
  EXPECT_EQ(owner.count("head.weight"), 0u);  // the same tensor as embed.weight
  EXPECT_TRUE(model->IsIgnorableCheckpointKey("head.weight"));
}

TEST(ScriptModelTest, RebindingEveryLayerTensorRebindsTheTiedSlotsToo) {
  // What a worker does: every tensor becomes a view of other memory (the arena). A tied slot
  // still on the old memory would read it: zeroing the old memory must not change the output.
  auto model = Load("tiny_transformer.pswitch.pt");
  ASSERT_NE(model, nullptr);
  auto layers = model->Layers();
  ASSERT_TRUE(layers.ok());
  auto [input, expected] = PythonIo("tiny_transformer");
  std::vector<at::Tensor> old_memory;
  {
    torch::NoGradGuard no_grad;
    for (const Layer& layer : **layers) {
      for (const LayerTensor& t : layer.tensors) {
        at::Tensor tensor = t.tensor;
        old_memory.push_back(tensor.detach());
        tensor.set_data(tensor.detach().clone());
      }
    }
    for (at::Tensor& old : old_memory) old.zero_();
  }
  ModelInput in;
  in.input = input;
  auto out = RunForward(*model, in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_LT((out->output - expected).abs().max().item<double>(), 1e-4);
}

TEST(ScriptModelTest, TheGateHookSeesEveryExecutedLayerInOrder) {
  auto model = Load("residual_cnn.pswitch.pt");
  ASSERT_NE(model, nullptr);
  auto layers = model->Layers();
  ASSERT_TRUE(layers.ok());
  int executed = 0;
  for (const Layer& layer : **layers) executed += layer.executed ? 1 : 0;
  std::vector<int> seen;
  model->SetGateHook([&](int index) { seen.push_back(index); });
  ASSERT_TRUE(RunForward(*model, model->ExampleInput(3, 1)).ok());
  ASSERT_EQ(static_cast<int>(seen.size()), executed);
  for (int i = 0; i < executed; ++i) EXPECT_EQ(seen[i], i);
}

TEST(ScriptModelTest, AGateHookFailureReachesTheCallerAsItself) {
  // The worker's gate throws its own exception type; TorchScript must not turn it into another.
  struct Stop {};
  auto model = Load("residual_cnn.pswitch.pt");
  ASSERT_NE(model, nullptr);
  int calls = 0;
  model->SetGateHook([&](int) {
    if (++calls == 3) throw Stop{};
  });
  EXPECT_THROW(model->Forward(model->ExampleInput(1, 0)), Stop);
  model->SetGateHook(nullptr);
  EXPECT_TRUE(RunForward(*model, model->ExampleInput(1, 0)).ok());
}

TEST(ScriptModelTest, WrongInputsAreClearErrors) {
  auto model = Load("residual_cnn.pswitch.pt");
  ASSERT_NE(model, nullptr);
  ModelInput ints;
  ints.input = at::zeros({1, 3, 32, 32}, at::kLong);
  auto out = RunForward(*model, ints);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("4-d Float input"));
  ModelInput two = model->ExampleInput(1, 0);
  two.attention_mask = at::ones({1, 4});
  EXPECT_THAT(std::string(RunForward(*model, two).status().message()),
              HasSubstr("takes no 'attention_mask'"));
}

TEST(ScriptModelTest, TrainingUsesTheExportedLossAndIsDeterministic) {
  auto run = [](int steps) {
    auto model = Load("residual_cnn.pswitch.pt");
    EXPECT_NE(model, nullptr);
    model->train();
    auto trainer = Trainer::Create(*model, TrainerOptions{OptimizerKind::kSgd, 0.05, 0.9});
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    std::vector<double> losses;
    for (int i = 0; i < steps; ++i) {
      auto loss = (*trainer)->Step(model->ExampleInput(4, i), model->ExampleTarget(4, i));
      EXPECT_TRUE(loss.ok()) << loss.status();
      losses.push_back(loss.ok() ? *loss : 0);
    }
    return losses;
  };
  std::vector<double> a = run(5), b = run(5);
  EXPECT_EQ(a, b);
  EXPECT_NE(a.front(), a.back());  // the weights moved
}

TEST(ScriptModelTest, APassOffTheRecordedPathStopsAtItsFirstGate) {
  // Layer a runs only for inputs with a positive sum. Whichever path registration recorded, the
  // other one would map b's call to a's layer (the wrong group): it is stopped instead.
  auto model = Load("data_dependent.pswitch.pt");
  ASSERT_NE(model, nullptr);
  ModelInput positive, negative;
  positive.input = at::ones({1, 4});
  negative.input = -at::ones({1, 4});
  auto a = RunForward(*model, positive);
  auto b = RunForward(*model, negative);
  ASSERT_NE(a.ok(), b.ok()) << a.status() << " / " << b.status();
  const absl::Status& off = a.ok() ? b.status() : a.status();
  EXPECT_THAT(std::string(off.message()), HasSubstr("took another path"));
  EXPECT_EQ(RunForward(*model, a.ok() ? positive : negative).ok(), true);  // still usable
}

TEST(ScriptModelTest, BadArchivesAreRefusedNamingTheProblem) {
  const std::map<std::string, std::string> cases = {
      {"no_table.pt", "has no layer table"},
      {"no_gates.pt", "calls none of the 1 gates"},
      {"float64.pt", "parameter 'fc.weight' has dtype Double"},
      {"shared_view.pt", "shares memory with 'a'"},
      {"tensor_attribute.pt", "tensor attribute 'scale'"},
      {"unknown_op.pt", "pswitch_missing::gate"},
      {"unknown_module.pt", "'no_such_module'"},
      {"reads_file.pt", "calls aten::from_file"},
      {"forks.pt", "calls prim::fork"},
      {"setstate.pt", "defines __setstate__"},
      {"parent_reads.pt", "reads a tensor before the layer that holds it runs"},
  };
  for (const auto& [file, message] : cases) {
    SCOPED_TRACE(file);
    absl::Status status = LoadError(file);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(message));
  }
  EXPECT_EQ(LoadScriptModel("x", "not a zip", "garbage").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// tests/data/make_escape_archives.py: archives that would address memory outside their tensors
// (another tenant's lease, another model's weights) if they ran, each with its refusal.
TEST(ScriptModelTest, ArchivesThatCouldAddressMemoryOutsideTheirTensorsAreRefused) {
  auto listing = base::ReadRegularFile(kArchives + "escapes/escapes.json", "escapes", 1 << 20);
  ASSERT_TRUE(listing.ok()) << listing.status();
  const nlohmann::json escapes = nlohmann::json::parse(*listing);
  ASSERT_GE(escapes.size(), 18u);
  for (const auto& [file, message] : escapes.items()) {
    SCOPED_TRACE(file);
    absl::Status status = LoadError("escapes/" + file);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(message.get<std::string>()));
  }
}

TEST(ScriptModelTest, AnOutputOfAnotherShapeThanTheRecordedOneIsRefused) {
  std::shared_ptr<ZooModel> model = Load("wide_output.pswitch.pt");
  ASSERT_NE(model, nullptr);
  ModelInput two, three;
  two.input = torch::ones({2, 4});
  three.input = torch::ones({3, 4});  // the archive returns 4x the registered width from 3 on
  auto ok = RunForward(*model, two);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->output.sizes(), (std::vector<int64_t>{2, 4}));
  auto wide = RunForward(*model, three);
  ASSERT_FALSE(wide.ok());
  EXPECT_THAT(std::string(wide.status().message()),
              HasSubstr("returned a Float tensor of shape [3, 16]"));
  EXPECT_THAT(std::string(wide.status().message()), HasSubstr("recorded output is Float"));
}

TEST(ScriptModelTest, OutputsFollowTheInputsBatchAndSequenceLength) {
  std::shared_ptr<ZooModel> model = Load("tiny_transformer.pswitch.pt");
  ASSERT_NE(model, nullptr);
  auto [input, expected] = PythonIo("tiny_transformer");
  ASSERT_GE(input.dim(), 2);
  // Another batch and a shorter sequence: the output's batch and length follow them.
  ModelInput shorter;
  shorter.input = input.narrow(1, 0, input.size(1) - 1).repeat({3, 1});
  auto out = RunForward(*model, shorter);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->output.size(0), shorter.input.size(0));
  EXPECT_EQ(out->output.size(1), shorter.input.size(1));
}

}  // namespace
}  // namespace pswitch::models
