// The activity page's layout (gpu/activity_page.h), with nothing else: libpswitch_monitor.so,
// preloaded into other processes, includes it and links nothing of pswitch.
#ifndef PSWITCH_GPU_ACTIVITY_PAGE_LAYOUT_H_
#define PSWITCH_GPU_ACTIVITY_PAGE_LAYOUT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace pswitch::gpu {

inline constexpr uint64_t kActivityMagic = 0x31305443'41575350ull;  // "PSWACT01", little endian
struct ActivityPageLayout {
  uint64_t magic;
  std::atomic<uint64_t> launches;  // ever, by every writer
  std::atomic<uint64_t> busy;      // holds under way (host); 0 on CUDA
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
inline constexpr size_t kActivityFileBytes = 4096;

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_ACTIVITY_PAGE_LAYOUT_H_
