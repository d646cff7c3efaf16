#include "memdaemon/worker_server.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/private_dir.h"
#include "gtest/gtest.h"
#include "memdaemon/arena_client.h"
#include "memdaemon/arena_layout.h"
#include "memdaemon/lease_table.h"
#include "memdaemon/memdaemon.h"
#include "proto/framing.h"
#include "proto/memdaemon_generated.h"

namespace pswitch::memdaemon {
namespace {

// Connects to `path` and reports whether the server closed the connection within `wait_ms`
// (exit status 0: closed, 1: kept open, 2: could not connect). Async-signal-safe only: it runs
// in forked children of this multi-threaded test.
int ConnectAndWatch(const char* path, int wait_ms) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path, sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 2;
  pollfd p{fd, POLLIN, 0};
  char byte;
  return ::poll(&p, 1, wait_ms) == 1 && ::recv(fd, &byte, 1, 0) == 0 ? 0 : 1;
}

int ExitCode(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class WorkerServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/worker_server_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

// Trust-boundary issue, item 8: under umask 000 another user received the writable arena fd.
TEST_F(WorkerServerTest, TheSocketIsPrivateWhateverTheUmaskAndOnlyPswitchdsChildrenGetIn) {
  MemDaemonOptions options;
  options.arena_bytes = 16 << 20;
  options.socket_path = dir_ + "/m.sock";
  const mode_t old_umask = ::umask(0);
  auto daemon = MemDaemon::Create(options);
  ::umask(old_umask);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  struct stat st;
  ASSERT_EQ(::stat(options.socket_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  const char* path = options.socket_path.c_str();
  // A child of this process (as pswitchd's workers are of pswitchd) is served.
  pid_t child = ::fork();
  if (child == 0) ::_exit(ConnectAndWatch(path, 300));
  EXPECT_EQ(ExitCode(child), 1) << "a direct child is kept";
  // Any other process of this user (here a grandchild) is refused at once.
  pid_t middle = ::fork();
  if (middle == 0) {
    pid_t grandchild = ::fork();
    if (grandchild == 0) ::_exit(ConnectAndWatch(path, 5000));
    int status = 0;
    ::waitpid(grandchild, &status, 0);
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 3);
  }
  EXPECT_EQ(ExitCode(middle), 0) << "a process pswitchd did not start is refused";
}

// A length-prefixed AttachArena frame carrying `secret`, built before any fork.
std::vector<uint8_t> AttachFrame(const std::string& secret) {
  flatbuffers::FlatBufferBuilder b;
  auto bytes = b.CreateVector(reinterpret_cast<const uint8_t*>(secret.data()), secret.size());
  auto attach = proto::CreateAttachArena(b, /*worker_id=*/7, /*pid=*/0, bytes);
  proto::Finish(b,
                proto::CreateMemRequest(b, 1, proto::MemRequestBody::AttachArena, attach.Union()));
  const uint32_t size = b.GetSize();
  std::vector<uint8_t> frame(4 + size);
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<uint8_t>(size >> (8 * i));
  std::memcpy(frame.data() + 4, b.GetBufferPointer(), size);
  return frame;
}

// Sends `frame` to `path` and reports whether the reply carried the arena's fd (exit status 0:
// granted, 1: refused, 2: could not talk). Async-signal-safe only (forked children).
int AttachAndWatch(const char* path, const std::vector<uint8_t>& frame) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path, sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 2;
  if (::write(fd, frame.data(), frame.size()) != static_cast<ssize_t>(frame.size())) return 2;
  char data[4096];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  iovec iov{data, sizeof(data)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 5000) != 1 || ::recvmsg(fd, &msg, 0) <= 0) return 2;
  const cmsghdr* c = CMSG_FIRSTHDR(&msg);
  return c != nullptr && c->cmsg_type == SCM_RIGHTS ? 0 : 1;
}

// Issue 27: the archive-checking child (pswitch-worker --inspect-name, a child of pswitchd that
// runs a hostile archive) passed the peer check and could map the whole arena. Now a child of
// pswitchd attaches only with the one-time secret pswitchd issued for a worker it spawned.
TEST_F(WorkerServerTest, OnlyAChildHoldingAnUnusedAttachSecretGetsTheArena) {
  MemDaemonOptions options;
  options.arena_bytes = 16 << 20;
  options.socket_path = dir_ + "/m.sock";
  auto daemon = MemDaemon::Create(options);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto secret = (*daemon)->IssueAttachSecret();
  ASSERT_TRUE(secret.ok()) << secret.status();
  ASSERT_EQ(secret->size(), 32u);
  auto other = (*daemon)->IssueAttachSecret();
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*secret, *other);
  std::string guessed = *secret;
  guessed[0] ^= 1;
  const std::vector<uint8_t> without = AttachFrame(""), wrong = AttachFrame(guessed),
                             with = AttachFrame(*secret);
  const char* path = options.socket_path.c_str();
  auto attach = [&](const std::vector<uint8_t>& frame) {
    pid_t child = ::fork();
    if (child == 0) ::_exit(AttachAndWatch(path, frame));
    return ExitCode(child);
  };
  EXPECT_EQ(attach(without), 1) << "a child without a secret (an inspect child) is refused";
  EXPECT_EQ(attach(wrong), 1) << "a wrong secret is refused";
  EXPECT_EQ(attach(with), 0) << "a spawned worker's secret attaches";
  EXPECT_EQ(attach(with), 1) << "a secret works once";
  // This process (pswitchd itself: tests, the link probe) needs none.
  EXPECT_EQ(AttachAndWatch(path, without), 0);
}

