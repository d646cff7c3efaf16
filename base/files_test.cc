#include "base/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "gtest/gtest.h"

namespace pswitch::base {
namespace {

TEST(SealedMemoryFileTest, ReadsBackAndRefusesEveryChange) {
  std::string bytes(3 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  auto fd = SealedMemoryFile("test", bytes);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(::pwrite(fd->get(), "x", 1, 0), -1);  // sealed against writes
  EXPECT_NE(::ftruncate(fd->get(), 1), 0);        // and resizing
  // Reads do not move a shared offset: two readers of one open file both see it all.
  for (int reader = 0; reader < 2; ++reader) {
    auto read = ReadSealedMemoryFile(*fd, "test", bytes.size());
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, bytes);
  }
  EXPECT_EQ(ReadSealedMemoryFile(*fd, "test", bytes.size() - 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SealedMemoryFileTest, AnUnsealedFileIsRefused) {
  char tmpl[] = "/tmp/pswitch-unsealed-XXXXXX";
  UniqueFd fd(::mkstemp(tmpl));
  ASSERT_TRUE(fd.valid());
  ::unlink(tmpl);
  ASSERT_EQ(::write(fd.get(), "abc", 3), 3);
  EXPECT_EQ(ReadSealedMemoryFile(fd, "plain", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WriteAllAtTest, WritesEveryByteAtTheOffsetAndLeavesTheFilesOffset) {
  char tmpl[] = "/tmp/pswitch-write-all-XXXXXX";
  UniqueFd fd(::mkstemp(tmpl));
  ASSERT_TRUE(fd.valid());
  ::unlink(tmpl);
  std::string bytes(kFileIoChunkBytes * 2 + 5, '\0');  // more than one chunk
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 13);
  ASSERT_TRUE(WriteAllAt(fd.get(), bytes, 3, "the test file").ok());
  EXPECT_EQ(::lseek(fd.get(), 0, SEEK_CUR), 0);
  std::string back(bytes.size() + 3, 'x');
  ASSERT_EQ(::pread(fd.get(), back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
  EXPECT_EQ(back.substr(0, 3), std::string(3, '\0'));
  EXPECT_EQ(back.substr(3), bytes);
  UniqueFd read_only(::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
  absl::Status refused = WriteAllAt(read_only.get(), "abc", 0, "the read-only file");
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("the read-only file"), absl::string_view::npos) << refused;
}

TEST(CheckLocalFileTest, NetworkAndFuseFileSystemsAreRefusedLocalOnesTaken) {
  // FUSE, NFS, CIFS, Ceph, 9P, SMB2 (the last with the high bit set, as a signed f_type has it).
  for (int64_t remote :
       {int64_t{0x65735546}, int64_t{0x6969}, int64_t{0xFF534D42}, int64_t{0x00C36400},
        int64_t{0x01021997}, static_cast<int64_t>(static_cast<int32_t>(0xFE534D42))}) {
    absl::Status refused = CheckLocalFileSystemType(remote, "dataset d.safetensors");
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << remote;
    EXPECT_NE(refused.message().find("dataset d.safetensors is on a network or FUSE file system"),
              absl::string_view::npos)
        << refused;
    EXPECT_NE(refused.message().find("copy it to local storage"), absl::string_view::npos);
  }
  // ext4, tmpfs, xfs, btrfs, overlayfs.
  for (int64_t local :
       std::vector<int64_t>{0xEF53, 0x01021994, 0x58465342, 0x9123683E, 0x794C7630}) {
    EXPECT_TRUE(CheckLocalFileSystemType(local, "dataset").ok()) << local;
  }
  UniqueFd memfd(::memfd_create("local", MFD_CLOEXEC));
  EXPECT_TRUE(CheckLocalFile(memfd.get(), "dataset").ok());
}

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
