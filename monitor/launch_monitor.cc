// libpswitch_monitor.so: counts the kernel launches of the process it is preloaded into
// (LD_PRELOAD), a main training job that calls nothing of pswitch, into its GPU's activity page
// (PSWITCH_ACTIVITY_FILE, gpu/activity_page_layout.h), from which pswitchd finds the job's bubbles
// (--detect-bubbles; issue 30 item 3, SpecInF's monitoring library).
//   - Interposed by name: cudaLaunchKernel, cudaLaunchKernelExC, cudaLaunchCooperativeKernel,
//     cudaGraphLaunch, cuLaunchKernel, cuLaunchKernelEx, cuGraphLaunch. Each adds one to the
//     page's launch count and calls the real function (resolved on its first call: libcudart may
//     be loaded long after this library). A graph launch counts once, however many kernels it
//     runs.
//   - Driver entry points looked up at run time. A CUDA runtime linked statically (cuBLAS's,
//     cuDNN's) finds the driver with dlopen("libcuda.so.1") and dlsym(handle,
//     "cuGetProcAddress_v2"), then takes every driver entry point from cuGetProcAddress, and
//     PyTorch's own kernels do not reach cudaLaunchKernel either: on the H200 (torch 2.11,
//     libcudart.so.13) the names above counted 310 of a GPT-2 stage's 260,000 launches. So dlsym
//     is interposed too: a lookup of cuGetProcAddress(_v2), or of a counted driver entry point,
//     in a library's own handle gets a counting wrapper of what it found, and the entry points
//     cuGetProcAddress gives are wrapped the same way (DriverVia). Every other dlsym goes on to
//     glibc's by a tail jump, so glibc still sees its caller's return address (RTLD_NEXT keeps
//     its meaning). x86-64 only; elsewhere only the names above are counted.
//   - Synchronisations: cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize,
//     cudaMemcpy and cudaMemcpyAsync (a copy waits for the work before it, and one to or from
//     pageable memory blocks until done), cuCtxSynchronize, cuStreamSynchronize and
//     cuEventSynchronize, and the driver's copies looked up at run time. A job waiting in one waits
//     for its device, which is busy though nothing is launched (a stage that queued a whole pass
//     and waits for it): each raises the page's count of holds under way while it waits, and counts
//     a launch when it waited kSyncBusyNs or more (one that returns at once waited for nothing).
//     The cost: a job whose host waits in a synchronisation through its bubbles (a stream waiting
//     on another GPU's data) has those bubbles hidden; a false bubble would slow the job, a hidden
//     one only leaves it unfilled (such a job can call the bubble instruction instead). A runtime
//     linked dynamically is counted twice (its call and the driver's), which changes nothing: a
//     window is busy or not.
//   - On the launch path: an atomic load, a relaxed atomic add on a mapped page, the call (and
//     around a synchronisation two clock reads, vDSO calls). No allocation, no lock, no system
//     call (but the one-time lookup of each function).
//   - Without the variable, or with a file that cannot be opened or mapped, nothing is counted
//     and every call passes through unchanged: the job behaves as without the library, and
//     pswitchd being absent or restarting changes nothing for it.
// Links nothing of pswitch or CUDA; the signatures below are the CUDA 12 ones (struct and handle
// types by their layout).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "gpu/activity_page_layout.h"

