#include "memdaemon/weight_store.h"

#include <cstring>

#include "gtest/gtest.h"
#include "memdaemon/synthetic_model.h"

namespace pswitch::memdaemon {
namespace {

class WeightStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = gpu::Device::Open(gpu::DeviceOptions{});
    ASSERT_TRUE(device.ok());
    device_ = std::move(*device);
    store_ = std::make_unique<WeightStore>(device_.get(), /*max_model_bytes=*/8 << 20);
  }
  std::unique_ptr<gpu::Device> device_;
  std::unique_ptr<WeightStore> store_;
};

TEST_F(WeightStoreTest, StoresEveryTensorAtItsLayoutOffset) {
  auto synthetic = MakeSyntheticModel("m", 40, 4 << 20, 7);
  auto stored = store_->Register(synthetic->model);
  ASSERT_TRUE(stored.ok()) << stored.status();
  const WeightLayout& layout = (*stored)->layout();
  EXPECT_EQ((*stored)->num_layers(), 40u);
  for (size_t l = 0; l < 40; ++l) {
    for (size_t t = 0; t < synthetic->model.layers[l].tensors.size(); ++t) {
      auto bytes = synthetic->model.layers[l].tensors[t].bytes;
      ASSERT_EQ(layout.placements[l][t].bytes, bytes.size());
      EXPECT_EQ(std::memcmp((*stored)->host_bytes() + layout.placements[l][t].offset, bytes.data(),
                            bytes.size()),
                0)
          << "layer " << l << " tensor " << t;
    }
  }
  EXPECT_EQ(*store_->Find("m"), *stored);
  EXPECT_EQ(store_->Names(), std::vector<std::string>{"m"});
}

TEST_F(WeightStoreTest, BadRegistrationsFailClearlyAndRegisterNothing) {
  auto synthetic = MakeSyntheticModel("m", 10, 1 << 20, 1);
  ASSERT_TRUE(store_->Register(synthetic->model).ok());
  auto duplicate = store_->Register(synthetic->model);
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(duplicate.status().message().find("'m'"), absl::string_view::npos);

  auto huge = MakeSyntheticModel("huge", 10, 9 << 20, 1);
  auto too_big = store_->Register(huge->model);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("'huge'"), absl::string_view::npos);
  EXPECT_EQ(store_->Find("huge").status().code(), absl::StatusCode::kNotFound);

  ModelBytes unnamed = synthetic->model;
  unnamed.name = "";
  EXPECT_EQ(store_->Register(unnamed).status().code(), absl::StatusCode::kInvalidArgument);
  ModelBytes empty{"empty", {}};
  EXPECT_EQ(store_->Register(empty).status().code(), absl::StatusCode::kInvalidArgument);
  ModelBytes twice = synthetic->model;
  twice.name = "twice";
  twice.layers[3].tensors.push_back(twice.layers[1].tensors[0]);
  auto dup_tensor = store_->Register(twice);
  EXPECT_EQ(dup_tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup_tensor.status().message().find("duplicate tensor"), absl::string_view::npos);
  EXPECT_EQ(store_->Names(), std::vector<std::string>{"m"});

  // A name freed by a failed registration can be used once the input is fixed.
  huge = MakeSyntheticModel("huge", 10, 2 << 20, 1);
  EXPECT_TRUE(store_->Register(huge->model).ok());
  EXPECT_TRUE(store_->Remove("huge").ok());
  EXPECT_EQ(store_->Remove("huge").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pswitch::memdaemon
