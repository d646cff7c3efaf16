#include "frontend/memory_return.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace pswitch::frontend {

void FixMmapThreshold(size_t bytes) {
#if defined(__GLIBC__)
  ::mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes));
#else
  (void)bytes;
#endif
}

void ReturnFreedMemory() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

}  // namespace pswitch::frontend