namespace {

using pswitch::gpu::ActivityPageLayout;

struct Dim3 {
  unsigned x, y, z;
};
using CudaError = int;  // cudaError_t
using CuResult = int;   // CUresult
constexpr CudaError kCudaErrorUnknown = 999;
constexpr CuResult kCuErrorNotFound = 500;

std::atomic<ActivityPageLayout*> page{nullptr};

void Count() {
  if (ActivityPageLayout* p = page.load(std::memory_order_acquire)) {
    p->launches.fetch_add(1, std::memory_order_relaxed);
  }
}

// A synchronisation that waited this long had the device busy meanwhile.
constexpr int64_t kSyncBusyNs = 50'000;

int64_t NowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no system call
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Counts a synchronisation for as long as it lasts (see the file's comment).
class SyncHold {
 public:
  SyncHold() : page_(page.load(std::memory_order_acquire)) {
    if (page_ == nullptr) return;
    page_->busy.fetch_add(1, std::memory_order_relaxed);
    start_ns_ = NowNs();
  }
  ~SyncHold() {
    if (page_ == nullptr) return;
    if (NowNs() - start_ns_ >= kSyncBusyNs) page_->launches.fetch_add(1, std::memory_order_relaxed);
    page_->busy.fetch_sub(1, std::memory_order_relaxed);
  }
  SyncHold(const SyncHold&) = delete;
  SyncHold& operator=(const SyncHold&) = delete;

 private:
  ActivityPageLayout* const page_;
  int64_t start_ns_ = 0;
};

// glibc's dlsym: this library's own lookups bypass its interposed one (the wrappers it hands out
// are for the job's).
using Dlsym = void* (*)(void*, const char*);
Dlsym GlibcDlsym();

// The real `name`, looked up once: next in the global scope, or else in the CUDA library
// already loaded (one a Python extension loaded with RTLD_LOCAL is not in the global scope).
template <typename Fn>
Fn Real(std::atomic<Fn>& slot, const char* name) {
  Fn fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    const Dlsym lookup = GlibcDlsym();
    void* found = lookup != nullptr ? lookup(RTLD_NEXT, name) : nullptr;
    static constexpr const char* kDriver[] = {"libcuda.so.1", nullptr};
    static constexpr const char* kRuntime[] = {"libcudart.so.13", "libcudart.so.12",
                                               "libcudart.so.11.0", nullptr};
    const bool driver = name[0] == 'c' && name[1] == 'u' && name[2] != 'd';
    for (const char* const* library = driver ? kDriver : kRuntime; *library != nullptr; ++library) {
      if (found != nullptr || lookup == nullptr) break;
      if (void* handle = ::dlopen(*library, RTLD_LAZY | RTLD_NOLOAD)) {
        found = lookup(handle, name);
        ::dlclose(handle);  // RTLD_NOLOAD took a reference of a library loaded anyway
      }
    }
    fn = reinterpret_cast<Fn>(found);
    slot.store(fn, std::memory_order_release);
  }
  return fn;
}

// The real `name` called with `args`, counted as a launch first; `not_found` when there is none.
template <typename R, typename... Params, typename... Args>
R Launch(std::atomic<R (*)(Params...)>& real, const char* name, R not_found, Args... args) {
  Count();
  R (*fn)(Params...) = Real(real, name);
  return fn == nullptr ? not_found : fn(args...);
}

// The real synchronisation `name` called with `args`, held as one while it waits (SyncHold).
template <typename R, typename... Params, typename... Args>
R Synchronise(std::atomic<R (*)(Params...)>& real, const char* name, R not_found, Args... args) {
  R (*fn)(Params...) = Real(real, name);
  if (fn == nullptr) return not_found;
  SyncHold hold;
  return fn(args...);
}

// Driver entry points handed out by cuGetProcAddress or a handle's dlsym (the file's comment).

// Those counted. A copy waits for the work queued before it, and one to or from pageable memory
// blocks the host until it is done: PyTorch's `tensor.to(kCPU)` waits inside cudaMemcpyAsync, not
// in a synchronisation (on the H200 a GPT-2 stage's 5 ms waits for its activations' copy out were
// taken for bubbles), so copies are holds like synchronisations.
enum Entry : int {
  kLaunchKernel,
  kLaunchKernelEx,
  kLaunchCooperativeKernel,
  kGraphLaunch,
  kStreamSynchronize,
  kEventSynchronize,
  kCtxSynchronize,
  kMemcpy,
  kMemcpyAsync,
  kMemcpyDtoH,
  kMemcpyDtoHAsync,
  kMemcpyHtoD,
  kMemcpyHtoDAsync,
  kEntries
};
struct EntryNames {
  const char* name;      // as cuGetProcAddress is asked for it
  const char* exported;  // libcuda's symbol of the ABI below
  int since;  // the CUDA version (1000 x major + 10 x minor) from which that ABI is given
  bool launch;  // counted as a launch; else a hold while it waits (SyncHold)
};
// The copies' ABI with 64-bit sizes is their _v2 (CUDA 3.2); the others have one signature in
// every version, but cuCtxSynchronize: CUDA 12.9's _v2 takes a context, so its wrapper passes one
// register on (CtxSynchronizeFn).
constexpr EntryNames kEntryNames[kEntries] = {
    {"cuLaunchKernel", "cuLaunchKernel", 0, true},
    {"cuLaunchKernelEx", "cuLaunchKernelEx", 0, true},
    {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 0, true},
    {"cuGraphLaunch", "cuGraphLaunch", 0, true},
    {"cuStreamSynchronize", "cuStreamSynchronize", 0, false},
    {"cuEventSynchronize", "cuEventSynchronize", 0, false},
    {"cuCtxSynchronize", "cuCtxSynchronize", 0, false},
    {"cuMemcpy", "cuMemcpy", 0, false},
    {"cuMemcpyAsync", "cuMemcpyAsync", 0, false},
    {"cuMemcpyDtoH", "cuMemcpyDtoH_v2", 3020, false},
    {"cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", 3020, false},
    {"cuMemcpyHtoD", "cuMemcpyHtoD_v2", 3020, false},
    {"cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", 3020, false},
};
// Distinct real functions one entry may be handed out as (the legacy and the per-thread default
// stream's, for each ABI version asked): each gets its own wrapper. A fifth is passed on
// uncounted.
constexpr int kVariants = 4;
std::atomic<void*> variant_real[kEntries][kVariants];

template <Entry E, int V, typename Signature>
struct DriverVia;
template <Entry E, int V, typename... Params>
struct DriverVia<E, V, CuResult(Params...)> {
  static CuResult Real(Params... args) {
    auto* fn = reinterpret_cast<CuResult (*)(Params...)>(
        variant_real[E][V].load(std::memory_order_acquire));
    return fn(args...);
  }
  static CuResult Launch(Params... args) {
    Count();
    return Real(args...);
  }
  static CuResult Synchronise(Params... args) {
    SyncHold hold;
    return Real(args...);
  }
};

using LaunchKernelFn = CuResult(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                unsigned, void*, void**, void**);
using LaunchKernelExFn = CuResult(const void*, void*, void**, void**);
using LaunchCooperativeKernelFn = CuResult(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                                           unsigned, unsigned, void*, void**);
using OneHandleFn = CuResult(void*);
// cuCtxSynchronize() and cuCtxSynchronize_v2(CUcontext) alike: a wrapper that passes its one
// integer register on serves both on x86-64, where the first ignores it (this path is x86-64's).
using CtxSynchronizeFn = CuResult(void*);
using MemcpyFn = CuResult(uint64_t, uint64_t, size_t);  // CUdeviceptr: 64 bits
using MemcpyAsyncFn = CuResult(uint64_t, uint64_t, size_t, void*);
using MemcpyDtoHFn = CuResult(void*, uint64_t, size_t);
using MemcpyDtoHAsyncFn = CuResult(void*, uint64_t, size_t, void*);
using MemcpyHtoDFn = CuResult(uint64_t, const void*, size_t);
using MemcpyHtoDAsyncFn = CuResult(uint64_t, const void*, size_t, void*);

template <Entry E, typename Signature, size_t... V>
void* ViaOf(int variant, std::index_sequence<V...>) {
  void* const vias[] = {kEntryNames[E].launch
                            ? reinterpret_cast<void*>(&DriverVia<E, V, Signature>::Launch)
                            : reinterpret_cast<void*>(&DriverVia<E, V, Signature>::Synchronise)...};
  return vias[variant];
}

// The counting wrapper of variant `variant` of `entry`.
void* Via(Entry entry, int variant) {
  constexpr auto kAll = std::make_index_sequence<kVariants>();
  switch (entry) {
    case kLaunchKernel:
      return ViaOf<kLaunchKernel, LaunchKernelFn>(variant, kAll);
    case kLaunchKernelEx:
      return ViaOf<kLaunchKernelEx, LaunchKernelExFn>(variant, kAll);
    case kLaunchCooperativeKernel:
      return ViaOf<kLaunchCooperativeKernel, LaunchCooperativeKernelFn>(variant, kAll);
    case kGraphLaunch:
      return ViaOf<kGraphLaunch, CuResult(void*, void*)>(variant, kAll);
    case kStreamSynchronize:
      return ViaOf<kStreamSynchronize, OneHandleFn>(variant, kAll);
    case kEventSynchronize:
      return ViaOf<kEventSynchronize, OneHandleFn>(variant, kAll);
    case kCtxSynchronize:
      return ViaOf<kCtxSynchronize, CtxSynchronizeFn>(variant, kAll);
    case kMemcpy:
      return ViaOf<kMemcpy, MemcpyFn>(variant, kAll);
    case kMemcpyAsync:
      return ViaOf<kMemcpyAsync, MemcpyAsyncFn>(variant, kAll);
    case kMemcpyDtoH:
      return ViaOf<kMemcpyDtoH, MemcpyDtoHFn>(variant, kAll);
    case kMemcpyDtoHAsync:
      return ViaOf<kMemcpyDtoHAsync, MemcpyDtoHAsyncFn>(variant, kAll);
    case kMemcpyHtoD:
      return ViaOf<kMemcpyHtoD, MemcpyHtoDFn>(variant, kAll);
    case kMemcpyHtoDAsync:
      return ViaOf<kMemcpyHtoDAsync, MemcpyHtoDAsyncFn>(variant, kAll);
    case kEntries:
      break;
  }
  return nullptr;
}

// Whether `fn` is one of this library's own exports (a handle whose scope holds it, the
// program's, finds them): counted already. Compared by address, without dladdr's loader lock.
bool OwnExport(void* fn);

// The slot of `slots` that holds `real`, claimed for it if need be; -1 when all hold others.
int Claim(std::atomic<void*> (&slots)[kVariants], void* real) {
  for (int v = 0; v < kVariants; ++v) {
    void* expected = nullptr;
    if (slots[v].compare_exchange_strong(expected, real, std::memory_order_acq_rel) ||
        expected == real) {
      return v;
    }
  }
  return -1;
}

// cuGetProcAddress of either ABI, each real one (the driver's, an alias of it, a profiler's) with
// its own wrapper: what it gives is wrapped in turn.
void* Wrap(const char* symbol, void* real, int version);
std::atomic<void*> get_proc_address_v2_real[kVariants];
std::atomic<void*> get_proc_address_real[kVariants];

template <int V>
CuResult GetProcAddressV2Via(const char* symbol, void** pfn, int version, uint64_t flags,
                             int* status) {
  using Fn = CuResult(const char*, void**, int, uint64_t, int*);
  auto* real = reinterpret_cast<Fn*>(get_proc_address_v2_real[V].load(std::memory_order_acquire));
  const CuResult result = real(symbol, pfn, version, flags, status);
  if (result == 0 && pfn != nullptr) *pfn = Wrap(symbol, *pfn, version);
  return result;
}

template <int V>
CuResult GetProcAddressVia(const char* symbol, void** pfn, int version, uint64_t flags) {
  using Fn = CuResult(const char*, void**, int, uint64_t);
  auto* real = reinterpret_cast<Fn*>(get_proc_address_real[V].load(std::memory_order_acquire));
  const CuResult result = real(symbol, pfn, version, flags);
  if (result == 0 && pfn != nullptr) *pfn = Wrap(symbol, *pfn, version);
  return result;
}

template <size_t... V>
void* GetProcAddressViaOf(bool v2, int variant, std::index_sequence<V...>) {
  void* const vias[] = {v2 ? reinterpret_cast<void*>(&GetProcAddressV2Via<V>)
                           : reinterpret_cast<void*>(&GetProcAddressVia<V>)...};
  return vias[variant];
}

// Asked of dlsym rather than of cuGetProcAddress (Wrap's `version`).
constexpr int kExportedName = -1;

// What to hand the job for `real`, found as `symbol` (given by cuGetProcAddress for `version`, or
// kExportedName): a counting wrapper of it, or `real` itself when this library counts nothing of
// it (or has no page to count into).
void* Wrap(const char* symbol, void* real, int version) {
  if (real == nullptr || symbol == nullptr || page.load(std::memory_order_acquire) == nullptr ||
      std::strncmp(symbol, "cu", 2) != 0) {
    return real;
  }
  if (OwnExport(real)) return real;
  const bool exported = version == kExportedName;
  // cuGetProcAddress's ABI is the one asked for: by name, or from CUDA 12.0 on (the _v2, with
  // its status) when it is asked for itself.
  const bool v2 = std::strcmp(symbol, "cuGetProcAddress_v2") == 0;
  if (v2 || std::strcmp(symbol, "cuGetProcAddress") == 0) {
    const bool with_status = v2 || (!exported && version >= 12000);
    const int variant = Claim(with_status ? get_proc_address_v2_real : get_proc_address_real, real);
    return variant < 0
               ? real
               : GetProcAddressViaOf(with_status, variant, std::make_index_sequence<kVariants>());
  }
  for (int e = 0; e < kEntries; ++e) {
    const EntryNames& names = kEntryNames[e];
    if (std::strcmp(symbol, exported ? names.exported : names.name) != 0) continue;
    if (!exported && version < names.since) return real;  // an older ABI
    const int variant = Claim(variant_real[e], real);
    return variant < 0 ? real : Via(static_cast<Entry>(e), variant);
  }
  return real;
}

__attribute__((constructor)) void OpenPage() {
  const char* path = std::getenv("PSWITCH_ACTIVITY_FILE");
  if (path == nullptr || *path == '\0') return;
  // Anything but a page of this user's that only it may write is left alone, and nothing is
  // counted (MapActivityPageForWriting says why).
  ActivityPageLayout* p = nullptr;
  if (pswitch::gpu::MapActivityPageForWriting(path, &p) != pswitch::gpu::MapActivity::kMapped) {
    return;
  }
  page.store(p, std::memory_order_release);
}

}  // namespace

