#include "registry/model_catalog.h"

#include <torch/cuda.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "base/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memdaemon/host_test_daemon.h"
#include "models/model_inspection.h"

namespace pswitch::registry {
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
  ModelCatalog catalog(daemon_.get(), 32 << 20, models::InspectInProcess());
  absl::StatusOr<EntryRef> entry = catalog.Register({"m", "tiny_cnn", "", 2, "auto"});
  ASSERT_TRUE(entry.ok()) << entry.status();
  ASSERT_FALSE((*entry)->plan.empty());
  EXPECT_EQ((*entry)->plan.front().first, 0);
  EXPECT_EQ(static_cast<uint32_t>((*entry)->plan.back().last) + 1, (*entry)->stored->num_layers());
}

// On the CUDA backend auto plans are profiled on the GPU. Where this libtorch cannot, the
// registration says so and names the remedy instead of planning with CPU layer times.
TEST_F(ModelCatalogTest, AutoPlanOnAGpuIsProfiledThereOrRefusedWithTheRemedy) {
  ModelCatalog catalog(daemon_.get(), 32 << 20, models::InspectInProcess({"cuda:0", 25e9}));
  absl::StatusOr<EntryRef> entry = catalog.Register({"m", "tiny_cnn", "", 2, "auto"});
  if (torch::cuda::is_available()) {
    ASSERT_TRUE(entry.ok()) << entry.status();
    EXPECT_FALSE((*entry)->plan.empty());
    return;
  }
  EXPECT_EQ(entry.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(entry.status().message().find("plan file"), absl::string_view::npos) << entry.status();
  EXPECT_FALSE(catalog.Find("m").ok()) << "nothing is half-registered";
  EXPECT_TRUE(catalog.Register({"m", "tiny_cnn", "", 2, "auto"}).status().code() ==
              absl::StatusCode::kFailedPrecondition)
      << "the name is free again";
}

// Issue 27 item 8: a user's training trains its own copy. The copy has the original's definition
// and plan and a snapshot of its weights in a store of its own, so training either leaves the
// other alone.
TEST_F(ModelCatalogTest, ACopyHasTheOriginalsWeightsInItsOwnStore) {
  ModelCatalog catalog(daemon_.get(), 32 << 20, models::InspectInProcess());
  ModelRequest shared{"shared", "tiny_cnn", "", 2, "auto"};
  shared.trainers = {"carol"};
  absl::StatusOr<EntryRef> original = catalog.Register(shared);
  ASSERT_TRUE(original.ok()) << original.status();
  const memdaemon::StoredModel& from = *(*original)->stored;
  absl::StatusOr<EntryRef> copy = catalog.RegisterCopy(**original, "bobs", "bob");
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ((*copy)->request.name, "bobs");
  EXPECT_EQ((*copy)->request.owner, "bob");
  EXPECT_TRUE((*copy)->request.trainers.empty()) << "a copy is its owner's alone";
  EXPECT_EQ((*copy)->request.zoo_model, "tiny_cnn");
  EXPECT_EQ((*copy)->group_last_layer, (*original)->group_last_layer);
  const memdaemon::StoredModel& to = *(*copy)->stored;
  ASSERT_NE(&to, &from);
  ASSERT_EQ(to.total_bytes(), from.total_bytes());
  EXPECT_EQ(std::memcmp(to.host_bytes(), from.host_bytes(), to.total_bytes()), 0);
  from.host_bytes()[0] = std::byte{0x5a};  // the original trains on: the copy stays
  to.host_bytes()[1] = std::byte{0x33};
  EXPECT_NE(std::memcmp(to.host_bytes(), from.host_bytes(), 2), 0);
  EXPECT_NE(to.host_bytes()[0], std::byte{0x5a});
  EXPECT_EQ(catalog.Find("bobs")->get(), copy->get());
  EXPECT_EQ(catalog.pinned_bytes(), 2 * from.total_bytes());
  EXPECT_EQ(catalog.RegisterCopy(**original, "bobs", "bob").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(catalog.RegisterCopy(**original, "shared", "bob").status().code(),
            absl::StatusCode::kAlreadyExists);
  // Unloaded like any model.
  absl::StatusOr<EntryRef> taken = catalog.BeginUnload("bobs");
  ASSERT_TRUE(taken.ok());
  ASSERT_TRUE(catalog.FinishUnload(**taken).ok());
  EXPECT_TRUE(catalog.Find("shared").ok());
  EXPECT_EQ(catalog.pinned_bytes(), from.total_bytes());
}

// Unload in two steps: the model leaves the catalog at once, its name stays reserved until its
// pinned weights are freed, and a holder of its entry keeps reading valid metadata meanwhile.
TEST_F(ModelCatalogTest, UnloadTakesTheModelOutThenFreesItsWeightsAndName) {
  ModelCatalog catalog(daemon_.get(), 32 << 20, models::InspectInProcess());
  EXPECT_EQ(catalog.BeginUnload("m").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<EntryRef> entry = catalog.Register({"m", "tiny_cnn", "", 2, "auto"});
  ASSERT_TRUE(entry.ok()) << entry.status();
  ASSERT_TRUE(catalog.Register({"other", "tiny_mlp", "", 1, "auto"}).ok());
  const uint64_t bytes = (*entry)->stored->total_bytes();
  const uint64_t both = catalog.pinned_bytes();
  EXPECT_GT(both, bytes);

  absl::StatusOr<EntryRef> taken = catalog.BeginUnload("m");
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->get(), entry->get());
  EXPECT_EQ(catalog.Find("m").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog.List().size(), 1u);
  EXPECT_EQ(catalog.BeginUnload("m").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(catalog.Register({"m", "tiny_mlp", "", 1, "auto"}).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "the name stays reserved until the weights are gone";
  EXPECT_TRUE(daemon_->weights().Find("m").ok());

  ASSERT_TRUE(catalog.FinishUnload(**taken).ok());
  EXPECT_EQ(daemon_->weights().Find("m").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog.pinned_bytes(), both - bytes);
  EXPECT_EQ((*entry)->request.zoo_model, "tiny_cnn") << "a holder's entry outlives the unload";
  absl::StatusOr<EntryRef> again = catalog.Register({"m", "tiny_mlp", "", 1, "auto"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->request.zoo_model, "tiny_mlp");
}

// Weights already gone from the store (the one way a release fails) are freed as far as the
// catalog goes: the name is free and they no longer count as pinned.
TEST_F(ModelCatalogTest, WeightsAlreadyGoneFromTheStoreStillFreeTheNameAndTheCount) {
  ModelCatalog catalog(daemon_.get(), 32 << 20, models::InspectInProcess());
  const uint64_t before = catalog.pinned_bytes();
  absl::StatusOr<EntryRef> entry = catalog.Register({"m", "tiny_cnn", "", 2, "auto"});
  ASSERT_TRUE(entry.ok()) << entry.status();
  absl::StatusOr<EntryRef> taken = catalog.BeginUnload("m");
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_TRUE(daemon_->weights().Remove("m").ok());
  EXPECT_TRUE(catalog.FinishUnload(**taken).ok());
  EXPECT_EQ(catalog.pinned_bytes(), before);
  EXPECT_TRUE(catalog.Register({"m", "tiny_mlp", "", 1, "auto"}).ok());
}

// Issue 28 item 4: every registration reports its phases in order, each with its wall time.
TEST_F(ModelCatalogTest, ARegistrationReportsItsPhasesInOrder) {
  ModelCatalog catalog(daemon_.get(), 32 << 20, models::InspectInProcess());
  std::vector<RegistrationPhase> phases;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(catalog.Register({"m", "tiny_cnn", "", 2, "auto"}, &phases).ok());
  const absl::Duration wall = absl::Now() - start;
  std::vector<std::string> names;
  absl::Duration sum;
  for (const RegistrationPhase& p : phases) {
    names.push_back(p.name);
    EXPECT_GE(p.took, absl::ZeroDuration()) << p.name;
    sum += p.took;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"read", "inspect", "profile", "plan", "pin"}));
  EXPECT_LE(sum, wall);
  // A failed registration reports the phases it got through (its plan file is missing).
  phases.clear();
  EXPECT_FALSE(catalog.Register({"bad", "tiny_cnn", "", 2, "/no/such/plan.json"}, &phases).ok());
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_EQ(phases[1].name, "inspect");
}

// While its pipeline runs a model is kRegistering: its name is taken, it is not served, and it
// cannot be unloaded; a failed registration frees the name.
TEST_F(ModelCatalogTest, AModelBeingRegisteredIsNeitherServedNorUnloadable) {
  absl::Notification inspecting, release;
  ModelCatalog catalog(daemon_.get(), 32 << 20,
                       [&](const InspectionRequest& request) -> absl::StatusOr<models::ModelFacts> {
                         if (request.archive_fd < 0)
                           return absl::UnavailableError("no zoo models here");
                         inspecting.Notify();
                         release.WaitForNotification();
                         return absl::InvalidArgumentError("the archive is refused");
                       });
  absl::StatusOr<UniqueFd> archive = base::SealedMemoryFile("archive", "not read here");
  ASSERT_TRUE(archive.ok());
  ModelRequest request{"mine", "torchscript", "", 1, "auto"};
  request.archive_fd = std::make_shared<const UniqueFd>(std::move(*archive));
  absl::StatusOr<EntryRef> outcome;
  std::thread registering([&] { outcome = catalog.Register(request); });
  ASSERT_TRUE(inspecting.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(catalog.Find("mine").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(catalog.List().empty());
  EXPECT_EQ(catalog.BeginUnload("mine").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(catalog.Register({"mine", "tiny_mlp", "", 1, "auto"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  release.Notify();
  registering.join();
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog.pinned_bytes(), 0u) << "nothing pinned";
  EXPECT_EQ(catalog.Register({"mine", "tiny_mlp", "", 1, "auto"}).status().code(),
            absl::StatusCode::kUnavailable)
      << "the name is free: this registration got as far as the inspector";
}

}  // namespace
}  // namespace pswitch::registry
