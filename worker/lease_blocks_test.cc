#include "worker/lease_blocks.h"

#include <array>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(LeaseBlocksTest, HandsOutAlignedBlocksInsideTheLeaseAndReusesFreedOnes) {
  std::vector<std::byte> lease(4096 + 100);
  // A deliberately misaligned base: blocks still start on the alignment.
  LeaseBlocks blocks(lease.data() + 3, 4096, 256);
  std::byte* a = blocks.Take(1);
  std::byte* b = blocks.Take(300);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 256, 0u);
  EXPECT_TRUE(blocks.Contains(a) && blocks.Contains(b));
  EXPECT_EQ(blocks.in_use_bytes(), 256u + 512u);
  EXPECT_FALSE(blocks.Give(b + 1));  // not a block start: nothing changes
  EXPECT_TRUE(blocks.Give(a));
  EXPECT_FALSE(blocks.Give(a));  // already free
  EXPECT_EQ(blocks.Take(200), a);
  EXPECT_EQ(blocks.peak_bytes(), 768u);
}

TEST(LeaseBlocksTest, AFullLeaseOrACapFailsTheRequestWithTheReason) {
  alignas(1024) std::byte lease[8192];  // aligned: every byte is usable
  LeaseBlocks blocks(lease, sizeof(lease), 1024);
  std::byte* half = blocks.Take(4096);
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(blocks.Take(6000), nullptr);
  EXPECT_THAT(blocks.DescribeShortage(6000),
              HasSubstr("activation lease exhausted: 6000 bytes requested, 4096 of 8192 bytes in "
                        "use, largest free block 4096 bytes (raise pswitchd --activation-bytes)"));
  EXPECT_EQ(blocks.Take(2048, /*limit_bytes=*/5000), nullptr);
  EXPECT_THAT(blocks.DescribeShortage(2048, 5000), AllOf(HasSubstr("task memory cap of 5000 bytes"),
                                                         HasSubstr("memory_bytes")));
  EXPECT_EQ(blocks.in_use_bytes(), 4096u);
  // Freed neighbours coalesce: the whole lease fits in one block again.
  EXPECT_TRUE(blocks.Give(half));
  EXPECT_NE(blocks.Take(8192), nullptr);
}

// Defect 14: cuBLAS/cuDNN workspaces made by the load-time warm-up stay for the process's life;
// a fill task's memory cap must not count them.
TEST(LeaseBlocksTest, PersistentBytesDoNotCountAgainstATaskLimit) {
  std::vector<std::byte> lease(8192);
  LeaseBlocks blocks(lease.data(), 8192, 256);
  ASSERT_NE(blocks.Take(1024), nullptr);  // a workspace
  blocks.MarkPersistent();
  EXPECT_NE(blocks.Take(1024, 1024), nullptr) << "the workspace is not the task's";
  EXPECT_EQ(blocks.Take(256, 1024), nullptr);
  EXPECT_THAT(blocks.DescribeShortage(256, 1024), HasSubstr("1024 in use by the task"));
  EXPECT_EQ(blocks.in_use_bytes(), 2048u);
}

TEST(LeaseBlocksTest, AfterAnOwnerChangeEveryByteAnEarlierOwnerTouchedIsReportedOnceForClearing) {
  // Aligned, so the offsets below are the blocks' (a vector's storage need not be: the blocks
  // would then start at the first multiple of 256 inside it, and the tail would not fit).
  alignas(256) std::array<std::byte, 4096> lease{};
  LeaseBlocks blocks(lease.data(), 4096, 256);
  std::vector<LeaseBlocks::Range> clear;
  // The first owner: nothing was touched before it.
  std::byte* a = blocks.Take(300, 0, &clear);  // [0, 512)
  std::byte* b = blocks.Take(256, 0, &clear);  // [512, 768), in use across the change
  EXPECT_TRUE(clear.empty());
  ASSERT_TRUE(blocks.Give(a));
  // The same owner again: its own bytes are not cleared.
  ASSERT_EQ(blocks.Take(100, 0, &clear), a);
  EXPECT_TRUE(clear.empty());
  ASSERT_TRUE(blocks.Give(a));

  blocks.NewOwner();
  EXPECT_EQ(blocks.dirty_bytes(), 768u);
  // A smaller block over the old one: exactly its bytes, and only once.
  ASSERT_EQ(blocks.Take(200, 0, &clear), a);
  ASSERT_EQ(clear.size(), 1u);
  EXPECT_EQ(clear[0].start, a);
  EXPECT_EQ(clear[0].bytes, 256u);
  clear.clear();
  std::byte* c = blocks.Take(1024, 0, &clear);  // [768, 1792): never touched
  EXPECT_TRUE(clear.empty());
  ASSERT_TRUE(blocks.Give(a));
  ASSERT_EQ(blocks.Take(512, 0, &clear), a);  // [0, 512): only [256, 512) is still dirty
  ASSERT_EQ(clear.size(), 1u);
  EXPECT_EQ(clear[0].start, a + 256);
  EXPECT_EQ(clear[0].bytes, 256u);
  clear.clear();
  // The block in use across the change is dirty when it comes back.
  ASSERT_TRUE(blocks.Give(b));
  ASSERT_EQ(blocks.Take(256, 0, &clear), b);
  ASSERT_EQ(clear.size(), 1u);
  EXPECT_EQ(clear[0].start, b);
  EXPECT_EQ(blocks.dirty_bytes(), 0u);
  clear.clear();

  // The next owner: everything the previous one took (a, b, c) is dirty again.
  blocks.NewOwner();
  EXPECT_EQ(blocks.dirty_bytes(), 1792u);
  ASSERT_TRUE(blocks.Give(c));
  ASSERT_EQ(blocks.Take(4096 - 768, 0, &clear), c);  // [768, 4096): [768, 1792) dirty
  ASSERT_EQ(clear.size(), 1u);
  EXPECT_EQ(clear[0].start, c);
  EXPECT_EQ(clear[0].bytes, 1024u);
}

}  // namespace
}  // namespace pswitch::worker
