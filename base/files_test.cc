#include "base/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace pswitch::base {
namespace {

TEST(RemoveTreeTest, RemovesEverythingUnderThePathAndFollowsNoLink) {
  char tmpl[] = "/tmp/pswitch-remove-tree-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::filesystem::path root = tmpl;
  const std::filesystem::path tree = root / "tree", outside = root / "outside";
  std::filesystem::create_directories(tree / "a" / "b");
  std::filesystem::create_directories(outside);
  std::ofstream(tree / "a" / "b" / "f") << "x";
  std::ofstream(tree / "g") << "y";
  std::ofstream(outside / "keep") << "z";
  ASSERT_EQ(::symlink(outside.c_str(), (tree / "link").c_str()), 0);
  ASSERT_EQ(::symlink((outside / "keep").c_str(), (tree / "a" / "file_link").c_str()), 0);

  ASSERT_TRUE(RemoveTree(tree.string()).ok());
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(tree)));
  EXPECT_TRUE(std::filesystem::exists(outside / "keep")) << "a link's target was removed";
  EXPECT_TRUE(RemoveTree(tree.string()).ok()) << "an absent path is not an error";
  ASSERT_TRUE(RemoveTree(root.string()).ok());
  EXPECT_FALSE(std::filesystem::exists(root));
}

}  // namespace
}  // namespace pswitch::base
