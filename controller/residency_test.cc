#include "controller/residency.h"

#include "gtest/gtest.h"

namespace pswitch::controller {
namespace {

TEST(ResidencyTest, AModelIsResidentAfterItsSwitchUntilThatSwitchFails) {
  Residency r;
  EXPECT_FALSE(r.Holds("a"));
  EXPECT_EQ(r.active_slot(), -1);
  r.Switched(1, "a", 5);
  EXPECT_TRUE(r.Holds("a"));
  EXPECT_FALSE(r.Holds("b"));
  EXPECT_EQ(r.active_slot(), 1);
  EXPECT_EQ(r.epoch(), 5u);
  r.Failed(3);  // an older, superseded switch: says nothing about this one
  EXPECT_TRUE(r.Holds("a"));
  r.Failed(5);
  EXPECT_FALSE(r.Holds("a")) << "partly old weights: the next task transmits again";
  EXPECT_EQ(r.active_slot(), 1) << "the tenant stays; only the weights are untrusted";
}

TEST(ResidencyTest, TheActiveTenantsDeathEndsResidencyAStandbysDoesNot) {
  Residency r;
  r.Switched(0, "a", 1);
  r.SlotDied(2);
  EXPECT_TRUE(r.Holds("a"));
  r.SlotDied(0);
  EXPECT_FALSE(r.Holds("a"));
  EXPECT_EQ(r.active_slot(), -1);
}

}  // namespace
}  // namespace pswitch::controller
