// libpswitch_monitor.so: counts the kernel launches of the process it is preloaded into
// (LD_PRELOAD), a main training job that calls nothing of pswitch, into its GPU's activity page
// (PSWITCH_ACTIVITY_FILE, gpu/activity_page_layout.h), from which pswitchd finds the job's bubbles
// (--detect-bubbles; issue 30 item 3, SpecInF's monitoring library).
//   - Interposed: cudaLaunchKernel, cudaLaunchKernelExC, cudaLaunchCooperativeKernel,
//     cudaGraphLaunch, cuLaunchKernel, cuLaunchKernelEx, cuGraphLaunch. Each adds one to the
//     page's launch count and calls the real function (dlsym(RTLD_NEXT), resolved on its first
//     call: libcudart may be loaded long after this library). A graph launch counts once, however
//     many kernels it runs; and launches the runtime makes through driver entry points it looked
//     up itself (cuGetProcAddress) are not seen: cudaLaunchKernel is what they come through.
//   - Synchronisations: cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize,
//     cudaMemcpy (it waits for the work before it), cuCtxSynchronize, cuStreamSynchronize and
//     cuEventSynchronize. A job waiting in one waits for its device, which is busy though
//     nothing is launched (a stage that queued a whole pass and waits for it): each raises the
//     page's count of holds under way while it waits, and counts a launch when it waited
//     kSyncBusyNs or more (one that returns at once waited for nothing). The cost: a job whose
//     host waits in a synchronisation through its bubbles (a stream waiting on another GPU's
//     data) has those bubbles hidden; a false bubble would slow the job, a hidden one only
//     leaves it unfilled (such a job can call the bubble instruction instead).
//   - On the launch path: an atomic load, a relaxed atomic add on a mapped page, the call (and
//     around a synchronisation two clock reads, vDSO calls). No allocation, no lock, no system
//     call (but the one-time dlsym of each function).
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

// The real `name`, looked up once: next in the global scope, or else in the CUDA library
// already loaded (one a Python extension loaded with RTLD_LOCAL is not in the global scope).
template <typename Fn>
Fn Real(std::atomic<Fn>& slot, const char* name) {
  Fn fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    void* found = ::dlsym(RTLD_NEXT, name);
    static constexpr const char* kDriver[] = {"libcuda.so.1", nullptr};
    static constexpr const char* kRuntime[] = {"libcudart.so.13", "libcudart.so.12",
                                               "libcudart.so.11.0", nullptr};
    const bool driver = name[0] == 'c' && name[1] == 'u' && name[2] != 'd';
    for (const char* const* library = driver ? kDriver : kRuntime; *library != nullptr; ++library) {
      if (found != nullptr) break;
      if (void* handle = ::dlopen(*library, RTLD_LAZY | RTLD_NOLOAD)) {
        found = ::dlsym(handle, name);
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