extern "C" {

// Each exported with the CUDA 12 signature; `real` the next definition, looked up once.
#define PSWITCH_EXPORT __attribute__((visibility("default")))

PSWITCH_EXPORT CudaError cudaLaunchKernel(const void* func, Dim3 grid, Dim3 block, void** args,
                                          size_t shared, void* stream) {
  static std::atomic<CudaError (*)(const void*, Dim3, Dim3, void**, size_t, void*)> real{nullptr};
  return Launch(real, "cudaLaunchKernel", kCudaErrorUnknown, func, grid, block, args, shared,
                stream);
}

PSWITCH_EXPORT CudaError cudaLaunchKernelExC(const void* config, const void* func, void** args) {
  static std::atomic<CudaError (*)(const void*, const void*, void**)> real{nullptr};
  return Launch(real, "cudaLaunchKernelExC", kCudaErrorUnknown, config, func, args);
}

PSWITCH_EXPORT CudaError cudaLaunchCooperativeKernel(const void* func, Dim3 grid, Dim3 block,
                                                     void** args, size_t shared, void* stream) {
  static std::atomic<CudaError (*)(const void*, Dim3, Dim3, void**, size_t, void*)> real{nullptr};
  return Launch(real, "cudaLaunchCooperativeKernel", kCudaErrorUnknown, func, grid, block, args,
                shared, stream);
}

PSWITCH_EXPORT CudaError cudaGraphLaunch(void* exec, void* stream) {
  static std::atomic<CudaError (*)(void*, void*)> real{nullptr};
  return Launch(real, "cudaGraphLaunch", kCudaErrorUnknown, exec, stream);
}

PSWITCH_EXPORT CuResult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned shared, void* stream,
                                       void** params, void** extra) {
  static std::atomic<CuResult (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, void*, void**, void**)>
      real{nullptr};
  return Launch(real, "cuLaunchKernel", kCuErrorNotFound, f, gx, gy, gz, bx, by, bz, shared, stream,
                params, extra);
}

