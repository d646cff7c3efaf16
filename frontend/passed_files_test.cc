// Files a client passes by fd are hostile: anything but a regular file opened the right way is
// refused without blocking, sizes are bounded, and pswitchd's copy is its own.
#include "frontend/passed_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/files.h"
#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

class PassedFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pswitch-passed-files-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)base::RemoveTree(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  static UniqueFd Open(const std::string& path, int flags) {
    return UniqueFd(::open(path.c_str(), flags | O_CLOEXEC));
  }

  std::string dir_;
};

TEST_F(PassedFilesTest, OnlyARegularFileOpenedForReadingIsAnInput) {
  const std::string path = Write("rows", "0123456789");
  EXPECT_TRUE(CheckPassedInput(Open(path, O_RDONLY).get(), "the dataset", 100).ok());
  EXPECT_TRUE(CheckPassedInput(Open(path, O_RDWR).get(), "the dataset", 100).ok());
  // A directory, a pipe (would block a reader), a socket: refused at once.
  UniqueFd dir = Open(dir_, O_RDONLY | O_DIRECTORY);
  absl::Status refused = CheckPassedInput(dir.get(), "the dataset", 100);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("not a regular file"), absl::string_view::npos) << refused;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  UniqueFd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
  EXPECT_EQ(CheckPassedInput(pipe_read.get(), "the dataset", 100).code(),
            absl::StatusCode::kInvalidArgument);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  UniqueFd one(pair[0]), two(pair[1]);
  EXPECT_EQ(CheckPassedInput(one.get(), "the dataset", 100).code(),
            absl::StatusCode::kInvalidArgument);
  // Over the bound, opened for writing only, or a bare O_PATH handle.
  EXPECT_EQ(CheckPassedInput(Open(path, O_RDONLY).get(), "the dataset", 9).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPassedInput(Open(path, O_WRONLY).get(), "the dataset", 100).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPassedInput(Open(path, O_PATH).get(), "the dataset", 100).code(),
            absl::StatusCode::kInvalidArgument);
  // A memfd is a regular file: sealed or not, it may be passed.
  UniqueFd memfd(::memfd_create("passed-files-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::write(memfd.get(), "abc", 3), 3);
  EXPECT_TRUE(CheckPassedInput(memfd.get(), "the dataset", 100).ok());
}

TEST_F(PassedFilesTest, TheCopyIsPswitchdsOwnWhateverTheClientDoesToItsFile) {
  const std::string path = Write("rows", std::string(10 << 20, 'x') + "end");
  UniqueFd fd = Open(path, O_RDONLY);
  // The client's offset neither steers the copy nor is moved by it.
  ASSERT_EQ(::lseek(fd.get(), 5, SEEK_SET), 5);
  auto sealed = SealPassedFile(fd, "the dataset", 64 << 20);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_EQ(::lseek(fd.get(), 0, SEEK_CUR), 5);
  // Truncated and rewritten after passing: the copy still holds what was passed.
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  Write("rows", "changed");
  auto bytes = base::ReadSealedMemoryFile(*sealed, "copy", 64 << 20);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->size(), (10u << 20) + 3);
  EXPECT_EQ(bytes->substr(bytes->size() - 3), "end");
  // And no one can change the copy.
  EXPECT_LT(::ftruncate(sealed->get(), 0), 0);
  EXPECT_LT(::pwrite(sealed->get(), "y", 1, 0), 0);
}

