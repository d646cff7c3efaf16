// A stand-in for libcudart and libcuda in monitor_test: the CUDA launch entry points that
// libpswitch_monitor.so interposes, each counting its calls (and returning 0, success), so the
// test sees that every call reached the real function with its arguments.
#include <atomic>
#include <cstddef>

namespace {
struct Dim3 {
  unsigned x, y, z;
};
std::atomic<int> calls{0};
std::atomic<unsigned> last_grid_x{0};
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
}