TEST_F(WorkerServerTest, RuntimeDirectoriesMustBePrivate) {
  EXPECT_TRUE(base::EnsurePrivateDir(dir_ + "/fresh").ok());
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/fresh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::mkdir((dir_ + "/open").c_str(), 0700), 0);
  ASSERT_EQ(::chmod((dir_ + "/open").c_str(), 0755), 0);
  EXPECT_EQ(base::EnsurePrivateDir(dir_ + "/open").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(::symlink((dir_ + "/fresh").c_str(), (dir_ + "/link").c_str()), 0);
  EXPECT_EQ(base::EnsurePrivateDir(dir_ + "/link").code(), absl::StatusCode::kFailedPrecondition);
}

// A host arena that also hands out chunk fds, as a CUDA VMM arena does (1,000 chunks).
class ChunkedArena : public gpu::Arena {
 public:
  explicit ChunkedArena(gpu::Arena* inner) : inner_(inner) {}
  uint64_t size_bytes() const override { return inner_->size_bytes(); }
  std::byte* base() const override { return inner_->base(); }
  bool owner() const override { return true; }
  absl::StatusOr<gpu::ArenaHandle> Export() const override {
    absl::StatusOr<gpu::ArenaHandle> handle = inner_->Export();
    if (handle.ok()) handle->chunk_bytes = 2 << 20;
    return handle;
  }
  absl::StatusOr<std::vector<UniqueFd>> ExportChunks(uint64_t first,
                                                     uint64_t count) const override {
    if (first + count > 1000) return absl::OutOfRangeError("past the last chunk");
    std::vector<UniqueFd> fds;
    for (uint64_t i = 0; i < count; ++i) fds.emplace_back(::memfd_create("chunk", MFD_CLOEXEC));
    return fds;
  }
  absl::Status Fill(uint64_t offset, uint64_t bytes, uint8_t value) override {
    return inner_->Fill(offset, bytes, value);
  }
  absl::Status CopyToHost(uint64_t offset, std::span<std::byte> out) override {
    return inner_->CopyToHost(offset, out);
  }
  absl::Status CopyFromHost(uint64_t offset, std::span<const std::byte> in) override {
    return inner_->CopyFromHost(offset, in);
  }
  absl::StatusOr<std::unique_ptr<gpu::FlagArray>> Flags(uint64_t offset, uint32_t count) override {
    return inner_->Flags(offset, count);
  }

 private:
  gpu::Arena* const inner_;
};

// A VMM arena's chunks reach a worker as it asks for them, one fd per frame and at most
// kMaxChunksPerRequest per request; the client gathers them in order, and a refused request
// leaves the connection usable.
TEST_F(WorkerServerTest, AWorkerFetchesAChunkedArenasFdsInBatchesAndTheChannelStaysInStep) {
  MemDaemonOptions options;
  options.arena_bytes = 16 << 20;
  auto daemon = MemDaemon::Create(options);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ChunkedArena arena(&(*daemon)->arena());
  LeaseTable leases(&arena, kControlBytes, arena.size_bytes(), 64 << 10);
  const std::string path = dir_ + "/vmm.sock";
  auto server = WorkerServer::Start(path, &arena, &leases);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = ArenaClient::Attach(path, &(*daemon)->device(), 7);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->lease_alignment_bytes(), 64u << 10);
  auto fds = (*client)->FetchChunks(3, kMaxChunksPerRequest);
  ASSERT_TRUE(fds.ok()) << fds.status();
  ASSERT_EQ(fds->size(), kMaxChunksPerRequest);
  for (const UniqueFd& fd : *fds) EXPECT_TRUE(fd.valid());
  EXPECT_EQ((*client)->FetchChunks(0, kMaxChunksPerRequest + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->FetchChunks(990, 20).status().code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE((*client)->FetchChunks(990, 10).ok()) << "a refusal leaves the channel in step";
  auto lease = (*client)->RequestLease("worker-7", 1000);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->bytes, 64u << 10) << "whole units of the lease alignment";
  EXPECT_EQ(lease->offset % (64 << 10), 0u);
}

}  // namespace
}  // namespace pswitch::memdaemon
