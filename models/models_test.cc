// Tests of the model zoo: layer view, gate hook, registry, weights loading and training.
#include <ATen/ATen.h>
#include <torch/utils.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/layer_profiler.h"
#include "models/model_inspection.h"
#include "models/registry.h"
#include "models/training.h"
#include "models/weight_init.h"
#include "models/weights.h"
#include "models/zoo_model.h"
#include "models/zoo_names.h"

namespace pswitch::models {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<ZooModel> Create(const std::string& name, const ModelConfig& config = {},
                                 uint64_t seed = 0) {
  auto model = CreateModel(name, config, seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : nullptr;
}

const std::vector<Layer>& LayersOf(ZooModel& model) {
  auto layers = model.Layers();
  EXPECT_TRUE(layers.ok()) << layers.status();
  return **layers;
}

// Every parameter and buffer of the model appears in exactly one layer, under its state_dict key.
void ExpectLayersCoverStateDictOnce(ZooModel& model) {
  std::map<std::string, int> expected;
  for (const auto& p : model.named_parameters()) expected[p.key()] = 0;
  for (const auto& b : model.named_buffers()) expected[b.key()] = 0;
  for (const Layer& layer : LayersOf(model)) {
    for (const LayerTensor& t : layer.tensors) {
      ASSERT_TRUE(expected.count(t.name)) << "layer " << layer.name << " lists unknown " << t.name;
      ++expected[t.name];
    }
  }
  for (const auto& [name, count] : expected) EXPECT_EQ(count, 1) << name;
}

int ExecutedCount(const std::vector<Layer>& layers) {
  int n = 0;
  for (const Layer& layer : layers) n += layer.executed ? 1 : 0;
  return n;
}

TEST(RegistryTest, UnknownModelAndSettingAreClearErrors) {
  auto model = CreateModel("resnet151");
  ASSERT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("'resnet151'"));
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("resnet152"));

