#include "controller/model_catalog.h"

#include <torch/cuda.h>

#include "gtest/gtest.h"
#include "memdaemon/host_test_daemon.h"

namespace pswitch::controller {
namespace {

class ModelCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = memdaemon::HostTestDaemon();
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
  }
  std::unique_ptr<memdaemon::MemDaemon> daemon_;
};

TEST_F(ModelCatalogTest, AutoPlanOnTheCpuCoversEveryLayer) {
  ModelCatalog catalog(daemon_.get(), 32 << 20, AutoPlanProfile{});
  absl::StatusOr<const CatalogEntry*> entry = catalog.Register({"m", "tiny_cnn", "", 2, "auto"});
  ASSERT_TRUE(entry.ok()) << entry.status();
  ASSERT_FALSE((*entry)->plan.empty());
  EXPECT_EQ((*entry)->plan.front().first, 0);
  EXPECT_EQ(static_cast<uint32_t>((*entry)->plan.back().last) + 1, (*entry)->stored->num_layers());
}

// On the CUDA backend auto plans are profiled on the GPU. Where this libtorch cannot, the
// registration says so and names the remedy instead of planning with CPU layer times.
TEST_F(ModelCatalogTest, AutoPlanOnAGpuIsProfiledThereOrRefusedWithTheRemedy) {
  ModelCatalog catalog(daemon_.get(), 32 << 20, AutoPlanProfile{"cuda:0", 25e9});
  absl::StatusOr<const CatalogEntry*> entry = catalog.Register({"m", "tiny_cnn", "", 2, "auto"});
  if (torch::cuda::is_available()) {
    ASSERT_TRUE(entry.ok()) << entry.status();
    EXPECT_FALSE((*entry)->plan.empty());
    return;
  }
  EXPECT_EQ(entry.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(entry.status().message().find("plan file"), absl::string_view::npos)
      << entry.status();
  EXPECT_FALSE(catalog.Find("m").ok()) << "nothing is half-registered";
  EXPECT_TRUE(catalog.Register({"m", "tiny_cnn", "", 2, "auto"}).status().code() ==
              absl::StatusCode::kFailedPrecondition)
      << "the name is free again";
}

}  // namespace
}  // namespace pswitch::controller