PSWITCH_EXPORT CuResult cuLaunchKernelEx(const void* config, void* f, void** params, void** extra) {
  static std::atomic<CuResult (*)(const void*, void*, void**, void**)> real{nullptr};
  return Launch(real, "cuLaunchKernelEx", kCuErrorNotFound, config, f, params, extra);
}

PSWITCH_EXPORT CuResult cuGraphLaunch(void* exec, void* stream) {
  static std::atomic<CuResult (*)(void*, void*)> real{nullptr};
  return Launch(real, "cuGraphLaunch", kCuErrorNotFound, exec, stream);
}

// Synchronisations.

PSWITCH_EXPORT CudaError cudaDeviceSynchronize() {
  static std::atomic<CudaError (*)()> real{nullptr};
  return Synchronise(real, "cudaDeviceSynchronize", kCudaErrorUnknown);
}

PSWITCH_EXPORT CudaError cudaStreamSynchronize(void* stream) {
  static std::atomic<CudaError (*)(void*)> real{nullptr};
  return Synchronise(real, "cudaStreamSynchronize", kCudaErrorUnknown, stream);
}

PSWITCH_EXPORT CudaError cudaEventSynchronize(void* event) {
  static std::atomic<CudaError (*)(void*)> real{nullptr};
  return Synchronise(real, "cudaEventSynchronize", kCudaErrorUnknown, event);
}

