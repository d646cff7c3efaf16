#include "tools/cli.h"

#include "gtest/gtest.h"

namespace pswitch::tools {
namespace {

TEST(CliTest, DashedFlagNamesBecomeUnderscoresButValuesDoNot) {
  EXPECT_EQ(NormalizeFlagName("--arena-bytes=1024"), "--arena_bytes=1024");
  EXPECT_EQ(NormalizeFlagName("--socket=/tmp/a-b.sock"), "--socket=/tmp/a-b.sock");
  EXPECT_EQ(NormalizeFlagName("--bandwidth-cap"), "--bandwidth_cap");
  EXPECT_EQ(NormalizeFlagName("-x"), "-x");
  EXPECT_EQ(NormalizeFlagName("plain-arg"), "plain-arg");
}

}  // namespace
}  // namespace pswitch::tools
