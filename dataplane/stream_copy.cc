#include "dataplane/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

namespace pswitch::dataplane {

void StreamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  if (bytes >= kStreamCopyMinBytes) {
    auto* out = static_cast<unsigned char*>(dst);
    const auto* in = static_cast<const unsigned char*>(src);
    // Non-temporal stores need 16-byte aligned destinations, and fill the write-combining
    // buffer a line at a time only when each group of four starts a 64-byte line: the first
    // few bytes go by memcpy.
    const size_t head = (64 - reinterpret_cast<uintptr_t>(out) % 64) % 64;
    std::memcpy(out, in, head);
    out += head;
    in += head;
    bytes -= head;
    // Four 16-byte stores per 64-byte line (SSE2: every x86-64 CPU has it).
    for (; bytes >= 64; bytes -= 64, in += 64, out += 64) {
      // The source is read once: fetched 16 lines ahead as non-temporal, so the copy does not
      // push everything else (the model's code and data, other tenants') out of the caches.
      // Prefetching past the end is harmless (a prefetch never faults); the address is made as
      // an integer, never as a pointer past the source.
      _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(in) + 1024),
                   _MM_HINT_NTA);
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(out), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 48), d);
    }
    std::memcpy(out, in, bytes);
    // Streaming stores are weakly ordered: without the fence a reader told "done" (another
    // thread, the scheduler through a message) could see stale bytes.
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace pswitch::dataplane
