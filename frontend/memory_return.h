// Memory a client made pswitchd hold goes back to the system once the client is gone, not only
// to the allocator's free lists.
//
// Why it stayed (issue 27, item 7: 1.2 GB resident after six connections with unread replies
// closed): glibc serves allocations below its mmap threshold from its heaps, and frees them into
// free lists that it returns to the kernel only from the very top of a heap. Queued replies are
// mostly such allocations (a 1,000-task list is 44 KB, an acknowledgement 100 bytes), made on
// the event loop's own arena and interleaved with allocations that live on, so after the
// connections close little sits at a heap's top: measured, 207 of 336 MiB of such replies stayed
// resident after their connections closed, none once malloc_trim ran. Large buffers (frames of
// megabytes) have another problem: glibc's threshold is dynamic and rises to the size of the
// largest block freed, after which those too come from the heaps.
#ifndef PSWITCH_FRONTEND_MEMORY_RETURN_H_
#define PSWITCH_FRONTEND_MEMORY_RETURN_H_

#include <cstddef>

namespace pswitch::frontend {

// Makes every allocation of at least `bytes` its own mapping, unmapped when freed, for the
// life of the process (glibc's threshold no longer rises). Call once, at start, before threads.
void FixMmapThreshold(size_t bytes);

// Gives the allocator's free pages, in every arena, back to the system (glibc's malloc_trim);
// elsewhere nothing. Takes about a millisecond per hundred megabytes of heap and briefly locks
// each arena: for after a large release, not for every request. Thread-safe.
void ReturnFreedMemory();

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_MEMORY_RETURN_H_
