#include "models/inspection_wire.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/fd_message.h"
#include "base/files.h"
#include "gtest/gtest.h"

namespace pswitch::models {
namespace {

struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
    ours = UniqueFd(fds[0]);
    theirs = UniqueFd(fds[1]);
  }
  UniqueFd ours, theirs;
};

size_t OpenFds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

std::string Contents(const UniqueFd& fd) {
  auto bytes = base::ReadSealedMemoryFile(fd, "file", 1 << 20);
  return bytes.ok() ? *bytes : bytes.status().ToString();
}

TEST(InspectionWireTest, ARequestArrivesWithItsFilesInPlace) {
  Pair pair;
  auto archive = base::SealedMemoryFile("archive", "archive bytes");
  auto weights = base::SealedMemoryFile("weights", "weights bytes");
  ASSERT_TRUE(archive.ok() && weights.ok());
  const InspectionRequest sent{.name = "m",
                               .archive_fd = archive->get(),
                               .weights_fd = weights->get(),
                               .weights_name = "w.safetensors",
                               .dtype = "bfloat16",
                               .profile_batch = 8};
  ASSERT_TRUE(SendInspectionRequest(pair.ours.get(), sent).ok());
  auto got = ReceiveInspectionRequest(pair.theirs.get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->request.name, "m");
  EXPECT_TRUE(got->request.zoo.empty());
  EXPECT_EQ(got->request.weights_name, "w.safetensors");
  EXPECT_EQ(got->request.dtype, "bfloat16");
  EXPECT_EQ(got->request.profile_batch, 8u);
  EXPECT_EQ(got->request.archive_fd, got->archive.get());
  EXPECT_EQ(got->request.weights_fd, got->weights.get());
  EXPECT_EQ(Contents(got->archive), "archive bytes");
  EXPECT_EQ(Contents(got->weights), "weights bytes");

  // A zoo model without a checkpoint: no descriptors at all.
  ASSERT_TRUE(SendInspectionRequest(pair.ours.get(), {.name = "z", .zoo = "tiny_cnn"}).ok());
  auto zoo = ReceiveInspectionRequest(pair.theirs.get());
  ASSERT_TRUE(zoo.ok()) << zoo.status();
  EXPECT_EQ(zoo->request.zoo, "tiny_cnn");
  EXPECT_EQ(zoo->request.archive_fd, -1);
  EXPECT_EQ(zoo->request.weights_fd, -1);
}

TEST(InspectionWireTest, MalformedRequestsAreRefusedAndAClosedSocketIsNotAnError) {
  Pair pair;
  auto file = base::SealedMemoryFile("f", "x");
  ASSERT_TRUE(file.ok());
  const int fd = file->get();
  // Says it has no archive, but a descriptor came: refused, and the descriptor closed.
  const std::string no_archive =
      R"({"name":"m","zoo":"tiny_cnn","archive":false,"weights":false,"weights_name":"",)"
      R"("dtype":"","profile_batch":0})";
  ASSERT_TRUE(
      base::SendMessageWithFds(pair.ours.get(), no_archive, std::span<const int>(&fd, 1)).ok());
  EXPECT_EQ(ReceiveInspectionRequest(pair.theirs.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(base::SendMessageWithFds(pair.ours.get(), "{\"name\": 3}", {}).ok());
  EXPECT_EQ(ReceiveInspectionRequest(pair.theirs.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Neither a zoo model nor an archive.
  const std::string neither =
      R"({"name":"m","zoo":"","archive":false,"weights":false,"weights_name":"",)"
      R"("dtype":"","profile_batch":0})";
  ASSERT_TRUE(base::SendMessageWithFds(pair.ours.get(), neither, {}).ok());
  EXPECT_EQ(ReceiveInspectionRequest(pair.theirs.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  pair.ours.Reset();
  EXPECT_EQ(ReceiveInspectionRequest(pair.theirs.get()).status().code(),
            absl::StatusCode::kCancelled);
}

// A child a hostile archive took over may report anything: only well-formed reports of the
// known steps get through, and reading never blocks.
TEST(InspectionWireTest, OnlyWellFormedProgressReportsGetThrough) {
  Pair pair;
  std::vector<std::string> told;
  auto record = [&told](const InspectionProgress& p) {
    told.push_back(DescribeInspectionProgress(p));
  };
  EXPECT_EQ(DrainInspectionProgress(pair.ours.get(), record), 0u) << "nothing waiting: no block";
  SendInspectionProgress(pair.theirs.get(), {InspectionStep::kBuild});
  SendInspectionProgress(pair.theirs.get(), {InspectionStep::kProfile, 2, 4});
  // Malformed: an unknown step, a count on a step without one, a run past the total, no total,
  // a report of another length, and one that passes a descriptor.
  const char unknown[9] = {9, 0, 0, 0, 0, 0, 0, 0, 0};
  const char counted[9] = {1, 1, 0, 0, 0, 1, 0, 0, 0};
  const char past[9] = {4, 5, 0, 0, 0, 4, 0, 0, 0};
  const char no_total[9] = {4, 0, 0, 0, 0, 0, 0, 0, 0};
  for (const char* bad : {unknown, counted, past, no_total}) {
    ASSERT_TRUE(base::SendMessageWithFds(pair.theirs.get(), absl::string_view(bad, 9), {}).ok());
  }
  ASSERT_TRUE(base::SendMessageWithFds(pair.theirs.get(), std::string(20, '\4'), {}).ok());
  auto file = base::SealedMemoryFile("f", "x");
  ASSERT_TRUE(file.ok());
  const int fd = file->get();
  const char good[9] = {2, 0, 0, 0, 0, 0, 0, 0, 0};
  ASSERT_TRUE(base::SendMessageWithFds(pair.theirs.get(), absl::string_view(good, 9),
                                       std::span<const int>(&fd, 1))
                  .ok());
  SendInspectionProgress(pair.theirs.get(), {InspectionStep::kProfile, 4, 4});
  file->Reset();  // only the one in flight is left
  const size_t fds_before = OpenFds();
  EXPECT_EQ(DrainInspectionProgress(pair.ours.get(), record), 9u);
  EXPECT_EQ(OpenFds(), fds_before) << "a descriptor the child sent was received";
  // The descriptor's report is well formed (the descriptor itself is not received).
  EXPECT_EQ(told, (std::vector<std::string>{"building the model", "profiling: run 2 of 4",
                                            "applying the checkpoint", "profiling: run 4 of 4"}));
  // At most max_reports per call.
  for (int i = 0; i < 5; ++i) SendInspectionProgress(pair.theirs.get(), {InspectionStep::kLayers});
  EXPECT_EQ(DrainInspectionProgress(pair.ours.get(), record, 3), 3u);
  EXPECT_EQ(DrainInspectionProgress(pair.ours.get(), record), 2u);
}

}  // namespace
}  // namespace pswitch::models
