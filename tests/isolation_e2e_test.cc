// Tenants cannot see each other's data (issue 27), against a real pswitchd on the host backend
// with two users: the attacker's archives that would address memory outside their tensors (the
// arena's weights, another worker's lease) are refused at registration, and the one that
// registers because it only returns torch.empty gets zeros, not the other user's activations.
// The archives are tests/data/make_escape_archives.py's.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e_helpers.h"
#include "tests/test_daemon.h"

namespace pswitch {
namespace {

using ::testing::HasSubstr;

const std::filesystem::path kArchives = std::filesystem::path(PSWITCH_TEST_DATA_DIR) / "archives";
constexpr int64_t kWidth = 1024;  // passthrough's and lease_reader's features
constexpr float kSecret = 7.25f;  // every value of the victim's input

proto::HostTensor Filled(std::vector<int64_t> shape, float value) {
  proto::HostTensor t;
  t.name = "input";
  t.dtype = proto::DType::F32;
  t.shape = shape;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> values(static_cast<size_t>(n), value);
  t.data.resize(values.size() * sizeof(float));
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

std::unique_ptr<client::Client> Connect(const e2e::TestDaemon& daemon, const std::string& token) {
  client::ClientOptions options;
  options.token = token;
  auto client = client::Client::Connect(daemon.address(), options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

absl::Status Register(client::Client& admin, const std::string& name, const std::string& file) {
  client::RegisterOptions options;
  options.name = name;
  options.archive_path = (kArchives / file).string();
  options.batch_size = 2;
  return admin.Register(options).status();
}

TEST(IsolationE2eTest, OneUsersArchiveGetsNothingOfAnotherUsersInputsOrAnotherModelsWeights) {
  e2e::TokenFile tokens(e2e::kThreeTokens);
  // One worker: both users' tasks run in the same process and the same activation lease.
  e2e::TestDaemon daemon(
      {"--preload=", "--allow-client-paths=true", "--standby-workers=0", tokens.flag()});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto alice = Connect(daemon, "admin-token-0123456789");       // the operator
  auto bob = Connect(daemon, "user-token-bob-0123456789");      // the victim
  auto carol = Connect(daemon, "user-token-carol-0123456789");  // the attacker
  ASSERT_TRUE(alice && bob && carol);

  // Every archive that could reach outside its tensors (as_strided over the arena, set_,
  // resize_, raw strides, sparse indices, an out-of-storage buffer, ...) is refused, saying why.
  std::ifstream listing(kArchives / "escapes" / "escapes.json");
  std::stringstream text;
  text << listing.rdbuf();
  const nlohmann::json escapes = nlohmann::json::parse(text.str());
  ASSERT_GE(escapes.size(), 18u);
  int i = 0;
  for (const auto& [file, message] : escapes.items()) {
    SCOPED_TRACE(file);
    absl::Status refused = Register(*alice, "escape" + std::to_string(i++), "escapes/" + file);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr(message.get<std::string>()));
  }

  for (const auto& [name, file] : {std::pair<std::string, std::string>{"victim", "passthrough"},
                                   {"reader", "lease_reader"},
                                   {"wide", "wide_output"}}) {
    absl::Status registered = Register(*alice, name, file + ".pswitch.pt");
    ASSERT_TRUE(registered.ok()) << name << ": " << registered << "\n" << daemon.log();
  }

  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    // Bob's input passes through the lease as his model's activations ...
    auto victim = bob->Infer("victim", {Filled({16, kWidth}, kSecret)});
    ASSERT_TRUE(victim.ok()) << victim.status();
    ASSERT_EQ(e2e::Floats(victim->outputs[0]).front(), kSecret);
    // ... and Carol's archive returns uninitialised lease memory (torch.empty_like) for
    // batches it never showed at registration: it must be zeros, never Bob's values.
    auto read = carol->Infer("reader", {Filled({3, 4}, 1.0f)});
    ASSERT_TRUE(read.ok()) << read.status();
    const std::vector<float> got = e2e::Floats(read->outputs[0]);
    ASSERT_EQ(got.size(), static_cast<size_t>(3 * kWidth));
    size_t secret = 0, nonzero = 0;
    for (float v : got) {
      secret += v == kSecret;
      nonzero += v != 0.0f;
    }
    EXPECT_EQ(secret, 0u) << "values of the other user's input reached the attacker";
    EXPECT_EQ(nonzero, 0u);
  }

  // An output wider than the one recorded at registration is refused, not sent.
  auto wide = carol->Infer("wide", {Filled({3, 4}, 1.0f)});
  ASSERT_FALSE(wide.ok());
  EXPECT_THAT(std::string(wide.status().message()), HasSubstr("recorded output"));
  auto narrow = carol->Infer("wide", {Filled({2, 4}, 1.0f)});
  EXPECT_TRUE(narrow.ok()) << narrow.status();
}

}  // namespace
}  // namespace pswitch
