// What the end-to-end tests share: example inputs, their float values, a private token file,
// pswitchd's staging mappings.
#ifndef PSWITCH_TESTS_E2E_HELPERS_H_
#define PSWITCH_TESTS_E2E_HELPERS_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/files.h"
#include "gtest/gtest.h"
#include "models/registry.h"
#include "models/zoo_model.h"
#include "proto/host_tensor.h"
#include "worker/host_tensors.h"

namespace pswitch::e2e {

// The zoo model's example input, batch 2.
inline proto::HostTensor Input(const std::string& zoo, uint64_t seed) {
  auto model = models::CreateModel(zoo);
  EXPECT_TRUE(model.ok());
  auto host = worker::ToHostTensor("input", (*model)->ExampleInput(2, seed).input);
  EXPECT_TRUE(host.ok());
  return *host;
}

inline std::vector<float> Floats(const proto::HostTensor& t) {
  std::vector<float> v(t.data.size() / 4);
  std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

// A private (0600) --auth-tokens file for a test daemon, removed with it.
class TokenFile {
 public:
  explicit TokenFile(const std::string& lines) {
    char tmpl[] = "/tmp/pswitch-tokens-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/tokens";
    std::ofstream(path_) << lines;
    EXPECT_EQ(::chmod(path_.c_str(), 0600), 0);
  }
  ~TokenFile() { (void)base::RemoveTree(dir_); }
  std::string flag() const { return "--auth-tokens=" + path_; }

 private:
  std::string dir_, path_;
};

inline constexpr char kThreeTokens[] = "admin-token-0123456789 alice admin\n"
                                "user-token-bob-0123456789 bob user\n"
                                "user-token-carol-0123456789 carol user\n";

// pswitchd's (`pid`'s) mappings of staging regions (memfds named "pswitch-staging"): a region's
// bytes stay charged to the clients' budget while it is mapped.
inline int StagingMappings(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("pswitch-staging") != std::string::npos;
  }
  return n;
}

}  // namespace pswitch::e2e

#endif  // PSWITCH_TESTS_E2E_HELPERS_H_
