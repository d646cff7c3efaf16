#include "gpu/shared_flags.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::gpu {
namespace {

// The words live in a MAP_SHARED mapping, so the futex must be the shared (non-private) kind:
// waiter and waker are usually different processes.
long Futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

}  // namespace

absl::Status SharedFlagArray::Check(uint32_t index) const {
  if (index >= count_) {
    return absl::OutOfRangeError(absl::StrCat("flag index ", index, " >= ", count_));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> SharedFlagArray::Load(uint32_t index) const {
  PSWITCH_RETURN_IF_ERROR(Check(index));
  return Word(index).load(std::memory_order_acquire);
}

absl::Status SharedFlagArray::Store(uint32_t index, uint32_t value) {
  PSWITCH_RETURN_IF_ERROR(Check(index));
  // Release pairs with the waiter's acquire: bytes written before the store are visible.
  Word(index).store(value, std::memory_order_release);
  Futex(&words_[index], FUTEX_WAKE, INT_MAX, nullptr);
  return absl::OkStatus();
}

absl::Status SharedFlagArray::Advance(uint32_t index, uint32_t value) {
  PSWITCH_RETURN_IF_ERROR(Check(index));
  uint32_t seen = Word(index).load(std::memory_order_acquire);
  // A locked compare-exchange is atomic against device (DMA) writes to the same word too.
  while (!EpochReached(seen, value)) {
    if (Word(index).compare_exchange_weak(seen, value, std::memory_order_acq_rel)) {
      Futex(&words_[index], FUTEX_WAKE, INT_MAX, nullptr);
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> SharedFlagArray::WaitAtLeast(uint32_t index, uint32_t target,
                                                      absl::Duration timeout) const {
  PSWITCH_RETURN_IF_ERROR(Check(index));
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    uint32_t seen = Word(index).load(std::memory_order_acquire);
    if (EpochReached(seen, target)) return seen;
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("flag ", index, " still at ", seen,
                                                      " waiting for ", target, " after ",
                                                      absl::FormatDuration(timeout)));
    }
    if (device_writes_) left = std::min(left, kDevicePollInterval);
    timespec ts = absl::ToTimespec(left);
    // Sleeps only while the word still holds `seen`; a store in between returns EAGAIN.
    if (Futex(&words_[index], FUTEX_WAIT, seen, &ts) != 0 && errno != EAGAIN && errno != EINTR &&
        errno != ETIMEDOUT) {
      return ErrnoStatus("futex wait");
    }
  }
}

}  // namespace pswitch::gpu