  auto bad = CreateModel("gpt2", ModelConfig{{{"n_layers", 2}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'n_layers'"));
  EXPECT_FALSE(ParseModelConfig("n_layer=x").ok());
  auto parsed = ParseModelConfig("n_layer=3,n_embd=32");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->Get("n_embd"), 32);
}

// Issue 28 item 5: a model converted to half precision computes in it from float32 example
// inputs (InModelDType), and its facts say so: inputs and outputs in its dtype, training refused.
TEST(ModelDTypeTest, AHalfPrecisionModelTakesItsOwnDtypeAndDoesNotTrain) {
  EXPECT_EQ(*ParseModelDType("bfloat16"), ModelDType::kBFloat16);
  EXPECT_EQ(*ParseModelDType("float16"), ModelDType::kFloat16);
  EXPECT_EQ(ParseModelDType("fp8").status().code(), absl::StatusCode::kInvalidArgument);
  auto model = CreateModel("tiny_cnn");
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->to(TorchDType(ModelDType::kBFloat16));
  EXPECT_EQ((*model)->FloatDType(), at::kBFloat16);
  const ModelInput example = (*model)->ExampleInput(2, 1);
  EXPECT_EQ((*model)->InModelDType(example).input.scalar_type(), at::kBFloat16);
  auto out = RunForward(**model, example);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->output.scalar_type(), at::kBFloat16);
  auto facts = InspectModel(**model);
  ASSERT_TRUE(facts.ok()) << facts.status();
  EXPECT_EQ(facts->input.dtype, DType::kBF16);
  EXPECT_EQ(facts->output.dtype, DType::kBF16);
  EXPECT_EQ(facts->trainable.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(facts->trainable.message().find("float32"), absl::string_view::npos);
}

// Synthetic inputs come from a generator of their own: one seed gives one batch, and the default
// generator that dropout and initialisers draw from does not move.
TEST(ZooModelTest, ExampleInputsAreSeededAndLeaveTheDefaultGeneratorAlone) {
  auto model = CreateModel("tiny_cnn");
  ASSERT_TRUE(model.ok()) << model.status();
  at::manual_seed(5);
  const at::Tensor expected_next = at::randn({16});
  at::manual_seed(5);
  const ModelInput a = (*model)->ExampleInput(3, 9, c10::kCPU);
  const at::Tensor next = at::randn({16});
  EXPECT_TRUE(at::equal(next, expected_next));
  EXPECT_TRUE(at::equal(a.input, (*model)->ExampleInput(3, 9).input));
  EXPECT_FALSE(at::equal(a.input, (*model)->ExampleInput(3, 10).input));
  EXPECT_TRUE(at::equal((*model)->ExampleTarget(3, 9), (*model)->ExampleTarget(3, 9)));
  const at::Tensor draw = at::randn({8}, SeededGenerator(42, c10::kCPU));
  EXPECT_TRUE(at::equal(draw, at::randn({8}, SeededGenerator(42, c10::kCPU))));
}

// pswitchd knows the zoo by name only (models/zoo_names.h, no libtorch): the same list.
TEST(RegistryTest, ListsEveryZooModelAndNoOther) {
  const std::vector<std::string> names = ModelNames();
  EXPECT_EQ(names, std::vector<std::string>(kZooModelNames.begin(), kZooModelNames.end()));
  for (const char* name : {"resnet18", "resnet50", "resnet152", "vgg19", "inception_v3",
                           "bert_base", "bert_large", "gpt2", "tiny_mlp", "tiny_cnn"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
    EXPECT_TRUE(IsZooModel(name)) << name;
  }
  EXPECT_FALSE(IsZooModel("torchscript"));
}

// Issue 28: a worker builds a model only to bind it to the weights region, so it skips the
// seeded draw. The model has the same tensors either way; only the seeded build has the seeded
// values, and the scope ends with its thread's next build seeded again.
TEST(RegistryTest, AModelBuiltWithoutItsInitialisersHasItsTensorsButNotTheSeededValues) {
  const ModelConfig small_bert{{{"hidden_size", 32},
                                {"num_hidden_layers", 1},
                                {"num_attention_heads", 2},
                                {"intermediate_size", 64},
                                {"vocab_size", 100},
                                {"max_position_embeddings", 16},
                                {"seq_len", 8}}};
  for (const auto& [name, config] : std::vector<std::pair<std::string, ModelConfig>>{
           {"resnet18", ModelConfig{{{"num_classes", 10}}}},
           {"inception_v3", ModelConfig{{{"num_classes", 10}}}},
           {"bert_base", small_bert},
           {"gpt2", {}}}) {
    SCOPED_TRACE(name);
    auto seeded = CreateModel(name, config);
    ASSERT_TRUE(seeded.ok()) << seeded.status();
    std::shared_ptr<ZooModel> bare;
    {
      SkipWeightInit skip;
      EXPECT_FALSE(InitWeights());
      auto built = CreateModel(name, config);
      ASSERT_TRUE(built.ok()) << built.status();
      bare = *built;
    }
    EXPECT_TRUE(InitWeights());
    auto again = CreateModel(name, config);
    ASSERT_TRUE(again.ok()) << again.status();
    const auto a = (*seeded)->named_parameters(), b = bare->named_parameters(),
               c = (*again)->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    bool differs = false;
    for (const auto& p : a) {
      const at::Tensor* other = b.find(p.key());
      ASSERT_NE(other, nullptr) << p.key();
      EXPECT_EQ(p.value().sizes(), other->sizes()) << p.key();
      differs = differs || !at::equal(p.value(), *other);
      EXPECT_TRUE(at::equal(p.value(), *c.find(p.key()))) << p.key() << ": seeded again";
    }
    EXPECT_TRUE(differs) << "the bare build drew the seeded values anyway";
  }
}

TEST(LayerViewTest, ResNet152CoversEveryTensorOnceWithTorchvisionBytes) {
  auto model = Create("resnet152");
  ASSERT_TRUE(model);
  ExpectLayersCoverStateDictOnce(*model);
  const auto& layers = LayersOf(*model);
  int64_t bytes = 0;
  for (const Layer& layer : layers) bytes += layer.param_bytes;
  EXPECT_EQ(bytes, 241376928);  // torchvision resnet152().state_dict(), floating point, fp32
  // One layer per leaf call, as PipeSwitch counts them: 364 leaf modules + 2 extra ReLU calls in
  // each of the 50 bottlenecks.
  EXPECT_EQ(ExecutedCount(layers), 464);
  EXPECT_EQ(layers.front().name, "conv1");
  EXPECT_EQ(layers[4].name, "layer1.0.conv1");
  EXPECT_EQ(layers.back().name, "fc");
  EXPECT_EQ(layers.front().tensors.front().name, "conv1.weight");
}

TEST(LayerViewTest, InceptionAuxHeadRunsOnlyInTraining) {
  auto model = Create("inception_v3");
  ASSERT_TRUE(model);
  ExpectLayersCoverStateDictOnce(*model);
  for (const Layer& layer : LayersOf(*model)) {
    EXPECT_EQ(layer.executed, layer.name.rfind("AuxLogits.", 0) != 0) << layer.name;
  }
  model->train();
  ExpectLayersCoverStateDictOnce(*model);
  const auto& train_layers = LayersOf(*model);
  EXPECT_EQ(ExecutedCount(train_layers), static_cast<int>(train_layers.size()));
  int aux_first = -1, mixed_7a_first = -1;
  for (int i = 0; i < static_cast<int>(train_layers.size()); ++i) {
    if (aux_first < 0 && train_layers[i].name.rfind("AuxLogits.", 0) == 0) aux_first = i;
    if (mixed_7a_first < 0 && train_layers[i].name.rfind("Mixed_7a.", 0) == 0) mixed_7a_first = i;
  }
  EXPECT_LT(aux_first, mixed_7a_first);
  EXPECT_EQ(train_layers[aux_first - 1].name, "Mixed_6e.branch_pool.bn");
}

TEST(LayerViewTest, EveryZooModelCoversItsStateDictInBothModes) {
  const std::map<std::string, ModelConfig> small = {
      {"bert_base", ModelConfig{{{"num_hidden_layers", 2}}}},
      {"bert_large", ModelConfig{{{"num_hidden_layers", 2}}}},
  };
  for (const std::string& name : ModelNames()) {
    SCOPED_TRACE(name);
    auto it = small.find(name);
    auto model = Create(name, it == small.end() ? ModelConfig{} : it->second);
    ASSERT_TRUE(model);
    ExpectLayersCoverStateDictOnce(*model);
    model->train();
    ExpectLayersCoverStateDictOnce(*model);
  }
}

TEST(GateHookTest, CalledOncePerExecutedLayerInOrder) {
  for (const char* name : {"tiny_cnn", "resnet18", "gpt2"}) {
    SCOPED_TRACE(name);
    auto model = Create(name);
    ASSERT_TRUE(model);
    const auto& layers = LayersOf(*model);
    std::vector<int> calls;
    model->SetGateHook([&](int index) { calls.push_back(index); });
    torch::NoGradGuard no_grad;
    ASSERT_TRUE(RunForward(*model, model->ExampleInput(1, 3)).ok());
    ASSERT_EQ(static_cast<int>(calls.size()), ExecutedCount(layers));
    for (int i = 0; i < static_cast<int>(calls.size()); ++i) ASSERT_EQ(calls[i], i);
  }
  auto cnn = Create("tiny_cnn");
  std::vector<std::string> names;
  for (const Layer& layer : LayersOf(*cnn)) names.push_back(layer.name);
  EXPECT_THAT(names, ::testing::ElementsAre("conv1", "bn1", "relu", "pool", "conv2", "bn2",
                                            "relu#2", "dropout", "avgpool", "fc"));
}

TEST(GateHookTest, RecordingLayersInTrainModeLeavesRunningStatsAlone) {
  auto model = Create("tiny_cnn");
  model->train();
  const at::Tensor before = model->named_buffers()["bn1.running_mean"].clone();
  LayersOf(*model);
  EXPECT_TRUE(at::equal(before, model->named_buffers()["bn1.running_mean"]));
}

TEST(WeightsTest, SavedWeightsLoadIntoAFreshModelAndReproduceOutputs) {
  auto a = Create("tiny_cnn", {}, 1);
  auto b = Create("tiny_cnn", {}, 2);
  const std::string path = ::testing::TempDir() + "/tiny_cnn.safetensors";
  auto state = StateDict(*a);
  ASSERT_TRUE(state.ok());
  ASSERT_TRUE(WriteTensors(path, *state).ok());
  ASSERT_TRUE(LoadWeights(*b, path).ok());
  torch::NoGradGuard no_grad;
  const ModelInput in = a->ExampleInput(2, 5);
  EXPECT_TRUE(at::equal(a->Forward(in).output, b->Forward(in).output));
  ::unlink(path.c_str());
}

TEST(WeightsTest, MissingUnexpectedAndMisshapenKeysAreNamed) {
  auto model = Create("tiny_mlp");
  auto state = StateDict(*model);
  ASSERT_TRUE(state.ok());
  auto load = [&](const NamedTensors& tensors) {
    const std::string path = ::testing::TempDir() + "/ckpt.safetensors";
    EXPECT_TRUE(WriteTensors(path, tensors).ok());
    absl::Status status = LoadWeights(*model, path);
    ::unlink(path.c_str());
    return std::string(status.message());
  };
  NamedTensors missing(state->begin() + 1, state->end());
  EXPECT_THAT(load(missing), HasSubstr("missing keys 'fc1.weight'"));
  NamedTensors extra = *state;
  extra.emplace_back("fc3.weight", at::zeros({1}));
  EXPECT_THAT(load(extra), HasSubstr("unexpected keys 'fc3.weight'"));
  NamedTensors misshapen = *state;
  misshapen[0].second = at::zeros({3, 3});
  EXPECT_THAT(load(misshapen), HasSubstr("key 'fc1.weight': checkpoint shape [3, 3]"));
  NamedTensors wrong_kind = *state;
  wrong_kind[0].second = at::zeros_like(wrong_kind[0].second, at::kLong);
  EXPECT_THAT(load(wrong_kind), HasSubstr("key 'fc1.weight': checkpoint dtype I64"));
  NamedTensors half = *state;
  for (auto& [name, tensor] : half) tensor = tensor.to(at::kHalf);
  EXPECT_EQ(load(half), "");
}

TEST(TrainingTest, StepChangesWeightsDeterministically) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam}) {
    std::vector<at::Tensor> results;
    at::Tensor initial;
    for (int trial = 0; trial < 2; ++trial) {
      auto model = Create("tiny_cnn", {}, 11);
      initial = model->named_parameters()["conv1.weight"].clone();
      auto trainer = Trainer::Create(*model, {kind, 0.05, 0.9});
      ASSERT_TRUE(trainer.ok());
      torch::manual_seed(3);  // dropout
      for (int step = 0; step < 2; ++step) {
        // The second trial times its steps by part: the same computation, the same weights.
        Trainer::StepParts parts;
        auto loss = (*trainer)->Step(model->ExampleInput(4, step), model->ExampleTarget(4, step),
                                     trial == 1 ? &parts : nullptr);
        ASSERT_TRUE(loss.ok()) << loss.status();
        EXPECT_TRUE(std::isfinite(*loss));
        if (trial == 1) {
          EXPECT_GT(parts.forward_backward_ns, 0);
          EXPECT_GT(parts.update_ns, 0);
          EXPECT_GE(parts.loss_wait_ns, 0);
        }
      }
      results.push_back(model->named_parameters()["conv1.weight"].clone());
    }
    EXPECT_FALSE(at::equal(initial, results[0]));
    EXPECT_TRUE(at::equal(results[0], results[1]));
  }
}

