// A stand-in for libcudart and libcuda in monitor_test: the CUDA launch and synchronisation entry
// points that libpswitch_monitor.so interposes, and the driver's cuGetProcAddress that hands
// them out, each counting its calls (and returning 0,
// success), so the test sees that every call reached the real function with its arguments. A
// synchronisation waits STUB_SYNC_US microseconds (default 0), as one waiting for a device would.
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace {
struct Dim3 {
  unsigned x, y, z;
};
std::atomic<int> calls{0};
std::atomic<unsigned> last_grid_x{0};
std::atomic<void*> last_context{nullptr};
int Synchronise() {
  const char* us = std::getenv("STUB_SYNC_US");
  // No sleep at all for 0: even a zero one lasts the timer slack (50 us).
  if (us != nullptr && std::atol(us) > 0) ::usleep(static_cast<useconds_t>(std::atol(us)));
  return ++calls, 0;
}
}  // namespace

extern "C" {
__attribute__((visibility("default"))) int stub_calls() { return calls.load(); }
__attribute__((visibility("default"))) unsigned stub_last_grid_x() { return last_grid_x.load(); }
__attribute__((visibility("default"))) void* stub_last_context() { return last_context.load(); }

__attribute__((visibility("default"))) int cudaLaunchKernel(const void*, Dim3 grid, Dim3, void**,
                                                            size_t, void*) {
  last_grid_x = grid.x;
  return ++calls, 0;
}
__attribute__((visibility("default"))) int cudaLaunchKernelExC(const void*, const void*, void**) {
  return ++calls, 0;
}
__attribute__((visibility("default"))) int cudaLaunchCooperativeKernel(const void*, Dim3 grid, Dim3,
                                                                       void**, size_t, void*) {
  last_grid_x = grid.x;
  return ++calls, 0;
}
__attribute__((visibility("default"))) int cudaGraphLaunch(void*, void*) { return ++calls, 0; }
__attribute__((visibility("default"))) int cuLaunchKernel(void*, unsigned gx, unsigned, unsigned,
                                                          unsigned, unsigned, unsigned, unsigned,
                                                          void*, void**, void**) {
  last_grid_x = gx;
  return ++calls, 0;
}
__attribute__((visibility("default"))) int cuLaunchKernel_ptsz(void*, unsigned gx, unsigned,
                                                               unsigned, unsigned, unsigned,
                                                               unsigned, unsigned, void*, void**,
                                                               void**) {
  last_grid_x = gx + 1000;  // told apart from the legacy stream's
  return ++calls, 0;
}
__attribute__((visibility("default"))) int cuLaunchCooperativeKernel(void*, unsigned gx, unsigned,
                                                                     unsigned, unsigned, unsigned,
                                                                     unsigned, unsigned, void*,
                                                                     void**) {
  last_grid_x = gx;
  return ++calls, 0;
}
__attribute__((visibility("default"))) int cuLaunchKernelEx(const void*, void*, void**, void**) {
  return ++calls, 0;
}
__attribute__((visibility("default"))) int cuGraphLaunch(void*, void*) { return ++calls, 0; }
__attribute__((visibility("default"))) int cudaDeviceSynchronize() { return Synchronise(); }
__attribute__((visibility("default"))) int cudaStreamSynchronize(void*) { return Synchronise(); }
__attribute__((visibility("default"))) int cudaEventSynchronize(void*) { return Synchronise(); }
__attribute__((visibility("default"))) int cudaMemcpy(void*, const void*, size_t, int) {
  return Synchronise();
}
__attribute__((visibility("default"))) int cudaMemcpyAsync(void*, const void*, size_t, int, void*) {
  return Synchronise();
}
__attribute__((visibility("default"))) int cuCtxSynchronize() { return Synchronise(); }
// CUDA 12.9's, given for CUDA 13 and later.
__attribute__((visibility("default"))) int cuCtxSynchronize_v2(void* context) {
  last_context = context;
  return Synchronise();
}
// The driver's copies: the _v2 ABI (64-bit sizes), and one of the CUDA 3.0 ABI's.
__attribute__((visibility("default"))) int cuMemcpy(unsigned long long, unsigned long long,
                                                    size_t) {
  return Synchronise();
}
__attribute__((visibility("default"))) int cuMemcpyAsync(unsigned long long, unsigned long long,
                                                         size_t, void*) {
  return Synchronise();
}
__attribute__((visibility("default"))) int cuMemcpyDtoH_v2(void*, unsigned long long, size_t) {
  return Synchronise();
}
__attribute__((visibility("default"))) int cuMemcpyDtoH(void*, unsigned, unsigned) {
  return Synchronise();
}
__attribute__((visibility("default"))) int cuMemcpyDtoHAsync_v2(void*, unsigned long long, size_t,
                                                                void*) {
  return Synchronise();
}
__attribute__((visibility("default"))) int cuMemcpyHtoD_v2(unsigned long long, const void*,
                                                           size_t) {
  return Synchronise();
}
__attribute__((visibility("default"))) int cuMemcpyHtoDAsync_v2(unsigned long long, const void*,
                                                                size_t, void*) {
  return Synchronise();
}
__attribute__((visibility("default"))) int cuStreamSynchronize(void*) { return Synchronise(); }
__attribute__((visibility("default"))) int cuEventSynchronize(void*) { return Synchronise(); }
}

