#include "worker/stream_frees.h"

#include <set>

#include "gtest/gtest.h"

namespace pswitch::worker {
namespace {

// Events the test completes by hand; streams and blocks are just distinct addresses.
class StreamFreesTest : public ::testing::Test {
 protected:
  StreamFrees::EventOps Ops() {
    return StreamFrees::EventOps{[this](StreamFrees::Stream) -> StreamFrees::Event {
                                   if (!can_record) return nullptr;
                                   ++recorded;
                                   return &events[recorded - 1];
                                 },
                                 [this](StreamFrees::Event e) { return done.contains(e); },
                                 [this](StreamFrees::Event) { ++recycled; }};
  }
  int blocks[4] = {};
  int streams[2] = {};
  int events[8] = {};
  std::set<void*> done;
  bool can_record = true;
  int recorded = 0, recycled = 0;
  void* s1 = &streams[0];
  void* s2 = &streams[1];
};

// Issue 26, item 6: a block freed on the compute stream goes back to allocations on that stream
// at once (stream order covers its uses) and costs no event.
TEST_F(StreamFreesTest, ABlockIsReusedOnItsOwnStreamAtOnce) {
  StreamFrees frees(Ops());
  frees.Freed(&blocks[0], s1);
  frees.Freed(&blocks[1], s1);
  EXPECT_EQ(frees.Reusable(s1, /*fence=*/false), (std::vector<void*>{&blocks[0], &blocks[1]}));
  EXPECT_EQ(recorded, 0);
  EXPECT_TRUE(frees.Reusable(s1, false).empty());
}

// Issue 26, item 6: another stream (the default stream outside a task) gets a block only once
// the work that used it on its own stream is done.
TEST_F(StreamFreesTest, AnotherStreamWaitsForTheEventThatFencesTheBlock) {
  StreamFrees frees(Ops());
  frees.Freed(&blocks[0], s1);
  EXPECT_TRUE(frees.Reusable(s2, /*fence=*/false).empty()) << "no fence, no reuse";
  EXPECT_TRUE(frees.Reusable(s2, /*fence=*/true).empty()) << "fenced, but not complete";
  EXPECT_EQ(recorded, 1);
  EXPECT_TRUE(frees.waiting());
  frees.Freed(&blocks[1], s1);  // after the fence: needs a fence of its own
  done.insert(&events[0]);
  EXPECT_EQ(frees.Reusable(s2, false), std::vector<void*>{&blocks[0]});
  EXPECT_EQ(recycled, 1);
  EXPECT_FALSE(frees.waiting());
  EXPECT_EQ(frees.Reusable(s1, false), std::vector<void*>{&blocks[1]});
}

TEST_F(StreamFreesTest, ItsOwnStreamTakesFencedBlocksBackWithoutWaiting) {
  StreamFrees frees(Ops());
  frees.Freed(&blocks[0], s1);
  EXPECT_TRUE(frees.Reusable(s2, /*fence=*/true).empty());
  EXPECT_EQ(frees.Reusable(s1, false), std::vector<void*>{&blocks[0]});
  EXPECT_EQ(recycled, 1);
  EXPECT_FALSE(frees.waiting());
}

TEST_F(StreamFreesTest, WithoutAnEventABlockStaysForItsOwnStream) {
  StreamFrees frees(Ops());
  can_record = false;
  frees.Freed(&blocks[0], s1);
  EXPECT_TRUE(frees.Reusable(s2, /*fence=*/true).empty());
  EXPECT_FALSE(frees.waiting());
  EXPECT_EQ(frees.Reusable(s1, false), std::vector<void*>{&blocks[0]});
}

}  // namespace
}  // namespace pswitch::worker