// A task preempted between steps resumes in a fresh Trainer (another process, in pswitchd) with
// its optimizer state kept outside: the result must equal an uninterrupted run, bit for bit.
TEST(TrainingTest, ExternalOptimizerStateResumesExactly) {
  const std::vector<TrainerOptions> configs = {{OptimizerKind::kSgd, 0.05, 0.9},
                                               {OptimizerKind::kAdam, 1e-2, 0}};
  for (const TrainerOptions& options : configs) {
    SCOPED_TRACE(options.optimizer == OptimizerKind::kAdam ? "adam" : "sgd-momentum");
    constexpr int kSteps = 4;
    auto train = [&](ZooModel& model, Trainer& trainer, int from, int to) {
      for (int step = from; step < to; ++step) {
        torch::manual_seed(step);
        ASSERT_TRUE(trainer.Step(model.ExampleInput(4, step), model.ExampleTarget(4, step)).ok());
      }
    };
    auto reference = Create("tiny_cnn", {}, 5);
    auto uninterrupted = Trainer::Create(*reference, options);
    ASSERT_TRUE(uninterrupted.ok());
    train(*reference, **uninterrupted, 0, kSteps);

    auto model = Create("tiny_cnn", {}, 5);
    ASSERT_EQ(OptimizerStateSlots(options), options.optimizer == OptimizerKind::kAdam ? 2 : 1);
    std::vector<std::byte> storage(OptimizerStateSlots(options) * OptimizerSlotBytes(*model));
    for (auto [from, to] : {std::pair{0, 1}, std::pair{1, 3}, std::pair{3, kSteps}}) {
      ExternalOptimizerState state{storage, from};
      auto trainer = Trainer::Create(*model, options, &state);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      train(*model, **trainer, from, to);
    }
    auto want = reference->named_parameters();
    for (const auto& item : model->named_parameters()) {
      EXPECT_TRUE(at::equal(item.value(), want[item.key()])) << item.key();
    }
    // The state really lives in the external storage (not a private copy).
    EXPECT_TRUE(
        std::any_of(storage.begin(), storage.end(), [](std::byte b) { return b != std::byte{0}; }));
  }
}

