// A stand-in for libcudart and libcuda in monitor_test: the CUDA launch and synchronisation entry
// points that libpswitch_monitor.so interposes, each counting its calls (and returning 0,
// success), so the test sees that every call reached the real function with its arguments. A
// synchronisation waits STUB_SYNC_US microseconds (default 0), as one waiting for a device would.
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>

namespace {
struct Dim3 {
  unsigned x, y, z;
};
std::atomic<int> calls{0};
std::atomic<unsigned> last_grid_x{0};
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
__attribute__((visibility("default"))) int cuCtxSynchronize() { return Synchronise(); }
__attribute__((visibility("default"))) int cuStreamSynchronize(void*) { return Synchronise(); }
__attribute__((visibility("default"))) int cuEventSynchronize(void*) { return Synchronise(); }
}
