#include "dataplane/stream_copy.h"

#include <cstdint>
#include <cstring>
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
      for (const size_t dst_shift : {0, 3, 16, 33, 63}) {
        std::vector<uint8_t> src(size + src_shift);
        for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + size);
        std::vector<uint8_t> dst(size + dst_shift + 2 * kGuard, 0xA5);
        StreamCopy(dst.data() + kGuard + dst_shift, src.data() + src_shift, size);
        const std::vector<uint8_t> untouched(kGuard + dst_shift, 0xA5);
        ASSERT_EQ(std::memcmp(dst.data(), untouched.data(), untouched.size()), 0)
            << "before the destination, size " << size;
        ASSERT_EQ(std::memcmp(dst.data() + kGuard + dst_shift, src.data() + src_shift, size), 0)
            << size << " bytes, src+" << src_shift << " dst+" << dst_shift;
        ASSERT_EQ(std::memcmp(dst.data() + kGuard + dst_shift + size, untouched.data(), kGuard),
                  0)
            << "after the destination, size " << size;
      }
    }
  }
}

}  // namespace
}  // namespace pswitch::dataplane
