#include "base/confined_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "base/files.h"
#include "gtest/gtest.h"

namespace pswitch::base {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A data root with a file in it and a secret beside it, as on a shared node.
class ConfinedDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/confined_dir_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    top_ = tmpl;
    root_ = top_ + "/root";
    ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((root_ + "/jobs").c_str(), 0755), 0);
    std::ofstream(root_ + "/jobs/data.bin") << "dataset";
    std::ofstream(top_ + "/secret") << "root:$6$hash";
    ::chmod((top_ + "/secret").c_str(), 0600);
    auto dir = ConfinedDir::Open(root_);
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(std::move(*dir));
  }
  void TearDown() override { std::system(("rm -rf " + top_).c_str()); }

  std::string top_, root_;
  std::optional<ConfinedDir> dir_;
};

TEST_F(ConfinedDirTest, ReadsFilesUnderTheRoot) {
  auto bytes = dir_->Read("jobs/data.bin", "dataset", 1 << 20);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, "dataset");
  EXPECT_EQ(dir_->Read("jobs/data.bin", "dataset", 3).status().code(),
            absl::StatusCode::kInvalidArgument);  // over the size limit
  EXPECT_EQ(dir_->Read("jobs/none.bin", "dataset", 1 << 20).status().code(),
            absl::StatusCode::kNotFound);
}

// A whole read is held to a deadline, checked between chunks: a file that arrives slowly (a
// network or FUSE file system) cannot hold the reading thread for ever.
TEST_F(ConfinedDirTest, AReadPastItsDeadlineStopsBetweenChunks) {
  std::ofstream(root_ + "/big.bin") << std::string(2 * kFileIoChunkBytes + 1, 'x');
  auto fd = dir_->OpenForRead("big.bin", "dataset", 1ull << 30);
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto late = ReadAll(*fd, "dataset", 1ull << 30, absl::ZeroDuration());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  auto whole = dir_->Read("big.bin", "dataset", 1ull << 30);  // the default deadline
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->size(), 2 * kFileIoChunkBytes + 1);
}

// Trust-boundary issue, item 3: no client-named path reaches outside the root, and the answer
// for a path outside is the same whether or not the file there exists.
TEST_F(ConfinedDirTest, NothingOutsideTheRootCanBeNamed) {
  for (const std::string& name : {top_ + "/secret", std::string("../secret"),
                                  std::string("jobs/../../secret"), std::string("../nonexistent"),
                                  std::string("./jobs/data.bin"), std::string("jobs//data.bin"),
                                  std::string(""), std::string("a\0b", 3)}) {
    auto read = dir_->Read(name, "dataset", 1 << 20);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(std::string(read.status().message()).find("root:"), std::string::npos);
  }
  // Symlinks are never followed, wherever they point and whether or not their target exists.
  ASSERT_EQ(::symlink((top_ + "/secret").c_str(), (root_ + "/link").c_str()), 0);
  ASSERT_EQ(::symlink((top_ + "/nothing").c_str(), (root_ + "/dangling").c_str()), 0);
  ASSERT_EQ(::symlink(top_.c_str(), (root_ + "/up").c_str()), 0);
  EXPECT_EQ(dir_->Read("link", "dataset", 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dir_->Read("dangling", "dataset", 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dir_->Read("up/secret", "dataset", 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Item 4: a FIFO is refused at once instead of blocking on its open.
TEST_F(ConfinedDirTest, AFifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo((root_ + "/jobs/fifo").c_str(), 0644), 0);
  EXPECT_EQ(dir_->Read("jobs/fifo", "dataset", 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ConfinedDirTest, OutputsAreCreatedNewAndPrivate) {
  ASSERT_TRUE(dir_->CheckCreatable("jobs/out.bin", "output").ok());
  ASSERT_TRUE(dir_->Create("jobs/out.bin", "result", "output").ok());
  EXPECT_EQ(Slurp(root_ + "/jobs/out.bin"), "result");
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/jobs/out.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Nothing is left beside it.
  EXPECT_EQ(std::system(("test $(ls -A " + root_ + "/jobs | wc -l) -eq 2").c_str()), 0);
}

// Item 2: an output never replaces a file, whoever owns it, and never writes through a symlink.
TEST_F(ConfinedDirTest, AnOutputNeverReplacesOrWritesThroughAnything) {
  std::ofstream(root_ + "/jobs/taken") << "precious";
  ::chmod((root_ + "/jobs/taken").c_str(), 0600);
  EXPECT_EQ(dir_->CheckCreatable("jobs/taken", "output").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(dir_->Create("jobs/taken", "overwritten", "output").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Slurp(root_ + "/jobs/taken"), "precious");
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/jobs/taken").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  ASSERT_EQ(::symlink((top_ + "/secret").c_str(), (root_ + "/jobs/evil").c_str()), 0);
  EXPECT_EQ(dir_->Create("jobs/evil", "overwritten", "output").code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_EQ(::symlink(top_.c_str(), (root_ + "/up").c_str()), 0);
  EXPECT_EQ(dir_->Create("up/secret", "overwritten", "output").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Slurp(top_ + "/secret"), "root:$6$hash");
  EXPECT_EQ(std::system(("test $(ls -A " + root_ + "/jobs | wc -l) -eq 3").c_str()), 0);
}

}  // namespace
}  // namespace pswitch::base