// How many of `model`'s layers its recorded pass executed (0 when it cannot record one).
int ExecutedLayers(ZooModel& model) {
  auto layers = model.Layers();
  EXPECT_TRUE(layers.ok()) << layers.status();
  if (!layers.ok()) return 0;
  int executed = 0;
  for (const Layer& l : **layers) executed += l.executed ? 1 : 0;
  return executed;
}

// tiny_cnn (seed 5) after `steps` uncut steps of `options`, step k drawn from seed k: what a run
// whose steps were cut and run again must end as.
void TrainUncut(const TrainerOptions& options, int steps, std::shared_ptr<ZooModel>* out) {
  *out = Create("tiny_cnn", {}, 5);
  auto trainer = Trainer::Create(**out, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(step);
    ASSERT_TRUE(
        (*trainer)->Step((*out)->ExampleInput(4, step), (*out)->ExampleTarget(4, step)).ok());
  }
}

// Every parameter and buffer of `model` bit for bit `want`'s.
void ExpectSameState(ZooModel& model, ZooModel& want) {
  auto want_params = want.named_parameters();
  for (const auto& item : model.named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), want_params[item.key()])) << item.key();
  }
  auto want_buffers = want.named_buffers();
  for (const auto& item : model.named_buffers()) {
    EXPECT_TRUE(at::equal(item.value(), want_buffers[item.key()])) << item.key();
  }
}

