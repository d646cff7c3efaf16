#include "dataplane/stream_copy.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace pswitch::dataplane {
namespace {

// Every byte lands where memcpy would put it, whatever the alignment of either side and the
// size around the streaming threshold (head, 64-byte body and tail all exercised), and nothing
// outside the destination's range is touched.
TEST(StreamCopyTest, CopiesEveryByteAtAnyAlignmentAndSize) {
  const size_t sizes[] = {0, 1, 63, 4096, kStreamCopyMinBytes - 1, kStreamCopyMinBytes,
                          kStreamCopyMinBytes + 1, kStreamCopyMinBytes + 63,
                          kStreamCopyMinBytes + 17 * 64 + 5};
  constexpr size_t kGuard = 64;
  for (const size_t size : sizes) {
    for (const size_t src_shift : {0, 1, 8, 15}) {
      for (const size_t dst_shift : {0, 3, 16, 33}) {
        std::vector<uint8_t> src(size + src_shift);
        for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + size);
        std::vector<uint8_t> dst(size + dst_shift + 2 * kGuard, 0xA5);
        StreamCopy(dst.data() + kGuard + dst_shift, src.data() + src_shift, size);
        for (size_t i = 0; i < kGuard + dst_shift; ++i) {
          ASSERT_EQ(dst[i], 0xA5) << "before the destination, size " << size;
        }
        for (size_t i = 0; i < size; ++i) {
          ASSERT_EQ(dst[kGuard + dst_shift + i], src[src_shift + i])
              << "byte " << i << " of " << size << ", src+" << src_shift << " dst+" << dst_shift;
        }
        for (size_t i = kGuard + dst_shift + size; i < dst.size(); ++i) {
          ASSERT_EQ(dst[i], 0xA5) << "after the destination, size " << size;
        }
      }
    }
  }
}

}  // namespace
}  // namespace pswitch::dataplane
