// Issue 28 item 1: a worker binds a model by the layout registration inspected, by tensor name,
// without recording a forward pass of its own; whatever it is given that disagrees with the model
// is refused, never half-bound.
#include "worker/model_binding.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memdaemon/weight_layout.h"
#include "models/registry.h"
#include "models/training.h"

namespace pswitch::worker {
namespace {

using ::testing::HasSubstr;

// `reference`'s weights copied into a fresh host region at `layout`'s places.
std::vector<std::byte> RegionOf(models::ZooModel& reference, const ModelLayout& layout) {
  absl::StatusOr<ModelWeights> weights = CollectWeights(reference, "m");
  EXPECT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<memdaemon::WeightLayout> placed = memdaemon::ComputeWeightLayout(layout.layers);
  EXPECT_TRUE(placed.ok()) << placed.status();
  std::vector<std::byte> region(placed->total_bytes);
  for (size_t l = 0; l < weights->bytes.layers.size(); ++l) {
    for (size_t t = 0; t < weights->bytes.layers[l].tensors.size(); ++t) {
      const auto& bytes = weights->bytes.layers[l].tensors[t].bytes;
      std::memcpy(region.data() + placed->placements[l][t].offset, bytes.data(), bytes.size());
    }
  }
  return region;
}

void ExpectBindsWithoutRecording(const models::ModelSource& source,
                                 std::shared_ptr<models::ZooModel> reference, bool zoo) {
  absl::StatusOr<ModelLayout> layout = LayoutOf(*reference);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<std::byte> region = RegionOf(*reference, *layout);
  absl::StatusOr<std::unique_ptr<BoundModel>> bound =
      BoundModel::Create(source, "m", region.data(), *layout);
  ASSERT_TRUE(bound.ok()) << bound.status();
  if (zoo) {
    // An archive's loader records its gate paths (its runtime needs them); a zoo model's build
    // records nothing.
    EXPECT_EQ((*bound)->model().layer_recordings(), 0);
  }
  EXPECT_EQ((*bound)->num_layers(), layout->layers.size());
  ASSERT_EQ((*bound)->mode_layers(true), layout->train_order.size());
  for (size_t i = 0; i < layout->train_order.size(); ++i) {
    EXPECT_EQ((*bound)->LayoutIndex(true, static_cast<int>(i)), layout->train_order[i]);
  }
  // What each training call may write (a step cut while weights arrive reads those at the
  // call's gate): its layer's own buffers, in the region, none of them a parameter.
  reference->train();
  absl::StatusOr<const std::vector<models::Layer>*> train_layers = reference->Layers();
  ASSERT_TRUE(train_layers.ok()) << train_layers.status();
  const auto& call_buffers = (*bound)->training_call_buffers();
  ASSERT_EQ(call_buffers.size(), layout->train_order.size());
  for (size_t i = 0; i < call_buffers.size(); ++i) {
    size_t want = 0;
    for (const models::LayerTensor& t : (**train_layers)[i].tensors) want += t.is_parameter ? 0 : 1;
    EXPECT_EQ(call_buffers[i].size(), want) << (**train_layers)[i].name;
    for (const at::Tensor& b : call_buffers[i]) {
      EXPECT_FALSE(b.requires_grad());
      const auto* at = static_cast<const std::byte*>(b.data_ptr());
      EXPECT_TRUE(at >= region.data() && at < region.data() + region.size());
    }
  }
  if (zoo && !layout->train_order.empty()) {
    // A trainer over the bound model runs no forward of its own either (one would read, and its
    // restore write back, weights still in flight).
    auto trainer = models::Trainer::Create((*bound)->model(), models::TrainerOptions{});
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    EXPECT_EQ((*bound)->model().layer_recordings(), 0);
  }
  // Every tensor lies in the region, and the model answers as the reference does.
  for (const at::Tensor& p : (*bound)->model().parameters()) {
    const auto* at = static_cast<const std::byte*>(p.data_ptr());
    EXPECT_TRUE(at >= region.data() && at < region.data() + region.size());
  }
  const models::ModelInput input = reference->ExampleInput(2, 3);
  (*bound)->model().eval();
  reference->eval();
  auto want = models::RunForward(*reference, input);
  auto got = models::RunForward((*bound)->model(), input);
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
  EXPECT_TRUE(torch::equal(want->output, got->output));

  // Issue 29 item 3: the weights cache may place the model elsewhere next time. Moving its
  // region is one pointer: every parameter and buffer follows, nothing is rebuilt, and the old
  // place is no longer read.
  std::vector<std::byte> moved(region);
  std::fill(region.begin(), region.end(), std::byte{0x7f});
  (*bound)->Rebind(moved.data());
  EXPECT_EQ((*bound)->region(), moved.data());
  EXPECT_EQ((*bound)->region_bytes(), layout->total_bytes);
  for (const at::Tensor& p : (*bound)->model().parameters()) {
    const auto* at = static_cast<const std::byte*>(p.data_ptr());
    EXPECT_TRUE(at >= moved.data() && at < moved.data() + moved.size());
  }
  for (const at::Tensor& b : (*bound)->model().buffers()) {
    const auto* at = static_cast<const std::byte*>(b.data_ptr());
    EXPECT_TRUE(at >= moved.data() && at < moved.data() + moved.size());
  }
  auto after_move = models::RunForward((*bound)->model(), input);
  ASSERT_TRUE(after_move.ok()) << after_move.status();
  EXPECT_TRUE(torch::equal(want->output, after_move->output));
}

TEST(ModelBindingTest, ZooModelsBindByNameWithoutRecordingAForwardPass) {
  for (const char* name : {"tiny_cnn", "tiny_mlp", "gpt2", "resnet18", "inception_v3"}) {
    SCOPED_TRACE(name);
    auto reference = models::CreateModel(name, {}, 11);
    ASSERT_TRUE(reference.ok()) << reference.status();
    ExpectBindsWithoutRecording({name, nullptr, ""}, *reference, true);
  }
}

// A half-precision zoo model (issue 28 item 5) is converted before binding: its tensors take
// half the region, and it answers as the reference converted the same way.
TEST(ModelBindingTest, ABfloat16ZooModelBindsInItsOwnPrecision) {
  auto reference = models::CreateModel("tiny_cnn", {}, 4);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto float_layout = LayoutOf(**reference);
  ASSERT_TRUE(float_layout.ok());
  (*reference)->to(torch::kBFloat16);
  absl::StatusOr<ModelLayout> layout = LayoutOf(**reference);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->dtype, models::ModelDType::kBFloat16);
  EXPECT_LT(layout->total_bytes, float_layout->total_bytes);
  ExpectBindsWithoutRecording({"tiny_cnn", nullptr, ""}, *reference, true);
}

TEST(ModelBindingTest, AnArchiveBindsByName) {
  const std::string path = std::string(PSWITCH_TEST_DATA_DIR) + "/archives/residual_cnn.pswitch.pt";
  auto bytes = base::ReadRegularFile(path, "archive", 64 << 20);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto archive = std::make_shared<const std::string>(*bytes);
  auto reference = models::CreateModelFrom({"torchscript", archive, path}, "m");
  ASSERT_TRUE(reference.ok()) << reference.status();
  ExpectBindsWithoutRecording({"torchscript", archive, path}, *reference, false);
}

TEST(ModelBindingTest, ALayoutThatDisagreesWithTheModelIsRefused) {
  auto reference = models::CreateModel("tiny_cnn");
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<ModelLayout> good = LayoutOf(**reference);
  ASSERT_TRUE(good.ok()) << good.status();
  std::vector<std::byte> region = RegionOf(**reference, *good);
  const models::ModelSource source{"tiny_cnn", nullptr, ""};
  auto refused = [&](ModelLayout layout, absl::StatusCode code, const std::string& why) {
    absl::StatusOr<memdaemon::WeightLayout> placed = memdaemon::ComputeWeightLayout(layout.layers);
    if (placed.ok() && layout.total_bytes == good->total_bytes) {
      layout.total_bytes = placed->total_bytes;
    }
    auto bound = BoundModel::Create(source, "m", region.data(), layout);
    ASSERT_FALSE(bound.ok()) << why;
    EXPECT_EQ(bound.status().code(), code) << bound.status();
    EXPECT_THAT(bound.status().message(), HasSubstr("model 'm'")) << bound.status();
  };
  ModelLayout missing = *good;
  missing.layers.front().tensors.pop_back();  // a tensor the model has and the layout lacks
  refused(missing, absl::StatusCode::kFailedPrecondition, "a tensor outside the layout");
  ModelLayout ghost = *good;
  ghost.layers.front().tensors.push_back({"ghost.weight", 16});
  refused(ghost, absl::StatusCode::kFailedPrecondition, "a tensor the model lacks");
  ModelLayout resized = *good;
  resized.layers.front().tensors.front().bytes += 4;
  refused(resized, absl::StatusCode::kFailedPrecondition, "a size that differs");
  ModelLayout twice = *good;
  twice.layers.back().tensors.push_back(twice.layers.front().tensors.front());
  refused(twice, absl::StatusCode::kFailedPrecondition, "a tensor laid out twice");
  ModelLayout order = *good;
  order.train_order.push_back(static_cast<int>(order.layers.size()));
  refused(order, absl::StatusCode::kInvalidArgument, "a training order past the layers");
  ModelLayout total = *good;
  total.total_bytes += 256;
  refused(total, absl::StatusCode::kFailedPrecondition, "a total that differs");
  ModelLayout unknown = *good;
  unknown.layers.back().name = "no_such_module";
  refused(unknown, absl::StatusCode::kFailedPrecondition, "a layer the model does not have");
}

// The orders are what gating trusts: a forward that takes another path than registration
// recorded (here: a training order with two layers swapped) is refused at the first call that
// differs, before that layer runs, in either mode.
TEST(ModelBindingTest, AForwardOffRegistrationsOrderIsRefused) {
  auto reference = models::CreateModel("tiny_cnn");
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<ModelLayout> layout = LayoutOf(**reference);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_GE(layout->train_order.size(), 2u);
  std::swap(layout->train_order[0], layout->train_order[1]);
  std::vector<std::byte> region = RegionOf(**reference, *layout);
  auto bound = BoundModel::Create({"tiny_cnn", nullptr, ""}, "m", region.data(), *layout);
  ASSERT_TRUE(bound.ok()) << bound.status();
  const models::ModelInput input = (*reference)->ExampleInput(2, 3);
  (*bound)->model().eval();
  EXPECT_TRUE(models::RunForward((*bound)->model(), input).ok()) << "the eval order is right";
  (*bound)->model().train();
  auto trained = models::RunForward((*bound)->model(), input);
  ASSERT_FALSE(trained.ok());
  EXPECT_THAT(trained.status().message(), HasSubstr("layer call 0 is not the layer"));
  // An archive whose recorded path is not registration's is refused at load.
  const std::string path = std::string(PSWITCH_TEST_DATA_DIR) + "/archives/residual_cnn.pswitch.pt";
  auto bytes = base::ReadRegularFile(path, "archive", 64 << 20);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const models::ModelSource archive{"torchscript", std::make_shared<const std::string>(*bytes),
                                    path};
  auto script = models::CreateModelFrom(archive, "m");
  ASSERT_TRUE(script.ok()) << script.status();
  absl::StatusOr<ModelLayout> script_layout = LayoutOf(**script);
  ASSERT_TRUE(script_layout.ok()) << script_layout.status();
  ASSERT_GE(script_layout->train_order.size(), 2u);
  std::swap(script_layout->train_order[0], script_layout->train_order[1]);
  std::vector<std::byte> script_region = RegionOf(**script, *script_layout);
  auto refused = BoundModel::Create(archive, "m", script_region.data(), *script_layout);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
}

}  // namespace
}  // namespace pswitch::worker
