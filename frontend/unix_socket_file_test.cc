#include "frontend/unix_socket_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "base/files.h"

namespace pswitch::frontend {
namespace {

using ::testing::HasSubstr;

class UnixSocketFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/unix-socket-file-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/pswitchd.sock";
  }
  void TearDown() override {
    ::umask(old_umask_);
    (void)base::RemoveTree(dir_);
  }

  // Whether a client can connect to `path` now.
  static bool Connects(const std::string& path) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    return ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  }
  // The directory's entries (nothing left behind beside the socket).
  size_t Entries() const {
    size_t n = 0;
    DIR* d = ::opendir(dir_.c_str());
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
    }
    ::closedir(d);
    return n;
  }

  std::string dir_;
  std::string path_;
  const mode_t old_umask_ = ::umask(022);
};

// Whatever the umask (0: a plain bind would make it 0777, anyone could connect in the moment
// before a chmod), the socket is at its mode from the moment it exists, and accepts at once.
TEST_F(UnixSocketFileTest, TheSocketHasItsModeWhateverTheUmaskAndServes) {
  for (mode_t mask : {0000, 0077}) {
    ::umask(mask);
    auto file = CreateUnixSocketFile(path_, 0660);
    ASSERT_TRUE(file.ok()) << file.status();
    struct stat st;
    ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0660u) << "umask " << mask;
    EXPECT_EQ(st.st_ino, file->ino);
    EXPECT_TRUE(Connects(path_));
    EXPECT_EQ(Entries(), 1u) << "no private staging directory is left behind";
    RemoveUnixSocketFile(path_, *file);
    EXPECT_NE(::access(path_.c_str(), F_OK), 0);
  }
}

// A stale socket of ours (nobody serves it) is replaced; a live one, a file and a symlink are not.
TEST_F(UnixSocketFileTest, OnlyAStaleSocketOfOursIsReplaced) {
  auto live = CreateUnixSocketFile(path_, 0660);
  ASSERT_TRUE(live.ok()) << live.status();
  auto again = CreateUnixSocketFile(path_, 0660);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("served by another process"));
  EXPECT_TRUE(Connects(path_)) << "the live one is untouched";
  live->fd.Reset();  // its server is gone: stale
  auto replaced = CreateUnixSocketFile(path_, 0660);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_TRUE(Connects(path_));
  RemoveUnixSocketFile(path_, *replaced);

  const std::string target = dir_ + "/target";
  UniqueFd made(::open(target.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  ASSERT_TRUE(made.valid());
  ASSERT_EQ(::symlink(target.c_str(), path_.c_str()), 0);
  auto over_link = CreateUnixSocketFile(path_, 0660);
  EXPECT_EQ(over_link.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(over_link.status().message(), HasSubstr("not a socket"));
  struct stat st;
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "the link's target is never chmod-ed";
  EXPECT_EQ(Entries(), 2u);
}

// Another user's socket at the path is never replaced, served or not (needs root to make one).
TEST_F(UnixSocketFileTest, AnotherUsersSocketIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "making another user's socket needs root";
  auto theirs = CreateUnixSocketFile(path_, 0660);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  theirs->fd.Reset();  // stale: the old code replaced it
  ASSERT_EQ(::lchown(path_.c_str(), 65534, 65534), 0);
  auto refused = CreateUnixSocketFile(path_, 0660);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("a socket of uid 65534, not ours"));
  struct stat st;
  ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_ino, theirs->ino);
}

// A directory others may write (and not sticky) or another user's is refused: they could put
// their own socket in its place.
TEST_F(UnixSocketFileTest, ADirectoryOthersCanWriteIsRefused) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  auto open_dir = CreateUnixSocketFile(path_, 0660);
  EXPECT_EQ(open_dir.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(open_dir.status().message(), HasSubstr("may be written by other users"));
  EXPECT_EQ(Entries(), 0u);
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);  // sticky, like /tmp: others cannot replace ours
  auto sticky = CreateUnixSocketFile(path_, 0660);
  ASSERT_TRUE(sticky.ok()) << sticky.status();
  RemoveUnixSocketFile(path_, *sticky);
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(dir_.c_str(), 65534, 65534), 0);
    auto theirs = CreateUnixSocketFile(path_, 0660);
    EXPECT_EQ(theirs.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(theirs.status().message(), HasSubstr("belongs to uid 65534"));
    ASSERT_EQ(::chown(dir_.c_str(), 0, 0), 0);
  }
}

// At exit only the socket we made is removed, not one put in its place since.
TEST_F(UnixSocketFileTest, RemoveLeavesAFileThatIsNotOurs) {
  auto file = CreateUnixSocketFile(path_, 0660);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  UniqueFd other(::open(path_.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  ASSERT_TRUE(other.valid());
  RemoveUnixSocketFile(path_, *file);
  EXPECT_EQ(::access(path_.c_str(), F_OK), 0);
}

TEST_F(UnixSocketFileTest, APathTooLongForASocketIsRefused) {
  auto refused = CreateUnixSocketFile(dir_ + "/" + std::string(120, 's'), 0660);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::frontend
