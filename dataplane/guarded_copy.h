// A copy that survives the memory under it going away. A transfer region on a file that is not
// sealed against shrinking (Triton system shared memory, docs/dataplane.md) can be truncated by
// its owner at any moment; touching a mapped page past the new end raises SIGBUS, which would
// kill the worker and every task on it. GuardedCopy turns such a fault into a status for the one
// task that touched the region.
//
// Design note. One process-wide SIGBUS/SIGSEGV handler is installed on first use (sigaction,
// SA_SIGINFO). Each thread has a sigjmp_buf that is armed only for the duration of one copy
// (StreamCopy), together with the two address ranges of that copy. A fault on an armed thread
// whose address lies in one of those ranges jumps back (siglongjmp, restoring the signal mask)
// and the copy returns DataLoss; any other fault — another thread's, an address outside the
// copy, a copy not armed — is passed to whatever handler was installed before ours (or the
// default action, which kills the process as if we were not there). The copy holds no lock and
// allocates nothing, so abandoning it half way leaves nothing inconsistent except the
// destination's bytes.
//
// Limits: a handler installed after ours for SIGBUS/SIGSEGV replaces it (nothing in pswitch
// does); faults inside the copy on memory other than the two ranges are not swallowed.
#ifndef PSWITCH_DATAPLANE_GUARDED_COPY_H_
#define PSWITCH_DATAPLANE_GUARDED_COPY_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pswitch::dataplane {

// Copies `bytes` from `src` to `dst` (which must not overlap). A SIGBUS or SIGSEGV on this thread
// at an address inside either range during the copy ends it with DataLoss naming `what` (e.g.
// "system shared memory region 7") and the side that faulted; `dst` then holds a partial copy.
// Thread-safe (each thread arms its own guard); not for use inside a signal handler.
absl::Status GuardedCopy(void* dst, const void* src, size_t bytes, absl::string_view what);

// Installs the process-wide fault handler now (GuardedCopy installs it on first use). Idempotent
// and thread-safe.
void InstallCopyFaultHandler();

}  // namespace pswitch::dataplane

#endif  // PSWITCH_DATAPLANE_GUARDED_COPY_H_
