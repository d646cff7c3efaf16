// The C++ client library against a real pswitchd over its Unix socket: area tensors sent as their
// own slices, outputs written by the worker into the client's area, every answer bit-identical
// to the framed TCP path, many threads sharing one client's areas, and local addresses taking
// the socket. (The byte-level protocol and its hostile cases: tests/unix_socket_e2e_test.cc.)
#include <stdlib.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_daemon.h"

namespace pswitch {
namespace {

using client::AreaTensor;
using client::Client;
using e2e::TestDaemon;

// One pswitchd for the suite: starting one takes seconds, and no test changes its state.
class ClientLocalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (e2e::BackendSkipReason(gpu::Backend::kHost).empty()) {
      daemon_ = new TestDaemon({"--preload=tiny_cnn"});
    }
  }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
  }
  void SetUp() override {
    if (std::string why = e2e::BackendSkipReason(gpu::Backend::kHost); !why.empty()) {
      GTEST_SKIP() << why;
    }
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
  }
  // --unix-socket=auto puts it beside the memdaemon socket, in the daemon's directory.
  static std::string SocketOf(const TestDaemon& daemon) {
    return (daemon.dir() / "pswitchd.sock").string();
  }
  static inline TestDaemon* daemon_ = nullptr;
};

proto::HostTensor Image(uint32_t seed, int64_t batch) {
  proto::HostTensor t;
  t.name = "input";
  t.shape = {batch, 3, 32, 32};
  std::vector<float> values(static_cast<size_t>(batch) * 3 * 32 * 32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (float& v : values) v = normal(rng);
  t.data.resize(values.size() * sizeof(float));
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

client::ClientOptions Tcp() {
  client::ClientOptions o;
  o.timeout = absl::Seconds(60);
  o.transport = client::Transport::kTcp;
  return o;
}

client::ClientOptions Local() {
  client::ClientOptions o;
  o.timeout = absl::Seconds(60);
  o.areas.first_area_bytes = 4 << 20;
  return o;
}

TEST_F(ClientLocalTest, AreaInferenceIsBitIdenticalToTheFramedPathAndSendsNoBytes) {
  const TestDaemon& daemon = *daemon_;
  auto tcp = Client::Connect(daemon.address(), Tcp());
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  auto local = Client::Connect("unix:" + SocketOf(daemon), Local());
  ASSERT_TRUE(local.ok()) << local.status() << "\n" << daemon.log();
  ASSERT_FALSE((*tcp)->local());
  ASSERT_TRUE((*local)->local());

  // The model's output spec, from which the client sizes the output space.
  auto models = (*local)->ListModels();
  ASSERT_TRUE(models.ok());
  bool listed = false;
  for (const client::ModelInfo& m : *models) {
    if (m.name != "tiny_cnn") continue;
    listed = true;
    ASSERT_FALSE(m.output_shape.empty());
    EXPECT_EQ(m.output_shape[0], -1);
  }
  EXPECT_TRUE(listed);

  for (int64_t batch : {1, 2, 5}) {
    const proto::HostTensor x = Image(static_cast<uint32_t>(batch), batch);
    auto framed = (*tcp)->Infer("tiny_cnn", {x});
    ASSERT_TRUE(framed.ok()) << framed.status();
    // HostTensor calls over the socket: one copy into the area, one out.
    auto copied = (*local)->Infer("tiny_cnn", {x});
    ASSERT_TRUE(copied.ok()) << copied.status();
    EXPECT_EQ(copied->outputs[0].data, framed->outputs[0].data);

    // An area tensor filled in place: the request names its own slice.
    auto t = (*local)->Tensor(x.shape, proto::DType::F32);
    ASSERT_TRUE(t.ok()) << t.status();
    std::memcpy(t->data(), x.data.data(), x.data.size());
    auto result = (*local)->InferArea("tiny_cnn", {*t});
    ASSERT_TRUE(result.ok()) << result.status() << "\n" << daemon.log();
    ASSERT_EQ(result->sent_inputs.size(), 1u);
    EXPECT_EQ(result->sent_inputs[0].place, proto::Place::Region);
    EXPECT_EQ(result->sent_inputs[0].slice, t->Descriptor().slice);
    ASSERT_EQ(result->outputs.size(), 1u);
    const AreaTensor& y = result->outputs[0];
    EXPECT_EQ(y.shape(), framed->outputs[0].shape);
    // The worker wrote it into this client's area: a view, where the request put its space.
    EXPECT_EQ((*local)->areas()->Find(y.data(), y.length()), y.span());
    ASSERT_EQ(y.length(), framed->outputs[0].data.size());
    EXPECT_EQ(std::memcmp(y.data(), framed->outputs[0].data.data(), y.length()), 0);
    // The worker read the input in place and left it as it was.
    EXPECT_EQ(std::memcmp(t->data(), x.data.data(), x.data.size()), 0);
  }
}

TEST_F(ClientLocalTest, ThreadsShareOneClientsAreasAndGiveTheSpaceBack) {
  const TestDaemon& daemon = *daemon_;
  auto tcp = Client::Connect(daemon.address(), Tcp());
  auto local = Client::Connect("unix:" + SocketOf(daemon), Local());
  ASSERT_TRUE(tcp.ok() && local.ok());
  const proto::HostTensor x = Image(11, 2);
  auto expected = (*tcp)->Infer("tiny_cnn", {x});
  ASSERT_TRUE(expected.ok());
  const std::vector<uint8_t>& want = expected->outputs[0].data;

  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  std::atomic<int> failed{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 10; ++k) {
        auto t = (*local)->Tensor(x.shape, proto::DType::F32);
        if (!t.ok()) {
          ++failed;
          continue;
        }
        std::memcpy(t->data(), x.data.data(), x.data.size());
        auto r = (*local)->InferArea("tiny_cnn", {*t});
        if (!r.ok()) {
          ++failed;
          continue;
        }
        const AreaTensor& y = r->outputs[0];
        if (y.length() != want.size() || std::memcmp(y.data(), want.data(), want.size()) != 0) {
          ++wrong;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed, 0) << daemon.log();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ((*local)->areas()->allocated_bytes(), 0u);  // every tensor and result gave it back
  EXPECT_EQ((*local)->areas()->area_count(), 1u);       // and the first area sufficed
}

TEST_F(ClientLocalTest, TheDefaultAddressTakesTheDefaultSocket) {
  const TestDaemon& daemon = *daemon_;
  ::setenv("PSWITCH_UNIX_SOCKET", SocketOf(daemon).c_str(), 1);
  auto local = Client::Connect("", Local());
  ::unsetenv("PSWITCH_UNIX_SOCKET");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE((*local)->local());
  auto r = (*local)->Infer("tiny_cnn", {Image(3, 1)});
  EXPECT_TRUE(r.ok()) << r.status();
}

}  // namespace
}  // namespace pswitch