// A preemption cuts a step at a layer boundary (the gate hook throws StepCut), after the
// forward, or at any node of the backward: the cut step leaves parameters, BatchNorm's running
// statistics and the optimizer state untouched, so running it again ends bit-identical to a run
// that was never cut. Every cut point of tiny_cnn's forward is tried (its BatchNorm layers
// update their statistics as the forward passes them), with both optimizers.
TEST(TrainingTest, AStepCutAtAnyLayerLeavesNoTraceAndRunsAgainExactly) {
  const std::vector<TrainerOptions> configs = {{OptimizerKind::kSgd, 0.05, 0.9},
                                               {OptimizerKind::kAdam, 1e-2, 0}};
  constexpr int kSteps = 3;
  for (const TrainerOptions& options : configs) {
    SCOPED_TRACE(options.optimizer == OptimizerKind::kAdam ? "adam" : "sgd-momentum");
    std::shared_ptr<ZooModel> reference;
    ASSERT_NO_FATAL_FAILURE(TrainUncut(options, kSteps, &reference));
    const int executed = ExecutedLayers(*reference);
    ASSERT_GT(executed, 0);
    // Cut points: before forward layer k (k < executed), then after the forward (executed), then
    // after the backward (executed + 1).
    for (int cut_at = 0; cut_at <= executed + 1; ++cut_at) {
      SCOPED_TRACE(absl::StrCat("cut at ", cut_at));
      auto model = Create("tiny_cnn", {}, 5);
      auto trainer = Trainer::Create(*model, options);
      ASSERT_TRUE(trainer.ok());
      std::atomic<bool> stop{false};
      for (int step = 0; step < kSteps; ++step) {
        if (step == 1) {
          // Step 1 is cut once, then run again from the same seed.
          model->SetGateHook([&](int layer) {
            if (layer == cut_at) throw StepCut();
            if (layer == executed - 1 && cut_at == executed) stop = true;  // seen after forward
          });
          at::Tensor fc_weight = model->named_parameters()["fc.weight"];
          const unsigned hook = fc_weight.register_hook([&](at::Tensor grad) {
            if (cut_at == executed + 1) stop = true;  // during the backward
            return grad;
          });
          torch::manual_seed(step);
          auto cut = (*trainer)->Step(model->ExampleInput(4, step), model->ExampleTarget(4, step),
                                      nullptr, {&stop});
          EXPECT_TRUE(IsStepCut(cut.status())) << cut.status();
          if (cut_at == executed + 1) {
            // Set during the backward (fc is its first layer): cut there, conv1 never reached.
            const at::Tensor& grad = model->named_parameters()["conv1.weight"].grad();
            EXPECT_TRUE(!grad.defined() || grad.abs().sum().item<double>() == 0);
          }
          fc_weight.remove_hook(hook);
          model->SetGateHook(nullptr);
          stop = false;
        }
        torch::manual_seed(step);
        auto loss = (*trainer)->Step(model->ExampleInput(4, step), model->ExampleTarget(4, step),
                                     nullptr, {&stop});
        ASSERT_TRUE(loss.ok()) << loss.status();
      }
      ExpectSameState(*model, *reference);
    }
  }
}

