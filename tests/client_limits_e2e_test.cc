// End-to-end: what a hostile TCP client can make a real pswitchd hold (issue 27, items 2, 7 and
// 11): unread replies within the shared byte budget and memory back after they close,
// unauthenticated connections that cannot crowd out authenticated clients, and the
// file-descriptor budget checked at start.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/client_generated.h"
#include "proto/frame_channel.h"
#include "proto/framing.h"
#include "tests/e2e_helpers.h"
#include "tests/test_daemon.h"

namespace pswitch {
namespace {

using e2e::Input;
using e2e::TokenFile;
using ::testing::HasSubstr;

// Resident memory of `pid`, bytes (VmRSS of /proc/PID/status).
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Waits until `pid`'s resident memory has not grown for `quiet`, at most `limit`; returns it.
uint64_t SettledResidentBytes(pid_t pid, absl::Duration quiet, absl::Duration limit) {
  const absl::Time give_up = absl::Now() + limit;
  uint64_t last = ResidentBytes(pid);
  absl::Time changed = absl::Now();
  while (absl::Now() < give_up && absl::Now() - changed < quiet) {
    absl::SleepFor(absl::Milliseconds(50));
    const uint64_t now = ResidentBytes(pid);
    if (now > last + (1u << 20)) changed = absl::Now();
    last = std::max(last, now);
  }
  return ResidentBytes(pid);
}

std::vector<uint8_t> ListTasksRequest(uint64_t id) {
  flatbuffers::FlatBufferBuilder b;
  auto body = proto::CreateListTasks(b, 1000);
  proto::Finish(
      b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::ListTasks, body.Union()));
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

bool WriteAll(int fd, const std::vector<uint8_t>& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

int64_t Mib(uint64_t bytes) { return static_cast<int64_t>(bytes >> 20); }

// Issue 27, item 7: six connections that never read their replies held 1.46 GB (replies were
// bounded per connection only), and 1.2 GB stayed resident after they closed. Replies are now
// charged to the byte budget: twelve such connections asking for ~40 KB task lists hold no more
// than --max-buffered-bytes (those beyond are closed with the reason), and once they close the
// memory is the system's again.
TEST(ClientBudgetE2eTest, UnreadRepliesStayWithinTheBudgetAndTheirMemoryComesBack) {
  e2e::TestDaemon daemon({"--preload=tiny_mlp", "--standby-workers=0",
                          "--max-buffered-bytes=134217728", "--max-client-bytes=67108864",
                          "--arena-bytes=536870912", "--activation-bytes=67108864"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto client = client::Client::Connect(daemon.address());
  ASSERT_TRUE(client.ok()) << client.status();
  // 1,000 finished tasks make every task list about 40 KB, below the mmap threshold.
  for (int round = 0; round < 5; ++round) {
    std::vector<std::future<absl::StatusOr<client::TaskResult>>> pending;
    for (int i = 0; i < 200; ++i)
      pending.push_back((*client)->InferAsync("tiny_mlp", {Input("tiny_mlp", i)}));
    for (auto& p : pending) ASSERT_TRUE(p.get().ok());
  }
  auto listed = (*client)->ListTasks(1000);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1000u);
  const uint64_t before =
      SettledResidentBytes(daemon.pid(), absl::Milliseconds(300), absl::Seconds(5));

  // Each connection asks for 1,100 task lists (~46 MiB of replies, within its share) and reads
  // none: 12 of them held 550 MiB before replies were charged to the budget. Now two fit in it
  // and the rest are cut as their replies come.
  constexpr int kConnections = 12;
  constexpr int kRequests = 1100;
  std::vector<uint8_t> requests;
  for (int i = 0; i < kRequests; ++i) {
    std::vector<uint8_t> frame = *proto::EncodeFrame(ListTasksRequest(i + 1));
    requests.insert(requests.end(), frame.begin(), frame.end());
  }
  std::vector<std::unique_ptr<proto::FrameChannel>> readers_never;
  for (int c = 0; c < kConnections; ++c) {
    auto raw = proto::FrameChannel::ConnectTcp(daemon.address());
    ASSERT_TRUE(raw.ok()) << raw.status();
    (void)WriteAll((*raw)->fd(), requests);  // may be cut short: refused and closed
    readers_never.push_back(std::move(*raw));
  }
  const uint64_t during = SettledResidentBytes(daemon.pid(), absl::Seconds(2), absl::Seconds(60));
  std::printf("pswitchd RSS: %lld MiB before, %lld MiB holding the unread replies\n",
              static_cast<long long>(Mib(before)), static_cast<long long>(Mib(during)));
  // 128 MiB of budget, plus what the allocator and the kernel's socket buffers add.
  EXPECT_LT(during, before + (200ull << 20)) << "RSS grew " << Mib(during - before) << " MiB\n"
                                             << daemon.log();
  EXPECT_THAT(daemon.log(), HasSubstr("does not fit: pswitchd holds 134217728 bytes"));

  readers_never.clear();
  uint64_t after = ResidentBytes(daemon.pid());
  for (int i = 0; i < 100 && after > before + (32ull << 20); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    after = ResidentBytes(daemon.pid());
  }
  std::printf("pswitchd RSS: %lld MiB after they closed\n", static_cast<long long>(Mib(after)));
  EXPECT_LT(after, before + (32ull << 20))
      << "kept " << Mib(after - before) << " MiB after the connections closed";
  EXPECT_THAT(daemon.log(), HasSubstr("event=memory_returned"));
  // Served on, with the budget whole again.
  auto again = (*client)->ListTasks(1000);
  EXPECT_TRUE(again.ok()) << again.status();
}

// A raw connection authenticated with `token` (its Ack read), or null.
std::unique_ptr<proto::FrameChannel> Authenticated(const std::string& address,
                                                   const std::string& token) {
  auto raw = proto::FrameChannel::ConnectTcp(address);
  if (!raw.ok()) return nullptr;
  flatbuffers::FlatBufferBuilder b;
  auto body = proto::CreateAuthenticateDirect(b, token.c_str());
  proto::Finish(
      b, proto::CreateClientRequest(b, 1, proto::ClientRequestBody::Authenticate, body.Union()));
  if (!(*raw)->Send(b).ok()) return nullptr;
  auto ack = (*raw)->Receive(absl::Seconds(10));
  if (!ack.ok()) return nullptr;
  auto reply = proto::VerifyPayload<proto::ControllerReply>(ack->payload, "reply");
  if (!reply.ok() || (*reply)->body_type() != proto::ControllerReplyBody::Ack) return nullptr;
  return std::move(*raw);
}

// With tokens a connection's bytes are its principal's once it authenticates: two connections of
// one token share its --max-client-bytes (the second to overflow it is cut), while another
// token's connection, holding as much, is served on.
TEST(ClientBudgetE2eTest, AClientsConnectionsShareItsTokensShare) {
  TokenFile tokens(
      "admin-token-alice-0123456789 alice admin\n"
      "admin-token-dave-0123456789 dave admin\n");
  e2e::TestDaemon daemon({"--preload=tiny_mlp", "--standby-workers=0", tokens.flag(),
                          "--max-buffered-bytes=268435456", "--max-client-bytes=67108864",
                          "--arena-bytes=536870912", "--activation-bytes=67108864"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  client::ClientOptions options;
  options.token = "admin-token-alice-0123456789";
  auto client = client::Client::Connect(daemon.address(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  for (int round = 0; round < 5; ++round) {
    std::vector<std::future<absl::StatusOr<client::TaskResult>>> pending;
    for (int i = 0; i < 200; ++i) {
      pending.push_back((*client)->InferAsync("tiny_mlp", {Input("tiny_mlp", i)}));
    }
    for (auto& p : pending) ASSERT_TRUE(p.get().ok());
  }
  // ~46 MiB of task lists each: two fit one share only.
  std::vector<uint8_t> requests;
  for (int i = 0; i < 1100; ++i) {
    std::vector<uint8_t> frame = *proto::EncodeFrame(ListTasksRequest(i + 2));
    requests.insert(requests.end(), frame.begin(), frame.end());
  }
  auto alice_1 = Authenticated(daemon.address(), "admin-token-alice-0123456789");
  auto dave = Authenticated(daemon.address(), "admin-token-dave-0123456789");
  ASSERT_TRUE(alice_1 != nullptr && dave != nullptr);
  ASSERT_TRUE(WriteAll(alice_1->fd(), requests));
  ASSERT_TRUE(WriteAll(dave->fd(), requests));
  (void)SettledResidentBytes(daemon.pid(), absl::Seconds(1), absl::Seconds(30));
  EXPECT_THAT(daemon.log(), ::testing::Not(HasSubstr("does not fit")));
  auto alice_2 = Authenticated(daemon.address(), "admin-token-alice-0123456789");
  ASSERT_TRUE(alice_2 != nullptr);
  (void)WriteAll(alice_2->fd(), requests);  // may be cut short: closed
  for (int i = 0; i < 300 && daemon.log().find("does not fit") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  const std::string log = daemon.log();
  EXPECT_THAT(log, HasSubstr("does not fit: one client may hold 67108864 bytes"));
  size_t cut = 0;
  for (size_t p = log.find("does not fit"); p != std::string::npos;
       p = log.find("does not fit", p + 1)) {
    ++cut;
  }
  EXPECT_EQ(cut, 1u) << log;
  // dave's replies are all there to read.
  for (int i = 0; i < 1100; ++i) {
    auto reply = dave->Receive(absl::Seconds(10));
    ASSERT_TRUE(reply.ok()) << i << ": " << reply.status();
  }
}

// A TCP connection to `address` that has sent one byte of a frame's length prefix (so pswitchd,
// which defers accepting until a connection's first bytes, takes it into an unauthenticated
// slot and holds it there until the authentication timeout or an eviction), or -1.
int ConnectRaw(const std::string& address) {
  auto channel = proto::FrameChannel::ConnectTcp(address);
  if (!channel.ok()) return -1;
  const int fd = ::dup((*channel)->fd());
  const char first = 0;
  if (fd >= 0 && ::send(fd, &first, 1, MSG_NOSIGNAL) != 1) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Issue 27, item 11: 256 unauthenticated connections, each reopened after its authentication
// timeout, made 8 of 39 legitimate calls fail (they filled --max-connections). Connections
// still to authenticate now have slots of their own, the oldest giving way to a newcomer: a
// flood of them (held open and reopened as fast as they are closed) fails no authenticated call.
TEST(ClientBudgetE2eTest, UnauthenticatedConnectionsCannotCrowdOutAuthenticatedCalls) {
  TokenFile tokens("user-token-bob-0123456789 bob user\n");
  e2e::TestDaemon daemon(
      {"--preload=tiny_mlp", "--standby-workers=0", tokens.flag(), "--auth-timeout-ms=1000"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  constexpr int kFlood = 256;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> reopened{0};
  std::vector<int> fds(kFlood, -1);
  for (int& fd : fds) {
    fd = ConnectRaw(daemon.address());
    ASSERT_GE(fd, 0);
  }
  std::thread flood([&] {
    std::vector<pollfd> polled(kFlood);
    while (!stop.load()) {
      for (int i = 0; i < kFlood; ++i) polled[i] = pollfd{fds[i], POLLIN, 0};
      if (::poll(polled.data(), polled.size(), 20) <= 0) continue;
      for (int i = 0; i < kFlood; ++i) {
        if (polled[i].revents == 0) continue;
        char byte;
        if (::recv(fds[i], &byte, 1, MSG_DONTWAIT) > 0) continue;  // an error reply first
        ::close(fds[i]);
        fds[i] = ConnectRaw(daemon.address());  // closed by pswitchd: straight back
        ++reopened;
        if (fds[i] < 0) fds[i] = ::open("/dev/null", O_RDONLY);  // keeps the slot pollable
      }
    }
  });
  absl::SleepFor(absl::Milliseconds(1500));  // past the first authentication timeout
  int failed = 0;
  std::string failures;
  for (int call = 0; call < 40; ++call) {
    client::ClientOptions options;
    options.token = "user-token-bob-0123456789";
    auto bob = client::Client::Connect(daemon.address(), options);
    absl::Status status = bob.status();
    if (status.ok()) status = (*bob)->Infer("tiny_mlp", {Input("tiny_mlp", call)}).status();
    if (!status.ok()) {
      ++failed;
      absl::StrAppend(&failures, call, ": ", status.ToString(), "\n");
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  stop = true;
  flood.join();
  for (int fd : fds) ::close(fd);
  std::printf("%d of 40 authenticated calls failed; %lld flood connections reopened\n", failed,
              static_cast<long long>(reopened.load()));
  EXPECT_EQ(failed, 0) << failures;
  EXPECT_GT(reopened.load(), kFlood);  // the flood went on throughout
}

// Runs `command` with sh, its output (stdout and stderr) into *out; returns its exit status.
int RunShell(const std::string& command, std::string* out) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out->append(buffer, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Issue 27, item 2: 1,500 idle HTTP connections under the soft limit of 1,024 starved the TCP
// port and a worker's respawn. pswitchd raises its soft limit to the hard limit and refuses to
// start, with the reason, when that cannot cover its connection caps and workers.
TEST(FdBudgetE2eTest, PswitchdRefusesToStartWhenItsFdLimitCannotCoverItsCaps) {
  if (std::string where; RunShell("command -v prlimit", &where) != 0) GTEST_SKIP() << "no prlimit";
  char dir_template[] = "/tmp/pswitch-fd-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string daemon = absl::StrCat(
      PSWITCHD_PATH, " --backend=host --preload= --exit-after-demo --listen=127.0.0.1:0",
      " --http-listen=127.0.0.1:0 --arena-bytes=134217728 --activation-bytes=16777216",
      " --standby-workers=1 --socket=", dir, "/m.sock");
  std::string refused;
  EXPECT_EQ(RunShell("prlimit --nofile=64:64 " + daemon, &refused), 2) << refused;
  EXPECT_THAT(refused, HasSubstr("event=start_failed"));
  EXPECT_THAT(refused, HasSubstr("RLIMIT_NOFILE allows 64"));
  // A soft limit of 64 under a hard one of 1,024 is raised; small caps fit either way.
  std::string started;
  EXPECT_EQ(RunShell("prlimit --nofile=64:1024 " + daemon +
                         " --max-connections=64 --http-max-connections=64",
                     &started),
            0)
      << started;
  EXPECT_THAT(started, HasSubstr("event=fd_limit soft=1024 hard=1024"));
  EXPECT_THAT(started, ::testing::Not(HasSubstr("start_failed")));
  (void)base::RemoveTree(dir);
}

}  // namespace
}  // namespace pswitch
