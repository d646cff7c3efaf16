#include "dataplane/guarded_copy.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "dataplane/stream_copy.h"

namespace pswitch::dataplane {
namespace {

// One thread's guard. Initial-exec TLS: reading it from the signal handler must not allocate
// (a dynamic TLS block can be created lazily by __tls_get_addr, which is not signal-safe).
struct CopyGuard {
  sigjmp_buf resume;
  volatile sig_atomic_t armed = 0;
  uintptr_t src_begin = 0, src_end = 0;
  uintptr_t dst_begin = 0, dst_end = 0;
  // What the handler saw, read after the jump.
  volatile sig_atomic_t signal = 0;
  uintptr_t fault_address = 0;
};
__attribute__((tls_model("initial-exec"))) thread_local CopyGuard guard;

// The handlers that were installed before ours, written once before ours is installed and only
// read afterwards.
struct sigaction previous_bus;
struct sigaction previous_segv;

bool Inside(uintptr_t address, uintptr_t begin, uintptr_t end) {
  return address >= begin && address < end;
}

// Hands a fault that is not ours to the handler before us, or to the default action.
void Chain(int signal, siginfo_t* info, void* context) {
  const struct sigaction& previous = signal == SIGBUS ? previous_bus : previous_segv;
  if ((previous.sa_flags & SA_SIGINFO) != 0) {
    if (previous.sa_sigaction != nullptr) {
      previous.sa_sigaction(signal, info, context);
      return;
    }
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal);
    return;
  }
  // The default action (an ignored synchronous fault is fatal all the same): with the default
  // disposition back, returning re-executes the faulting instruction, which kills the process
  // with the usual core dump. A signal someone sent (kill) does not recur by itself: re-raise it.
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  ::sigaction(signal, &fallback, nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(signal);
}

void OnFault(int signal, siginfo_t* info, void* context) {
  CopyGuard& g = guard;
  if (g.armed != 0 && info != nullptr && info->si_code > 0) {
    const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
    if (Inside(address, g.src_begin, g.src_end) || Inside(address, g.dst_begin, g.dst_end)) {
      g.armed = 0;
      g.signal = signal;
      g.fault_address = address;
      siglongjmp(g.resume, 1);
    }
  }
  Chain(signal, info, context);
}

void Install() {
  struct sigaction ours {};
  ours.sa_sigaction = OnFault;
  // SA_ONSTACK: a handler stack someone set up (a stack overflow's SIGSEGV) is used for the
  // faults we chain too.
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  // Read the previous handlers before ours can run, so Chain never sees a half-written one.
  ::sigaction(SIGBUS, nullptr, &previous_bus);
  ::sigaction(SIGSEGV, nullptr, &previous_segv);
  ::sigaction(SIGBUS, &ours, nullptr);
  ::sigaction(SIGSEGV, &ours, nullptr);
}

}  // namespace

void InstallCopyFaultHandler() {
  static std::once_flag once;
  std::call_once(once, Install);
}

absl::Status GuardedCopy(void* dst, const void* src, size_t bytes, absl::string_view what) {
  if (bytes == 0) return absl::OkStatus();
  InstallCopyFaultHandler();
  CopyGuard& g = guard;
  const auto src_begin = reinterpret_cast<uintptr_t>(src);
  const auto dst_begin = reinterpret_cast<uintptr_t>(dst);
  g.src_begin = src_begin;
  g.src_end = src_begin + bytes;
  g.dst_begin = dst_begin;
  g.dst_end = dst_begin + bytes;
  // savemask = 1: the handler runs with the signal blocked, and a jump that left it blocked
  // would make the next fault of this kind kill the process outright.
  if (sigsetjmp(g.resume, 1) != 0) {
    // The abandoned copy's streaming stores are ordered before whatever this thread does next.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    // Only `g` (thread-local, not a register) and the unmodified arguments are read here.
    const bool source = Inside(g.fault_address, src_begin, src_begin + bytes);
    const uintptr_t at = g.fault_address - (source ? src_begin : dst_begin);
    return absl::DataLossError(absl::StrCat(what, ": ", g.signal == SIGBUS ? "SIGBUS" : "SIGSEGV",
                                            source ? " reading it" : " writing into it",
                                            " at byte ", at, " of a ", bytes,
                                            "-byte copy (the memory file shrank under it?)"));
  }
  // The compiler must not move the copy's loads and stores out of the armed window.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  g.armed = 1;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  StreamCopy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  g.armed = 0;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  return absl::OkStatus();
}

}  // namespace pswitch::dataplane
