#include "frontend/listen_address.h"

#include <gtest/gtest.h>

namespace pswitch::frontend {
namespace {

TEST(ListenAddressTest, SplitsHostAndPortWithIpv6InBrackets) {
  auto v4 = SplitListen("127.0.0.1:8300");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 8300);
  auto v6 = SplitListen("[::1]:0");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
  auto any = SplitListen("0.0.0.0:65535");
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->port, 65535);
}

TEST(ListenAddressTest, RefusesWhatIsNotHostColonPort) {
  for (const char* bad :
       {"", "8300", "host:", "host:65536", "host:-1", "host:80x", ":99999999999"}) {
    auto r = SplitListen(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // An unclosed bracket is left for the address parser to refuse, not silently trimmed.
  auto open = SplitListen("[::1:80");
  ASSERT_TRUE(open.ok());
  EXPECT_EQ(open->host, "[::1");
}

}  // namespace
}  // namespace pswitch::frontend
