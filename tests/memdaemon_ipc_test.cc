// The memdaemon and a worker in two real processes: the worker attaches over the Unix socket,
// imports the arena (host: memfd via SCM_RIGHTS; CUDA: IPC handle plus the flag window's memfd),
// computes the weight layout on its own and checks each group's bytes as soon as the group's
// ready flag shows the switch's epoch, while the memdaemon is still copying later groups. Every
// test runs on each backend; the CUDA variants skip, with the reason, where no GPU is usable.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "base/clock.h"
#include "base/files.h"
#include "grouping/baselines.h"
#include "gtest/gtest.h"
#include "memdaemon/arena_client.h"
#include "memdaemon/memdaemon.h"
#include "memdaemon/synthetic_model.h"
#include "proto/frame_channel.h"
#include "proto/memdaemon_generated.h"
#include "proto/wire_status.h"
#include "tests/gpu_probe.h"

namespace pswitch::memdaemon {
namespace {

constexpr uint32_t kLayers = 48;
constexpr uint64_t kModelBytes = 24 << 20;
constexpr uint32_t kGroupSize = 6;
constexpr uint32_t kGroups = kLayers / kGroupSize;

// Test-only messages between the parent (acting as controller) and the worker child.
struct SwitchOrder {
  uint32_t epoch;
  uint32_t seed;  // which synthetic model to expect
  uint64_t weights_offset;
  uint32_t expect_stale_first;  // 1: first check the flags do not pass yet
};
struct GroupReport {
  int32_t ok;  // 1 = bytes matched
  int64_t seen_ns;
  int64_t verified_ns;
};

template <typename T>
absl::Status SendPod(proto::FrameChannel& c, const T& v) {
  return c.Send(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&v), sizeof(T)));
}
template <typename T>
bool ReceivePod(proto::FrameChannel& c, T* v) {
  auto frame = c.Receive(absl::Seconds(30));
  if (!frame.ok() || frame->payload.size() != sizeof(T)) return false;
  std::memcpy(v, frame->payload.data(), sizeof(T));
  return true;
}

gpu::DeviceOptions OptionsFor(gpu::Backend backend) {
  gpu::DeviceOptions options;
  options.backend = backend;
  return options;
}

// The worker side. Returns an exit code; never returns into gtest.
// The go-ahead: the one-time attach secret the daemon issued for this worker (as pswitchd's
// spawn passes it).
struct Go {
  char secret[32];
};

int WorkerMain(proto::FrameChannel& control, const std::string& socket_path, gpu::Backend backend,
               const std::string& secret) {
  auto device = gpu::Device::Open(OptionsFor(backend));
  if (!device.ok()) return 20;
  auto client = ArenaClient::Attach(socket_path, device->get(), /*worker_id=*/1, secret);
  if (!client.ok()) return 21;
  if (!SendPod(control, uint32_t{1}).ok()) return 22;  // attached
  SwitchOrder order;
  while (ReceivePod(control, &order)) {
    // Recomputed here from the model description alone: only the region offset crossed.
    auto model = MakeSyntheticModel("m", kLayers, kModelBytes, order.seed);
    auto layout =
        ComputeWeightLayout(LayerSpecsOf(model->model), (*client)->weight_alignment_bytes());
    if (!layout.ok()) return 23;
    gpu::FlagArray& flags = (*client)->ready_flags();
    if (order.expect_stale_first == 1) {
      // The flags still hold the previous switch's epoch: they must not release this one.
      for (uint32_t g = 0; g < kGroups; ++g) {
        if (flags.WaitReady(g, order.epoch, absl::Milliseconds(2)).code() !=
            absl::StatusCode::kDeadlineExceeded) {
          return 24;
        }
      }
      if (!SendPod(control, uint32_t{2}).ok()) return 25;  // stale check passed
    }
    std::vector<GroupReport> reports(kGroups);
    for (uint32_t g = 0; g < kGroups; ++g) {
      if (!flags.WaitReady(g, order.epoch, absl::Seconds(30)).ok()) return 26;
      reports[g].seen_ns = base::MonotonicNowNs();
      bool ok = true;
      for (uint32_t l = g * kGroupSize; l < (g + 1) * kGroupSize; ++l) {
        for (size_t t = 0; t < model->model.layers[l].tensors.size(); ++t) {
          auto expected = model->model.layers[l].tensors[t].bytes;
          std::vector<std::byte> seen(expected.size());
          if (!(*client)
                   ->arena()
                   .CopyToHost(order.weights_offset + layout->placements[l][t].offset, seen)
                   .ok() ||
              std::memcmp(seen.data(), expected.data(), seen.size()) != 0) {
            ok = false;
          }
        }
      }
      reports[g].ok = ok ? 1 : 0;
      reports[g].verified_ns = base::MonotonicNowNs();
    }
    for (const GroupReport& r : reports) {
      if (!SendPod(control, r).ok()) return 27;
    }
  }
  return 0;
}