// A fill step still under way at its bubble's end is cut by its deadline alone (issue 30 item 2),
// with no Stop: a deadline already past cuts the step at its first point and it leaves no trace;
// the same step then runs to its end, as in a run never cut.
TEST(TrainingTest, AStepPastItsDeadlineIsCutWithoutAStopAndLeavesNoTrace) {
  const TrainerOptions options{OptimizerKind::kSgd, 0.05, 0.9};
  constexpr int kSteps = 2;
  std::shared_ptr<ZooModel> reference;
  ASSERT_NO_FATAL_FAILURE(TrainUncut(options, kSteps, &reference));
  auto model = Create("tiny_cnn", {}, 5);
  auto trainer = Trainer::Create(*model, options);
  ASSERT_TRUE(trainer.ok());
  for (int step = 0; step < kSteps; ++step) {
    StepCutOptions past;
    const std::atomic<int64_t> past_ns{base::MonotonicNowNs()};
    past.deadline_ns = &past_ns;
    EXPECT_TRUE(past.armed() && past.Now());
    torch::manual_seed(step);
    auto cut = (*trainer)->Step(model->ExampleInput(4, step), model->ExampleTarget(4, step),
                                nullptr, past);
    EXPECT_TRUE(IsStepCut(cut.status())) << cut.status();
    StepCutOptions later;
    const std::atomic<int64_t> later_ns{base::MonotonicNowNs() +
                                        absl::ToInt64Nanoseconds(absl::Hours(1))};
    later.deadline_ns = &later_ns;
    EXPECT_FALSE(later.Now());
    torch::manual_seed(step);
    auto loss = (*trainer)->Step(model->ExampleInput(4, step), model->ExampleTarget(4, step),
                                 nullptr, later);
    ASSERT_TRUE(loss.ok()) << loss.status();
  }
  ExpectSameState(*model, *reference);
}

// A resident fill run's step suspended at its bubble's end (issue 30) goes on where it stopped
// once its next bubble opens: suspended at a forward layer's point (the layer gate's, through
// StepCutPoint), at another, and at a node of its backward, it ends bit-identical to a step never
// suspended; a suspension that answers false (the run is ending) cuts the step, leaving no trace.
TEST(TrainingTest, AStepSuspendedAtItsDeadlineGoesOnAndEndsAsOneNeverSuspended) {
  const TrainerOptions options{OptimizerKind::kSgd, 0.05, 0.9};
  constexpr int kSteps = 2;
  std::shared_ptr<ZooModel> reference;
  ASSERT_NO_FATAL_FAILURE(TrainUncut(options, kSteps, &reference));
  auto model = Create("tiny_cnn", {}, 5);
  auto trainer = Trainer::Create(*model, options);
  ASSERT_TRUE(trainer.ok());
  const int64_t far = base::MonotonicNowNs() + absl::ToInt64Nanoseconds(absl::Hours(1));
  std::atomic<int64_t> deadline_ns{0};
  int suspensions = 0;
  bool go_on = false;
  // "The next bubble" opens at once, and lasts.
  const std::function<bool()> suspend = [&] {
    ++suspensions;
    deadline_ns = far;
    return go_on;
  };
  // The bubble ends at layer 0 (the deadline passed already) and again at layer 2; the layer
  // gate's point is StepCutPoint with the step's options.
  model->SetGateHook([&](int layer) {
    if (layer == 2) deadline_ns = base::MonotonicNowNs();
    StepCutPoint(nullptr, &deadline_ns, &suspend);
  });
  // And once more in the backward (fc is its first layer): the next node's point sees it.
  at::Tensor fc_weight = model->named_parameters()["fc.weight"];
  const unsigned hook = fc_weight.register_hook([&](at::Tensor grad) {
    deadline_ns = base::MonotonicNowNs();
    return grad;
  });
  StepCutOptions cut;
  cut.deadline_ns = &deadline_ns;
  cut.suspend = &suspend;
  for (int step = 0; step < kSteps; ++step) {
    deadline_ns = base::MonotonicNowNs();
    go_on = false;
    suspensions = 0;
    torch::manual_seed(step);
    auto ended =
        (*trainer)->Step(model->ExampleInput(4, step), model->ExampleTarget(4, step), nullptr, cut);
    EXPECT_TRUE(IsStepCut(ended.status())) << ended.status();
    EXPECT_EQ(suspensions, 1);
    deadline_ns = base::MonotonicNowNs();
    go_on = true;
    suspensions = 0;
    torch::manual_seed(step);
    auto loss =
        (*trainer)->Step(model->ExampleInput(4, step), model->ExampleTarget(4, step), nullptr, cut);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_EQ(suspensions, 3);
  }
  fc_weight.remove_hook(hook);
  model->SetGateHook(nullptr);
  ExpectSameState(*model, *reference);
}