PSWITCH_EXPORT CudaError cudaMemcpy(void* dst, const void* src, size_t count, int kind) {
  static std::atomic<CudaError (*)(void*, const void*, size_t, int)> real{nullptr};
  return Synchronise(real, "cudaMemcpy", kCudaErrorUnknown, dst, src, count, kind);
}

PSWITCH_EXPORT CudaError cudaMemcpyAsync(void* dst, const void* src, size_t count, int kind,
                                         void* stream) {
  static std::atomic<CudaError (*)(void*, const void*, size_t, int, void*)> real{nullptr};
  return Synchronise(real, "cudaMemcpyAsync", kCudaErrorUnknown, dst, src, count, kind, stream);
}

PSWITCH_EXPORT CuResult cuCtxSynchronize() {
  static std::atomic<CuResult (*)()> real{nullptr};
  return Synchronise(real, "cuCtxSynchronize", kCuErrorNotFound);
}

PSWITCH_EXPORT CuResult cuStreamSynchronize(void* stream) {
  static std::atomic<CuResult (*)(void*)> real{nullptr};
  return Synchronise(real, "cuStreamSynchronize", kCuErrorNotFound, stream);
}

PSWITCH_EXPORT CuResult cuEventSynchronize(void* event) {
  static std::atomic<CuResult (*)(void*)> real{nullptr};
  return Synchronise(real, "cuEventSynchronize", kCuErrorNotFound, event);
}

