#include "frontend/auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/auth_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string Write(const std::string& text, mode_t mode = 0600) {
    const std::string path = dir_ + "/tokens";
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST_F(TokenFileTest, LoadsTokensNamesAndRoles) {
  auto table =
      TokenTable::Load(Write("# operators\n"
                             "aaaaaaaaaaaaaaaaaaaa  alice admin\n"
                             "\n"
                             "bbbbbbbbbbbbbbbbbbbb\tbob user\n"));
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  auto alice = table->Find("aaaaaaaaaaaaaaaaaaaa");
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->role, Role::kAdmin);
  EXPECT_EQ(table->Find("bbbbbbbbbbbbbbbbbbbb")->role, Role::kUser);
  EXPECT_FALSE(table->Find("bbbbbbbbbbbbbbbbbbbc").has_value());
  EXPECT_FALSE(table->Find("").has_value());
  EXPECT_FALSE(table->Find("aaaaaaaaaaaaaaaaaaa").has_value());  // a prefix is not the token
}

TEST_F(TokenFileTest, BadFilesAreRefusedWithoutEchoingTokens) {
  EXPECT_EQ(TokenTable::Load(Write("aaaaaaaaaaaaaaaaaaaa alice admin\n", 0644)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (const std::string& text :
       {std::string("short-secret alice admin\n"), std::string("aaaaaaaaaaaaaaaaaaaa alice\n"),
        std::string("aaaaaaaaaaaaaaaaaaaa alice root\n"), std::string("# nothing\n"),
        std::string("aaaaaaaaaaaaaaaaaaaa a admin\naaaaaaaaaaaaaaaaaaaa b user\n")}) {
    auto table = TokenTable::Load(Write(text));
    ASSERT_FALSE(table.ok()) << text;
    EXPECT_EQ(std::string(table.status().message()).find("aaaaaaaaaaaa"), std::string::npos);
    EXPECT_EQ(std::string(table.status().message()).find("short-secret"), std::string::npos);
  }
}

TEST(RolesTest, UsersInferTrainAndSeeTheirOwnTasksOnly) {
  using Body = proto::ClientRequestBody;
  // UnloadModel: the model decides who may (TaskAdmission::CheckUnload).
  for (Body allowed : {Body::SubmitTask, Body::QueryTask, Body::CancelTask, Body::ListModels,
                       Body::ListTasks, Body::UnloadModel}) {
    EXPECT_TRUE(RoleAllows(Role::kUser, allowed));
  }
  for (Body admin_only : {Body::RegisterModel, Body::BubbleBegin, Body::BubbleEnd,
                          Body::RegisterBubbleCycle, Body::FillSubmit, Body::FillCancel,
                          Body::FillQuery, Body::FillStatsQuery, Body::FillEstimateQuery}) {
    EXPECT_FALSE(RoleAllows(Role::kUser, admin_only));
    EXPECT_TRUE(RoleAllows(Role::kAdmin, admin_only));
  }
  TaskOwners owners(/*max_entries=*/2);
  owners.Record(1, "bob");
  owners.Record(2, "carol");
  EXPECT_TRUE(owners.MayAccess({"bob", Role::kUser}, 1));
  EXPECT_FALSE(owners.MayAccess({"bob", Role::kUser}, 2));
  EXPECT_FALSE(owners.MayAccess({"bob", Role::kUser}, 99));
  EXPECT_TRUE(owners.MayAccess({"alice", Role::kAdmin}, 2));
  owners.Record(3, "bob");  // bounded: the oldest record goes
  EXPECT_FALSE(owners.MayAccess({"bob", Role::kUser}, 1));
  EXPECT_TRUE(owners.MayAccess({"bob", Role::kUser}, 3));
}

}  // namespace
}  // namespace pswitch::frontend