// The first step of a run starts while its weights are still landing: it reads each layer's
// buffers at that layer's gate, once they came, so a cut puts back what the forward changed as it
// had arrived, and writes nothing over the layers it never reached, whose copy lands meanwhile.
TEST(TrainingTest, AStepCutWhileWeightsArriveRestoresWhatArrivedAndNothingElse) {
  const TrainerOptions options{OptimizerKind::kSgd, 0.05, 0.9};
  constexpr int kSteps = 2;
  std::shared_ptr<ZooModel> reference;
  ASSERT_NO_FATAL_FAILURE(TrainUncut(options, kSteps, &reference));
  const int executed = ExecutedLayers(*reference);  // training mode, as the step left it
  ASSERT_GT(executed, 0);
  for (int cut_at = 0; cut_at <= executed + 1; ++cut_at) {
    SCOPED_TRACE(absl::StrCat("cut at ", cut_at));
    auto model = Create("tiny_cnn", {}, 5);
    auto trainer = Trainer::Create(*model, options);
    ASSERT_TRUE(trainer.ok());
    model->train();
    auto layers = model->Layers();
    ASSERT_TRUE(layers.ok());
    // Each layer's buffers as the copy brings them; until then they hold what the region held.
    std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> arriving((*layers)->size());
    std::vector<std::vector<at::Tensor>> call_buffers((*layers)->size());  // what each call writes
    for (size_t l = 0; l < (*layers)->size(); ++l) {
      for (const LayerTensor& t : (**layers)[l].tensors) {
        if (t.is_parameter) continue;
        call_buffers[l].push_back(t.tensor);
        arriving[l].emplace_back(t.tensor, t.tensor.clone());
        torch::NoGradGuard no_grad;
        t.tensor.fill_(7);
      }
    }
    const auto land = [&](size_t l) {
      torch::NoGradGuard no_grad;
      for (auto& [buffer, value] : arriving[l]) buffer.copy_(value);
    };
    std::atomic<bool> stop{false};
    model->SetGateHook([&](int layer) {
      if (layer == cut_at) {
        for (size_t l = 0; l < arriving.size(); ++l) land(l);  // the rest landed meanwhile
        throw StepCut();
      }
      land(layer);  // the gate lets a layer go once its group is in
      if (layer == executed - 1 && cut_at == executed) stop = true;  // seen after forward
    });
    at::Tensor fc_weight = model->named_parameters()["fc.weight"];
    const unsigned hook = fc_weight.register_hook([&](at::Tensor grad) {
      if (cut_at == executed + 1) stop = true;  // during the backward
      return grad;
    });
    torch::manual_seed(0);
    auto cut = (*trainer)->Step(model->ExampleInput(4, 0), model->ExampleTarget(4, 0), nullptr,
                                {&stop, 0, &call_buffers});
    EXPECT_TRUE(IsStepCut(cut.status())) << cut.status();
    fc_weight.remove_hook(hook);
    model->SetGateHook(nullptr);
    stop = false;
    for (size_t l = 0; l < arriving.size(); ++l) {
      for (const auto& [buffer, value] : arriving[l]) {
        EXPECT_TRUE(at::equal(buffer, value)) << (**layers)[l].name;
      }
    }
    for (int step = 0; step < kSteps; ++step) {
      torch::manual_seed(step);
      auto loss = (*trainer)->Step(model->ExampleInput(4, step), model->ExampleTarget(4, step),
                                   nullptr, {&stop});
      ASSERT_TRUE(loss.ok()) << loss.status();
    }
    ExpectSameState(*model, *reference);
  }
}

