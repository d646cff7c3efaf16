// The bell of a fill run that lives across bubbles (issue 30 item 1): one page of shared memory
// between pswitchd and the worker that keeps a fill job resident. pswitchd opens a bubble by
// writing its end and ringing (a futex wake on `seq`); the worker, waiting on `seq` between
// bubbles, runs steps while they fit and writes back what it did. No message crosses at a
// bubble's start, and the run does not end at a bubble's end: pswitchd still decides which job
// runs where (it stops the run through the bell and the usual Stop).
//
// pswitchd owns the page (a sealed memfd, lent to the worker like a transfer region). Its half
// is written only by pswitchd; the worker's half is the worker's word, which pswitchd reads as
// hostile input (clamped, never trusted as a bound).
#ifndef PSWITCH_FILL_BELL_LAYOUT_H_
#define PSWITCH_FILL_BELL_LAYOUT_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>

#include "absl/time/time.h"

namespace pswitch::fill {

struct BellLayout {
  // pswitchd's half.
  std::atomic<uint32_t> seq;   // futex word: +1 at every open, close and stop
  std::atomic<uint32_t> stop;  // set once: the run ends (pswitchd moved the job, cancelled it)
  std::atomic<int64_t> bubble_end_ns;  // CLOCK_MONOTONIC end of the bubble open now (past: closed)
  std::atomic<int64_t> cut_at_ns;      // a step still running here is cut at a layer boundary
  // The worker's half.
  std::atomic<uint32_t> stepping;  // 1 while a step runs
  std::atomic<uint32_t> padding;
  std::atomic<int64_t> last_step_start_ns;  // when the last step began
  std::atomic<int64_t> idle_since_ns;       // when the last step ended (or was cut)
  std::atomic<uint64_t> steps;              // steps this run completed
  std::atomic<int64_t> step_ns;             // their time, together
  std::atomic<uint64_t> iterations_done;    // the job's steps done, this run's included
  std::atomic<uint64_t> overruns;           // steps cut at a bubble's end
  std::atomic<int64_t> overrun_ns;          // the last cut step's time so far
  std::atomic<uint64_t> late_starts;        // steps begun with no bubble open (ignoring the bell)
  std::atomic<uint64_t> parts;              // parts of split steps done (progress within a step)
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);
inline constexpr size_t kBellBytes = 4096;
static_assert(sizeof(BellLayout) <= kBellBytes);

// Futexes on a shared mapping (not FUTEX_PRIVATE: the waker is another process). std::atomic's
// wait is process-private in libstdc++ and has no timeout, hence the system call.
inline void BellWait(const BellLayout& bell, uint32_t seen, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  // Spurious wakes, EAGAIN (it changed already) and EINTR all return to the caller's check.
  ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&bell.seq), FUTEX_WAIT, seen, &ts, nullptr,
            0);
}
inline void BellWakeAll(BellLayout& bell) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell.seq), FUTEX_WAKE, INT32_MAX, nullptr,
            nullptr, 0);
}

}  // namespace pswitch::fill

#endif  // PSWITCH_FILL_BELL_LAYOUT_H_