// The driver's lookup, as the CUDA runtime uses it: flags 2 (per-thread default stream) gives
// cuLaunchKernel's _ptsz variant; "cuGetProcAddress" gives the ABI the version asks for, the _v2
// as a function of its own (as a driver's internal alias or a profiler's would be).
extern "C" {
int cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags,
                        int* status);
__attribute__((visibility("default"))) int cuGetProcAddress(const char* symbol, void** pfn,
                                                            int version, unsigned long long flags);
static int GetProcAddressAlias(const char* symbol, void** pfn, int version,
                               unsigned long long flags, int* status) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, status);
}
__attribute__((visibility("default"))) int cuGetProcAddress_v2(const char* symbol, void** pfn,
                                                               int version,
                                                               unsigned long long flags,
                                                               int* status) {
  struct Known {
    const char* name;
    void* fn;
  };
  const Known known[] = {
      {"cuLaunchKernel",
       reinterpret_cast<void*>(flags == 2 ? &cuLaunchKernel_ptsz : &cuLaunchKernel)},
      {"cuLaunchKernelEx", reinterpret_cast<void*>(&cuLaunchKernelEx)},
      {"cuLaunchCooperativeKernel", reinterpret_cast<void*>(&cuLaunchCooperativeKernel)},
      {"cuGraphLaunch", reinterpret_cast<void*>(&cuGraphLaunch)},
      {"cuStreamSynchronize", reinterpret_cast<void*>(&cuStreamSynchronize)},
      {"cuEventSynchronize", reinterpret_cast<void*>(&cuEventSynchronize)},
      {"cuCtxSynchronize", version >= 13000 ? reinterpret_cast<void*>(&cuCtxSynchronize_v2)
                                            : reinterpret_cast<void*>(&cuCtxSynchronize)},
      {"cuMemcpy", reinterpret_cast<void*>(&cuMemcpy)},
      {"cuMemcpyAsync", reinterpret_cast<void*>(&cuMemcpyAsync)},
      {"cuMemcpyDtoH", version >= 3020 ? reinterpret_cast<void*>(&cuMemcpyDtoH_v2)
                                       : reinterpret_cast<void*>(&cuMemcpyDtoH)},
      {"cuMemcpyDtoHAsync", reinterpret_cast<void*>(&cuMemcpyDtoHAsync_v2)},
      {"cuMemcpyHtoD", reinterpret_cast<void*>(&cuMemcpyHtoD_v2)},
      {"cuMemcpyHtoDAsync", reinterpret_cast<void*>(&cuMemcpyHtoDAsync_v2)},
      {"cuGetProcAddress", version >= 12000 ? reinterpret_cast<void*>(&GetProcAddressAlias)
                                            : reinterpret_cast<void*>(&cuGetProcAddress)},
  };
  for (const Known& k : known) {
    if (std::strcmp(symbol, k.name) == 0) {
      *pfn = k.fn;
      if (status != nullptr) *status = 0;
      return 0;
    }
  }
  *pfn = nullptr;
  if (status != nullptr) *status = 1;  // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
  return 500;                          // CUDA_ERROR_NOT_FOUND
}
__attribute__((visibility("default"))) int cuGetProcAddress(const char* symbol, void** pfn,
                                                            int version, unsigned long long flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}
}