TEST(TrainingTest, ExternalOptimizerStateOfWrongSizeIsRejected) {
  auto model = Create("tiny_cnn");
  std::vector<std::byte> storage(OptimizerSlotBytes(*model));  // one slot; Adam needs two
  ExternalOptimizerState state{storage, 0};
  auto trainer = Trainer::Create(*model, {OptimizerKind::kAdam, 1e-3, 0}, &state);
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trainer.status().message()), HasSubstr("needs 2 x"));
  EXPECT_FALSE(Trainer::Create(*model, {OptimizerKind::kSgd, -1, 0}).ok());
  EXPECT_FALSE(Trainer::Create(*model, {OptimizerKind::kSgd, 0.1, 1.5}).ok());
}

TEST(TrainingTest, TransformersAndInceptionTrain) {
  const std::map<std::string, ModelConfig> configs = {
      {"gpt2", {}},
      {"bert_base", ModelConfig{{{"num_hidden_layers", 1},
                                 {"hidden_size", 32},
                                 {"num_attention_heads", 2},
                                 {"intermediate_size", 64},
                                 {"seq_len", 8}}}},
      {"inception_v3", ModelConfig{{{"num_classes", 10}}}},
  };
  for (const auto& [name, config] : configs) {
    SCOPED_TRACE(name);
    auto model = Create(name, config);
    auto trainer = Trainer::Create(*model, {OptimizerKind::kAdam, 1e-3, 0});
    ASSERT_TRUE(trainer.ok());
    auto loss = (*trainer)->Step(model->ExampleInput(2, 0), model->ExampleTarget(2, 0));
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_TRUE(std::isfinite(*loss));
    // A step that may be cut snapshots what its forward may update (not GPT-2's masks and
    // position tables), and one cut at its third layer leaves no trace.
    std::map<std::string, at::Tensor> before;
    for (const auto& item : model->named_parameters()) before[item.key()] = item.value().clone();
    for (const auto& item : model->named_buffers()) before[item.key()] = item.value().clone();
    std::atomic<bool> stop{false};
    model->SetGateHook([](int layer) {
      if (layer == 2) throw StepCut();
    });
    auto cut =
        (*trainer)->Step(model->ExampleInput(2, 1), model->ExampleTarget(2, 1), nullptr, {&stop});
    model->SetGateHook(nullptr);
    EXPECT_TRUE(IsStepCut(cut.status())) << cut.status();
    for (const auto& item : model->named_parameters()) {
      EXPECT_TRUE(at::equal(item.value(), before[item.key()])) << item.key();
    }
    for (const auto& item : model->named_buffers()) {
      EXPECT_TRUE(at::equal(item.value(), before[item.key()])) << item.key();
    }
    EXPECT_TRUE((*trainer)
                    ->Step(model->ExampleInput(2, 1), model->ExampleTarget(2, 1), nullptr, {&stop})
                    .ok());
  }
}

TEST(ProfilerTest, ProfileHasOneTimedEntryPerExecutedLayer) {
  auto model = Create("tiny_cnn");
  ProfileOptions options;
  options.batch = 2;
  options.warmup_runs = 1;
  options.measured_runs = 3;
  int progress_lines = 0;
  options.progress = [&](const std::string&) { ++progress_lines; };
  for (bool training : {false, true}) {
    options.training = training;
    auto profile = ProfileModel(*model, c10::Device(c10::kCPU), options);
    ASSERT_TRUE(profile.ok()) << profile.status();
    nlohmann::json json = ProfileToJson(*profile);
    EXPECT_EQ(json["model"], "tiny_cnn");
    EXPECT_EQ(json["bandwidth_bytes_per_s"], 12e9);
    EXPECT_GT(json["transfer_overhead_s"].get<double>(), 0);
    EXPECT_GT(json["group_sync_overhead_s"].get<double>(), 0);
    ASSERT_EQ(json["layers"].size(), 10u);
    EXPECT_EQ(json["layers"][0]["name"], "conv1");
    EXPECT_EQ(json["layers"][0]["param_bytes"], (8 * 3 * 9 + 8) * 4);
    for (const auto& layer : json["layers"]) EXPECT_GE(layer["exec_s"].get<double>(), 0);
  }
  EXPECT_EQ(progress_lines, 8);
  EXPECT_EQ(ResolveDevice("tpu").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::models
