#include "frontend/client_quota.h"

#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

TEST(ClientQuotaTest, EachClientHasItsOwnCapAndFinishedTasksFreeIt) {
  ClientQuota quota(2);
  EXPECT_TRUE(quota.Admit("alice").ok());
  EXPECT_TRUE(quota.Admit("alice").ok());
  absl::Status third = quota.Admit("alice");
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("--max-tasks-per-client"), absl::string_view::npos) << third;
  EXPECT_EQ(quota.unfinished("alice"), 2u) << "a refusal counts nothing";
  // Another client is not held back by alice.
  EXPECT_TRUE(quota.Admit("bob").ok());
  quota.Done("alice");
  EXPECT_TRUE(quota.Admit("alice").ok());
  quota.Done("alice");
  quota.Done("alice");
  quota.Done("alice");  // more than admitted: ignored, never negative
  EXPECT_EQ(quota.unfinished("alice"), 0u);
  EXPECT_TRUE(quota.Admit("alice").ok());
  EXPECT_EQ(quota.unfinished("alice"), 1u);
}

}  // namespace
}  // namespace pswitch::frontend
