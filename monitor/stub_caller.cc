// Calls each interposable launch entry point `argv[1]` times (of the stub library it is linked
// against, or of libpswitch_monitor.so when preloaded) and prints how many calls reached the stub
// and the last grid x it saw: monitor_test's subject. With `argv[2]` "sync", each
// synchronisation entry point instead.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
struct Dim3 {
  unsigned x, y, z;
};
}  // namespace

extern "C" {
int stub_calls();
unsigned stub_last_grid_x();
int cudaLaunchKernel(const void*, Dim3, Dim3, void**, size_t, void*);
int cudaLaunchKernelExC(const void*, const void*, void**);
int cudaLaunchCooperativeKernel(const void*, Dim3, Dim3, void**, size_t, void*);
int cudaGraphLaunch(void*, void*);
int cuLaunchKernel(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   void*, void**, void**);
int cuLaunchKernelEx(const void*, void*, void**, void**);
int cuGraphLaunch(void*, void*);
int cudaDeviceSynchronize();
int cudaStreamSynchronize(void*);
int cudaEventSynchronize(void*);
int cudaMemcpy(void*, const void*, size_t, int);
int cuCtxSynchronize();
int cuStreamSynchronize(void*);
int cuEventSynchronize(void*);
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 1;
  int failed = 0;
  if (argc > 2 && std::strcmp(argv[2], "sync") == 0) {
    for (int i = 0; i < n; ++i) {
      failed += cudaDeviceSynchronize() != 0;
      failed += cudaStreamSynchronize(nullptr) != 0;
      failed += cudaEventSynchronize(nullptr) != 0;
      failed += cudaMemcpy(nullptr, nullptr, 0, 0) != 0;
      failed += cuCtxSynchronize() != 0;
      failed += cuStreamSynchronize(nullptr) != 0;
      failed += cuEventSynchronize(nullptr) != 0;
    }
    std::printf("calls=%d failed=%d\n", stub_calls(), failed);
    return failed == 0 ? 0 : 1;
  }
  for (int i = 0; i < n; ++i) {
    const Dim3 grid{static_cast<unsigned>(i + 1), 1, 1}, block{32, 1, 1};
    failed += cudaLaunchKernel(nullptr, grid, block, nullptr, 0, nullptr) != 0;
    failed += cudaLaunchKernelExC(nullptr, nullptr, nullptr) != 0;
    failed += cudaLaunchCooperativeKernel(nullptr, grid, block, nullptr, 0, nullptr) != 0;
    failed += cudaGraphLaunch(nullptr, nullptr) != 0;
    failed += cuLaunchKernel(nullptr, static_cast<unsigned>(i + 7), 1, 1, 32, 1, 1, 0, nullptr,
                             nullptr, nullptr) != 0;
    failed += cuLaunchKernelEx(nullptr, nullptr, nullptr, nullptr) != 0;
    failed += cuGraphLaunch(nullptr, nullptr) != 0;
  }
  std::printf("calls=%d last_grid_x=%u failed=%d\n", stub_calls(), stub_last_grid_x(), failed);
  return failed == 0 ? 0 : 1;
}
