// How the memdaemon carves its arena.
//
//   [0, kControlBytes)       control block: ready flags (one per group, all transmissions
//                            share the array at different bases), then drain flags (one per
//                            tenant slot). 32-bit words, zero at start.
//   [kControlBytes, size)    data: leases (model weight regions, worker activation regions).
//
// Workers learn these numbers from ArenaGrant, not from this header, so the layout can change
// without a protocol break.
#ifndef PSWITCH_MEMDAEMON_ARENA_LAYOUT_H_
#define PSWITCH_MEMDAEMON_ARENA_LAYOUT_H_

#include <cstdint>

#include "gpu/device.h"

namespace pswitch::memdaemon {

inline constexpr uint32_t kReadyFlagCount = 16384;  // per-layer plans of the largest zoo models
inline constexpr uint32_t kDrainFlagCount = 256;
inline constexpr uint64_t kReadyFlagsOffset = 0;
inline constexpr uint64_t kDrainFlagsOffset = kReadyFlagsOffset + kReadyFlagCount * 4;
// Data starts on a 2 MiB boundary (large-page friendly on both backends).
inline constexpr uint64_t kControlBytes = 2ull << 20;
// Leases, and the weights cache's regions inside its pool, start and end on a page: a worker's
// access to one (issue 29 item 2) widens to whole pages, which then hold nothing of another.
inline constexpr uint64_t kLeaseAlignmentBytes = 4096;
// `bytes` to whole pages; the caller keeps it below UINT64_MAX - kLeaseAlignmentBytes.
inline constexpr uint64_t WholePages(uint64_t bytes) {
  return (bytes + kLeaseAlignmentBytes - 1) / kLeaseAlignmentBytes * kLeaseAlignmentBytes;
}
// A worker asks for a VMM arena's chunk fds at most this many at a time (each travels in a
// frame of its own and stays open in pswitchd until sent; the worker imports a batch before it
// asks for the next, so neither side holds more than this many at once per worker).
inline constexpr uint32_t kMaxChunksPerRequest = gpu::kMaxArenaChunksPerFetch;
// What a memdaemon connection may leave unread: one batch of chunk frames and a few replies. A
// worker that asks again before reading is closed rather than pinning pswitchd's fds.
inline constexpr size_t kMaxQueuedReplyBytes = (kMaxChunksPerRequest + 8) * 256;
static_assert(kDrainFlagsOffset + kDrainFlagCount * 4 <= kControlBytes);
// Every flag word inside the window the device interface mirrors in host memory.
static_assert(kDrainFlagsOffset + kDrainFlagCount * 4 <= gpu::kFlagWindowBytes);

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_ARENA_LAYOUT_H_