grouping::GroupPlan Groups() { return *grouping::EveryKPlan(kLayers, kGroupSize); }

class MemDaemonIpcTest : public ::testing::TestWithParam<gpu::Backend> {
 protected:
  void SetUp() override {
    if (std::string why = e2e::DeviceSkipReason(GetParam()); !why.empty()) GTEST_SKIP() << why;
    dir_ = std::filesystem::temp_directory_path() /
           ("pswitch-ipc-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    socket_path_ = (dir_ / "memdaemon.sock").string();
  }
  void TearDown() override { (void)base::RemoveTree(dir_); }

  // Forks the worker before any thread exists in this process, then starts the daemon.
  void StartWorkerAndDaemon(double bandwidth) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    child_ = ::fork();
    ASSERT_GE(child_, 0);
    if (child_ == 0) {
      ::close(sv[0]);
      proto::FrameChannel control{UniqueFd(sv[1])};
      Go go{};
      if (!ReceivePod(control, &go)) _exit(19);
      _exit(WorkerMain(control, socket_path_, GetParam(), std::string(go.secret, 32)));
    }
    ::close(sv[1]);
    control_ = std::make_unique<proto::FrameChannel>(UniqueFd(sv[0]));
    MemDaemonOptions options;
    options.arena_bytes = 128 << 20;
    options.device = OptionsFor(GetParam());
    options.device.copy_bandwidth_bytes_per_s = bandwidth;
    options.socket_path = socket_path_;
    auto daemon = MemDaemon::Create(options);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    auto secret = daemon_->IssueAttachSecret();
    ASSERT_TRUE(secret.ok()) << secret.status();
    Go go{};
    std::memcpy(go.secret, secret->data(), sizeof(go.secret));
    ASSERT_TRUE(SendPod(*control_, go).ok());
    uint32_t attached = 0;
    ASSERT_TRUE(ReceivePod(*control_, &attached));
    ASSERT_EQ(attached, 1u);
  }

  int JoinWorker() {
    control_.reset();  // EOF ends the worker's loop
    int wstatus = 0;
    EXPECT_EQ(::waitpid(child_, &wstatus, 0), child_);
    return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  }

  std::filesystem::path dir_;
  std::string socket_path_;
  pid_t child_ = -1;
  std::unique_ptr<proto::FrameChannel> control_;
  std::unique_ptr<MemDaemon> daemon_;
};