TEST_F(PassedFilesTest, AFileTruncatedBeforeItIsCopiedYieldsWhatItStillHolds) {
  const std::string path = Write("rows", std::string(1 << 20, 'x'));
  UniqueFd fd = Open(path, O_RDONLY);
  ASSERT_TRUE(CheckPassedInput(fd.get(), "the dataset", 2 << 20).ok());
  // The client truncates its file between the check and the copy.
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  auto sealed = SealPassedFile(fd, "the dataset", 2 << 20);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  auto bytes = base::ReadSealedMemoryFile(*sealed, "copy", 2 << 20);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, std::string(100, 'x'));
  // Oversize files are refused before a byte is copied.
  ASSERT_EQ(::truncate(path.c_str(), 3 << 20), 0);
  EXPECT_EQ(SealPassedFile(fd, "the dataset", 2 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PassedFilesTest, AnOutputIsARegularFileOpenedForWritingInPlace) {
  const std::string path = Write("out", "");
  EXPECT_TRUE(CheckPassedOutput(Open(path, O_WRONLY).get(), "the output").ok());
  EXPECT_TRUE(CheckPassedOutput(Open(path, O_RDWR).get(), "the output").ok());
  EXPECT_EQ(CheckPassedOutput(Open(path, O_RDONLY).get(), "the output").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPassedOutput(Open(path, O_WRONLY | O_APPEND).get(), "the output").code(),
            absl::StatusCode::kInvalidArgument);
  UniqueFd dir = Open(dir_, O_RDONLY | O_DIRECTORY);
  EXPECT_EQ(CheckPassedOutput(dir.get(), "the output").code(), absl::StatusCode::kInvalidArgument);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  UniqueFd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
  EXPECT_EQ(CheckPassedOutput(pipe_write.get(), "the output").code(),
            absl::StatusCode::kInvalidArgument);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  UniqueFd one(pair[0]), two(pair[1]);
  EXPECT_EQ(CheckPassedOutput(one.get(), "the output").code(), absl::StatusCode::kInvalidArgument);
  auto sealed = base::SealedMemoryFile("sealed-output", "x");
  ASSERT_TRUE(sealed.ok());
  EXPECT_EQ(CheckPassedOutput(sealed->get(), "the output").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PassedFilesTest, AFillJobTakesOneDatasetAndOneOutput) {
  const std::string rows = Write("rows", "rows");
  const std::string out = Write("out", "");
  flatbuffers::FlatBufferBuilder b;
  auto roles = b.CreateVector(
      std::vector<proto::FileRole>{proto::FileRole::Dataset, proto::FileRole::Output});
  b.Finish(roles);
  const auto* vec =
      flatbuffers::GetRoot<flatbuffers::Vector<proto::FileRole>>(b.GetBufferPointer());
  auto two = [&] {
    std::vector<UniqueFd> fds;
    fds.push_back(Open(rows, O_RDONLY));
    fds.push_back(Open(out, O_WRONLY));
    return fds;
  };
  auto files = SortFillFiles(vec, two());
  ASSERT_TRUE(files.ok()) << files.status();
  controller::FillRequest request;
  request.dataset_path = "/home/someone/rows.safetensors";
  ASSERT_TRUE(AttachFillFiles(*std::move(files), &request).ok());
  ASSERT_NE(request.dataset_fd, nullptr);
  ASSERT_NE(request.output_fd, nullptr);
  EXPECT_EQ(request.dataset_path, "(passed dataset)");  // the client's path is not kept
  // Fewer fds than roles, a registration's role, a role twice: refused.
  std::vector<UniqueFd> one;
  one.push_back(Open(rows, O_RDONLY));
  EXPECT_EQ(SortFillFiles(vec, std::move(one)).status().code(), absl::StatusCode::kInvalidArgument);
  flatbuffers::FlatBufferBuilder w;
  w.Finish(w.CreateVector(
      std::vector<proto::FileRole>{proto::FileRole::Weights, proto::FileRole::Dataset}));
  EXPECT_EQ(
      SortFillFiles(
          flatbuffers::GetRoot<flatbuffers::Vector<proto::FileRole>>(w.GetBufferPointer()), two())
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  flatbuffers::FlatBufferBuilder twice;
  twice.Finish(twice.CreateVector(
      std::vector<proto::FileRole>{proto::FileRole::Dataset, proto::FileRole::Dataset}));
  EXPECT_EQ(SortFillFiles(flatbuffers::GetRoot<flatbuffers::Vector<proto::FileRole>>(
                              twice.GetBufferPointer()),
                          two())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The output where the dataset should be: a write-only fd is no dataset.
  std::vector<UniqueFd> swapped;
  swapped.push_back(Open(out, O_WRONLY));
  swapped.push_back(Open(rows, O_RDONLY));
  auto sorted = SortFillFiles(vec, std::move(swapped));
  ASSERT_TRUE(sorted.ok());
  controller::FillRequest other;
  EXPECT_EQ(AttachFillFiles(*std::move(sorted), &other).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::frontend
