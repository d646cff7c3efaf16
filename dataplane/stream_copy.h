// The worker's copy of a large tensor between a transfer region and memory of its own (the host
// backend's counterpart of the host-to-device DMA). glibc's memcpy writes through the cache, so
// every destination line is first read from memory (a read for ownership) only to be overwritten:
// on the 2-core CI-class machine an 8.6 MB copy with non-temporal stores, which skip that read,
// took about 0.45 ms against memcpy's 0.6 ms (tools/bench-dataplane, docs/performance.md).
// glibc chooses them itself only above its x86_non_temporal_threshold, which it derives from the
// cache sizes the CPU reports (240 MB on that machine's virtual CPU), so pswitch chooses here.
//
// The source is prefetched as non-temporal too, so a copy of tens of megabytes does not evict
// the rest of the caches: in bench-dataplane's full runs the Unix area's 8.6 MB request took
// 0.80 to 0.86 ms with that against 0.83 to 0.96 ms without.
//
// Copies smaller than kStreamCopyMinBytes use memcpy: their destination fits the core's own
// cache, where the next reader (the model's first layer) finds it.
#ifndef PSWITCH_DATAPLANE_STREAM_COPY_H_
#define PSWITCH_DATAPLANE_STREAM_COPY_H_

#include <cstddef>

namespace pswitch::dataplane {

inline constexpr size_t kStreamCopyMinBytes = size_t{2} << 20;

// Copies `bytes` from `src` to `dst` (which must not overlap), with non-temporal stores when
// `bytes` >= kStreamCopyMinBytes on x86-64; memcpy otherwise. Any alignment. Holds no lock and
// allocates nothing, so a fault handler may abandon it half way (GuardedCopy does); its stores
// are fenced before it returns, so the bytes are visible as after a memcpy.
void StreamCopy(void* dst, const void* src, size_t bytes);

}  // namespace pswitch::dataplane

#endif  // PSWITCH_DATAPLANE_STREAM_COPY_H_