#undef PSWITCH_EXPORT

}  // extern "C"

// dlsym: a lookup the job makes in a library's own handle of cuGetProcAddress(_v2) or of a counted
// driver entry point returns a counting wrapper (Wrap); every other one is glibc's, reached by a
// tail jump so that glibc sees the job's return address, which RTLD_NEXT is relative to.
extern "C" {
__attribute__((visibility("hidden"))) void* pswitch_monitor_glibc_dlsym = nullptr;

// The wrapper for `name` in `handle`, or nullptr to have glibc's dlsym answer.
__attribute__((visibility("hidden"), used)) void* pswitch_monitor_dlsym_hook(void* handle,
                                                                             const char* name) {
  const Dlsym glibc = GlibcDlsym();  // sets pswitch_monitor_glibc_dlsym for the tail jump
  // RTLD_DEFAULT finds this library's own exports first; RTLD_NEXT is relative to the caller,
  // which only the tail jump keeps.
  if (glibc == nullptr || name == nullptr || name[0] != 'c' || name[1] != 'u' ||
      handle == RTLD_DEFAULT || handle == RTLD_NEXT ||
      page.load(std::memory_order_acquire) == nullptr) {
    return nullptr;
  }
  void* real = glibc(handle, name);
  if (real == nullptr) return nullptr;
  void* wrapped = Wrap(name, real, kExportedName);
  return wrapped != real ? wrapped : nullptr;
}
}  // extern "C"

namespace {
Dlsym GlibcDlsym() {
#if defined(__x86_64__)
  void* fn = __atomic_load_n(&pswitch_monitor_glibc_dlsym, __ATOMIC_ACQUIRE);
  if (fn == nullptr) {
    // dlvsym is not interposed; RTLD_NEXT from here is glibc's. Versions: glibc 2.34 moved
    // dlsym into libc.so.6, and before that x86-64's was libdl's GLIBC_2.2.5.
    fn = ::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (fn == nullptr) fn = ::dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    __atomic_store_n(&pswitch_monitor_glibc_dlsym, fn, __ATOMIC_RELEASE);
  }
  return reinterpret_cast<Dlsym>(fn);
#else
  return &::dlsym;  // not interposed here (no thunk)
#endif
}

bool OwnExport(void* fn) {
  const void* const own[] = {
      reinterpret_cast<void*>(&cuLaunchKernel),      reinterpret_cast<void*>(&cuLaunchKernelEx),
      reinterpret_cast<void*>(&cuGraphLaunch),       reinterpret_cast<void*>(&cuCtxSynchronize),
      reinterpret_cast<void*>(&cuStreamSynchronize), reinterpret_cast<void*>(&cuEventSynchronize)};
  for (const void* mine : own) {
    if (fn == mine) return true;
  }
  return false;
}
}  // namespace

#if defined(__x86_64__)
// dlsym(handle, name): the hook's answer when it has one, else a tail jump to glibc's (or NULL,
// "not found", should glibc have none) with the caller's return address still on the stack.
asm(R"(
  .pushsection .text
  .globl dlsym
  .type dlsym, @function
  .p2align 4
dlsym:
  .cfi_startproc
  endbr64
  pushq %rdi
  .cfi_adjust_cfa_offset 8
  pushq %rsi
  .cfi_adjust_cfa_offset 8
  subq $8, %rsp
  .cfi_adjust_cfa_offset 8
  call pswitch_monitor_dlsym_hook
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %rsi
  .cfi_adjust_cfa_offset -8
  popq %rdi
  .cfi_adjust_cfa_offset -8
  testq %rax, %rax
  jnz 1f
  movq pswitch_monitor_glibc_dlsym(%rip), %r11
  testq %r11, %r11
  jz 1f
  jmp *%r11
1:
  ret
  .cfi_endproc
  .size dlsym, .-dlsym
  .popsection
)");
#endif