TEST_P(MemDaemonIpcTest, WorkerComputesOnEarlyGroupsWhileLaterGroupsAreStillCopying) {
  // Host: 24 MiB at 60 MB/s, ~420 ms of copying, 8 groups of ~52 ms each. CUDA copies at PCIe
  // speed (no cap), faster than the worker can check bytes: there only bytes and order count.
  StartWorkerAndDaemon(60e6);
  auto model_a = MakeSyntheticModel("m", kLayers, kModelBytes, /*seed=*/1);
  auto model_b = MakeSyntheticModel("m-b", kLayers, kModelBytes, /*seed=*/2);
  auto a = daemon_->weights().Register(model_a->model);
  auto b = daemon_->weights().Register(model_b->model);
  ASSERT_TRUE(a.ok() && b.ok());
  auto region = daemon_->leases().Acquire("model-region", kModelBytes + (1 << 20));
  ASSERT_TRUE(region.ok());

  for (uint32_t round = 0; round < 2; ++round) {
    const StoredModel* model = round == 0 ? *a : *b;
    // Epochs are 1, 3, 5, ...: the order tells the worker which one to wait for.
    uint32_t epoch = 1 + 2 * round;
    ASSERT_TRUE(SendPod(*control_, SwitchOrder{epoch, round + 1, region->offset, round}).ok());
    if (round == 1) {
      uint32_t stale_checked = 0;
      ASSERT_TRUE(ReceivePod(*control_, &stale_checked));
      ASSERT_EQ(stale_checked, 2u);
    }
    auto transmission =
        daemon_->transmitter().Start(TransmitRequest{model, Groups(), region->offset});
    ASSERT_TRUE(transmission.ok()) << transmission.status();
    ASSERT_EQ((*transmission)->epoch(), epoch);
    auto traces = (*transmission)->Wait(absl::Seconds(60));
    ASSERT_TRUE(traces.ok()) << traces.status();
    std::vector<GroupReport> reports(kGroups);
    for (auto& r : reports) ASSERT_TRUE(ReceivePod(*control_, &r));

    for (uint32_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(reports[g].ok, 1) << "round " << round << " group " << g;
      // Never seen before its copy started (no early release from a stale flag).
      EXPECT_GE(reports[g].seen_ns, (*traces)[g].copy_start_ns) << g;
    }
    // The overlap itself: the worker had checked group 0's bytes before the memdaemon had
    // finished copying the last group.
    if (GetParam() == gpu::Backend::kHost) {
      EXPECT_LT(reports[0].verified_ns, traces->back().ready_ns);
    }
  }
  EXPECT_EQ(JoinWorker(), 0);
}

TEST_P(MemDaemonIpcTest, LeasesOfACrashedWorkerAreReclaimedAndBadFramesCloseOneConnection) {
  StartWorkerAndDaemon(0);
  // This process attaches too, as a second worker would.
  auto device = gpu::Device::Open(OptionsFor(GetParam()));
  ASSERT_TRUE(device.ok());
  {
    auto client = ArenaClient::Attach(socket_path_, device->get(), 2);
    ASSERT_TRUE(client.ok()) << client.status();
    auto lease = (*client)->RequestLease("worker-2", 1 << 20);
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ((*client)->ReleaseLease("someone-else", lease->offset).code(),
              absl::StatusCode::kPermissionDenied);
    auto too_big = (*client)->RequestLease("worker-2", 1ull << 40);
    EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
    auto kept = (*client)->RequestLease("worker-2", 4096);
    ASSERT_TRUE(kept.ok());
    EXPECT_EQ(daemon_->leases().List().size(), 2u);

    auto raw = proto::FrameChannel::Connect(socket_path_);
    ASSERT_TRUE(raw.ok());
    const uint8_t junk[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    ASSERT_TRUE((*raw)->Send(junk).ok());
    auto reply = (*raw)->Receive(absl::Seconds(10));
    ASSERT_TRUE(reply.ok());
    auto parsed = proto::VerifyPayload<proto::MemReply>(reply->payload, "memdaemon reply");
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(proto::FromWireError((*parsed)->body_as_Error()).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*raw)->Receive(absl::Seconds(10)).status().code(), absl::StatusCode::kUnavailable);
    // A second daemon on the same socket is refused while this one serves.
    MemDaemonOptions second;
    second.arena_bytes = 8 << 20;
    second.device = OptionsFor(GetParam());
    second.socket_path = socket_path_;
    EXPECT_EQ(MemDaemon::Create(second).status().code(), absl::StatusCode::kAlreadyExists);
    // The well-behaved connection still works.
    ASSERT_TRUE((*client)->ReleaseLease("worker-2", lease->offset).ok());
    EXPECT_EQ(daemon_->leases().List().size(), 1u);
  }  // the client disconnects without releasing `kept`, as a crashed worker would
  // The server reclaims on its own thread once it sees the connection close.
  EXPECT_TRUE(daemon_->leases().AwaitLeaseCount(0, absl::Seconds(10)));
  EXPECT_EQ(JoinWorker(), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, MemDaemonIpcTest,
                         ::testing::Values(gpu::Backend::kHost, gpu::Backend::kCuda),
                         [](const ::testing::TestParamInfo<gpu::Backend>& info) {
                           return std::string(gpu::BackendName(info.param));
                         });

}  // namespace
}  // namespace pswitch::memdaemon
