#include "registry/model_repository.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"

namespace pswitch::registry {
namespace {

class ModelRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/model_repository_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    top_ = tmpl;
    root_ = top_ + "/models";
    ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
    Model("cnn", R"({"architecture": "tiny_cnn", "weights": "w.safetensors", "batch": 4})");
    Model("mlp", R"({"architecture": "tiny_mlp"})");
    ASSERT_EQ(::mkdir((root_ + "/empty").c_str(), 0755), 0);  // no config: not a model
    auto repo = ModelRepository::Open(root_);
    ASSERT_TRUE(repo.ok()) << repo.status();
    repo_.emplace(std::move(*repo));
  }
  void TearDown() override { std::system(("rm -rf " + top_).c_str()); }
  void Model(const std::string& name, const std::string& config) {
    ::mkdir((root_ + "/" + name).c_str(), 0755);
    std::ofstream(root_ + "/" + name + "/config.json") << config;
  }

  std::string top_, root_;
  std::optional<ModelRepository> repo_;
};

TEST_F(ModelRepositoryTest, ListsModelsAndMakesTheirRequests) {
  auto index = repo_->Index();
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(*index, (std::vector<std::string>{"cnn", "mlp"}));
  auto cnn = repo_->Request("cnn");
  ASSERT_TRUE(cnn.ok()) << cnn.status();
  EXPECT_EQ(cnn->zoo_model, "tiny_cnn");
  EXPECT_EQ(cnn->weights_path, "w.safetensors");
  EXPECT_EQ(cnn->batch_size, 4u);
  EXPECT_EQ(cnn->plan, "auto");
  ASSERT_NE(cnn->files, nullptr);  // its files resolve in its own folder
  EXPECT_EQ(repo_->Request("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(repo_->Request("../models/cnn").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelRepositoryTest, BadConfigsAreRefusedNamingTheField) {
  Model("bad1", R"({"weights": "w"})");
  Model("bad2", R"({"architecture": "tiny_cnn", "batch": -3})");
  Model("bad3", R"({"architecture": "tiny_cnn", "weights": "../../etc/shadow"})");
  Model("bad4", std::string(100, '[') + std::string(100, ']'));
  EXPECT_NE(repo_->Request("bad1").status().message().find("architecture"),
            absl::string_view::npos);
  EXPECT_NE(repo_->Request("bad2").status().message().find("batch"), absl::string_view::npos);
  EXPECT_EQ(repo_->Request("bad3").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(repo_->Request("bad4").status().code(), absl::StatusCode::kInvalidArgument);
  // A model folder that is a symlink out of the repository is not followed.
  std::ofstream(top_ + "/config.json") << R"({"architecture": "tiny_cnn"})";
  ASSERT_EQ(::symlink(top_.c_str(), (root_ + "/escape").c_str()), 0);
  EXPECT_FALSE(repo_->Request("escape").ok());
}

// Issue 28 item 5: a config may register a zoo model in half precision (the pipeline checks the
// name: registry/registration_pipeline.cc).
TEST_F(ModelRepositoryTest, TheConfigNamesTheModelsPrecision) {
  Model("half", R"({"architecture": "tiny_cnn", "dtype": "bfloat16"})");
  Model("bad7", R"({"architecture": "tiny_cnn", "dtype": 16})");
  auto half = repo_->Request("half");
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ(half->dtype, "bfloat16");
  EXPECT_TRUE(repo_->Request("bad7").status().message().find("dtype") != absl::string_view::npos)
      << repo_->Request("bad7").status();
  // Registered by name, the client's precision applies where the config names none, and one
  // that contradicts the config's is refused rather than dropped.
  Model("plain", R"({"architecture": "tiny_cnn"})");
  ModelRequest by_name;
  by_name.name = "plain";
  by_name.dtype = "float16";
  auto resolved = ResolveModelRequest(by_name, &*repo_, false);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->dtype, "float16");
  by_name.name = "half";
  EXPECT_EQ(ResolveModelRequest(by_name, &*repo_, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  by_name.dtype = "bfloat16";
  EXPECT_EQ(ResolveModelRequest(by_name, &*repo_, false)->dtype, "bfloat16");
}

// Issue 29: the operator pins a model resident in its config (or when registering it by name).
TEST_F(ModelRepositoryTest, TheConfigOrTheRegisteringAdminPinsAModelResident) {
  Model("hot", R"({"architecture": "tiny_mlp", "pin_resident": true})");
  Model("bad7", R"({"architecture": "tiny_mlp", "pin_resident": "yes"})");
  auto hot = repo_->Request("hot");
  ASSERT_TRUE(hot.ok()) << hot.status();
  EXPECT_TRUE(hot->pin_resident);
  EXPECT_FALSE(repo_->Request("mlp")->pin_resident) << "not pinned unless asked";
  EXPECT_NE(repo_->Request("bad7").status().message().find("pin_resident"),
            absl::string_view::npos);
  ModelRequest by_name;
  by_name.name = "mlp";
  by_name.plan = "auto";
  by_name.pin_resident = true;
  auto resolved = ResolveModelRequest(by_name, &*repo_, false);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_TRUE(resolved->pin_resident);
}

// Issue 27 item 8: a model's config names who besides admins may train and unload it.
TEST_F(ModelRepositoryTest, TheConfigNamesTheModelsTrainers) {
  Model("team", R"({"architecture": "tiny_mlp", "trainers": ["alice", "bob"]})");
  Model("bad5", R"({"architecture": "tiny_mlp", "trainers": "alice"})");
  Model("bad6", R"({"architecture": "tiny_mlp", "trainers": [""]})");
  auto team = repo_->Request("team");
  ASSERT_TRUE(team.ok()) << team.status();
  EXPECT_EQ(team->trainers, (std::vector<std::string>{"alice", "bob"}));
  EXPECT_TRUE(repo_->Request("mlp")->trainers.empty()) << "none named: admins only";
  EXPECT_NE(repo_->Request("bad5").status().message().find("trainers"), absl::string_view::npos);
  EXPECT_NE(repo_->Request("bad6").status().message().find("trainers"), absl::string_view::npos);
  // The registering admin's trainers join the config's.
  ModelRequest by_name;
  by_name.name = "team";
  by_name.plan = "auto";
  by_name.trainers = {"carol"};
  auto resolved = ResolveModelRequest(by_name, &*repo_, false);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->trainers, (std::vector<std::string>{"alice", "bob", "carol"}));
}

// Trust-boundary issue, item 3: clients name models, not server files, unless allowed.
TEST_F(ModelRepositoryTest, ClientsNameModelsAndServerFilesOnlyWhenAllowed) {
  ModelRequest by_name;
  by_name.name = "cnn";
  auto loaded = ResolveModelRequest(by_name, &*repo_, /*allow_client_paths=*/false);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->zoo_model, "tiny_cnn");
  EXPECT_EQ(ResolveModelRequest(by_name, nullptr, false).status().code(),
            absl::StatusCode::kNotFound);

  ModelRequest with_paths;
  with_paths.name = "x";
  with_paths.zoo_model = "tiny_cnn";
  with_paths.weights_path = "/etc/shadow";
  EXPECT_EQ(ResolveModelRequest(with_paths, &*repo_, false).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(ResolveModelRequest(with_paths, &*repo_, true).ok());
  with_paths.weights_path = "relative/w.safetensors";  // never resolved against pswitchd's cwd
  EXPECT_EQ(ResolveModelRequest(with_paths, &*repo_, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelRequest plan_only = by_name;
  plan_only.zoo_model = "tiny_cnn";
  plan_only.plan = "/tmp/plan.json";
  EXPECT_EQ(ResolveModelRequest(plan_only, &*repo_, false).status().code(),
            absl::StatusCode::kPermissionDenied);
  // An architecture with seeded weights names no file: always allowed.
  ModelRequest seeded = by_name;
  seeded.zoo_model = "tiny_cnn";
  auto plain = ResolveModelRequest(seeded, nullptr, false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->files, nullptr);
}

}  // namespace
}  // namespace pswitch::registry
