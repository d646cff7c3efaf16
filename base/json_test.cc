#include "base/json.h"

#include <string>

#include "gtest/gtest.h"

namespace pswitch::base {
namespace {

std::string Nested(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

TEST(UntrustedJsonTest, ParsesOrdinaryJson) {
  auto json = ParseUntrustedJson(R"({"period_ns": 5, "bubbles": [[1, 2]], "s": "[[[{"})", "x");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*json)["period_ns"], 5);
  EXPECT_EQ((*json)["s"], "[[[{");  // brackets inside strings are not nesting
}

// The attack of the trust-boundary issue: 100,000 nested arrays inside a bubble cycle.
TEST(UntrustedJsonTest, DeepNestingIsRefusedBeforeAnythingIsBuilt) {
  const std::string attack = "{\"period_ns\":" + Nested(100000) + ",\"bubbles\":[]}";
  auto json = ParseUntrustedJson(attack, "bubble cycle");
  ASSERT_FALSE(json.ok());
  EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(json.status().message(), "bubble cycle: JSON nested deeper than 32 levels");
  EXPECT_TRUE(ParseUntrustedJson(Nested(32), "x").ok());
  EXPECT_FALSE(ParseUntrustedJson(Nested(33), "x").ok());
  // Escaped quotes do not end a string early.
  EXPECT_TRUE(ParseUntrustedJson(R"(["\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["])", "x").ok());
}

TEST(UntrustedJsonTest, ErrorsNameThePositionNeverTheContent) {
  auto json = ParseUntrustedJson(R"({"secret-token-123": })", "plan file");
  ASSERT_FALSE(json.ok());
  EXPECT_EQ(json.status().message().find("secret"), absl::string_view::npos)
      << json.status().message();
  EXPECT_NE(json.status().message().find("plan file: malformed JSON"), absl::string_view::npos);
  // Ill-formed UTF-8 inside a string is malformed too, not passed on.
  EXPECT_FALSE(ParseUntrustedJson("[\"\xff\xfe\"]", "x").ok());
}

TEST(UntrustedJsonTest, OversizedTextIsRefused) {
  JsonLimits limits;
  limits.max_bytes = 10;
  EXPECT_EQ(ParseUntrustedJson("[1,2,3,4,5,6]", "x", limits).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pswitch::base
