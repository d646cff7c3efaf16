#include "memdaemon/weight_layout.h"

#include "gtest/gtest.h"

namespace pswitch::memdaemon {
namespace {

TEST(WeightLayoutTest, PlacesTensorsInOrderAtAlignedOffsets) {
  std::vector<LayerSpec> layers = {
      {"conv1", {{"conv1.weight", 1000}}},
      {"relu", {}},
      {"bn1", {{"bn1.weight", 12}, {"bn1.bias", 12}, {"bn1.num_batches_tracked", 8}}},
      {"fc", {{"fc.weight", 256}, {"fc.bias", 0}}},
  };
  auto layout = ComputeWeightLayout(layers);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->placements[0][0].offset, 0u);
  EXPECT_EQ(layout->layer_end[0], 1000u);
  EXPECT_TRUE(layout->placements[1].empty());
  EXPECT_EQ(layout->layer_begin[1], layout->layer_end[1]);
  EXPECT_EQ(layout->placements[2][0].offset, 1024u);
  EXPECT_EQ(layout->placements[2][1].offset, 1280u);
  EXPECT_EQ(layout->placements[2][2].offset, 1536u);
  EXPECT_EQ(layout->layer_begin[2], 1024u);
  EXPECT_EQ(layout->layer_end[2], 1544u);
  EXPECT_EQ(layout->placements[3][0].offset, 1792u);
  EXPECT_EQ(layout->placements[3][1].offset, 2048u);
  EXPECT_EQ(layout->total_bytes, 2048u);
  for (const auto& layer : layout->placements) {
    for (const auto& p : layer) EXPECT_EQ(p.offset % kWeightAlignmentBytes, 0u);
  }
}

TEST(WeightLayoutTest, IsAPureFunctionOfTheSpecs) {
  std::vector<LayerSpec> layers;
  for (int l = 0; l < 50; ++l) {
    layers.push_back({"l" + std::to_string(l), {{"w", uint64_t(l) * 37 + 3}, {"b", 4}}});
  }
  auto a = ComputeWeightLayout(layers);
  auto b = ComputeWeightLayout(std::vector<LayerSpec>(layers));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->total_bytes, b->total_bytes);
  for (size_t l = 0; l < layers.size(); ++l) {
    for (size_t t = 0; t < 2; ++t) {
      EXPECT_EQ(a->placements[l][t].offset, b->placements[l][t].offset);
    }
  }
}

TEST(WeightLayoutTest, RejectsBadAlignmentAndOverflow) {
  std::vector<LayerSpec> layers = {{"a", {{"w", 8}}}};
  EXPECT_EQ(ComputeWeightLayout(layers, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeWeightLayout(layers, 96).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<LayerSpec> huge = {{"a", {{"w", UINT64_MAX - 10}}}, {"b", {{"w2", 100}}}};
  auto status = ComputeWeightLayout(huge).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(status.message().find("'w2'"), absl::string_view::npos) << status;
}

}  // namespace
}  // namespace pswitch::memdaemon
