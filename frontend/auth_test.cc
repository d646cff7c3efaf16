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

TEST_F(TokenFileTest, AnOptionalUidColumnMapsLocalPeers) {
  auto table = TokenTable::Load(Write("aaaaaaaaaaaaaaaaaaaa alice admin 1000\n"
                                      "bbbbbbbbbbbbbbbbbbbb bob user 1001\n"
                                      "cccccccccccccccccccc carol user\n"));
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_TRUE(table->FindUid(1000).has_value());
  EXPECT_EQ(table->FindUid(1000)->name, "alice");
  EXPECT_EQ(table->FindUid(1000)->role, Role::kAdmin);
  EXPECT_EQ(table->FindUid(1001)->name, "bob");
  EXPECT_EQ(table->FindUid(1001)->role, Role::kUser);
  EXPECT_FALSE(table->FindUid(1002).has_value());
  EXPECT_FALSE(table->FindUid(0).has_value());
  EXPECT_EQ(table->Find("cccccccccccccccccccc")->name, "carol");
}

TEST_F(TokenFileTest, AUidMappedTwiceOrMalformedIsRefused) {
  auto twice = TokenTable::Load(Write("aaaaaaaaaaaaaaaaaaaa alice admin 1000\n"
                                      "bbbbbbbbbbbbbbbbbbbb bob user 1000\n"));
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(std::string(twice.status().message()).find("line 2"), std::string::npos);
  EXPECT_NE(std::string(twice.status().message()).find("1000"), std::string::npos);
  for (const std::string& uid : {"-1", "abc", "4294967295", "99999999999", "+5", "12x"}) {
    auto table = TokenTable::Load(Write("aaaaaaaaaaaaaaaaaaaa alice admin " + uid + "\n"));
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << uid;
  }
  EXPECT_FALSE(TokenTable::Load(Write("aaaaaaaaaaaaaaaaaaaa alice admin 7 extra\n")).ok());
}

TEST(RolesTest, UsersInferTrainAndSeeTheirOwnTasksOnly) {
  using Body = proto::ClientRequestBody;
  // UnloadModel: the model decides who may (TaskAdmission::CheckUnload).
  for (Body allowed : {Body::SubmitTask, Body::QueryTask, Body::CancelTask, Body::ListModels,
                       Body::ListTasks, Body::UnloadModel, Body::RegisterArea,
                       Body::ReleaseArea}) {
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
