// Calls each interposable launch entry point `argv[1]` times (of the stub library it is linked
// against, or of libpswitch_monitor.so when preloaded) and prints how many calls reached the stub
// and the last grid x it saw: monitor_test's subject. With `argv[2]` "sync", each
// synchronisation entry point instead; with "lookup", the driver's entry points as a statically
// linked CUDA runtime reaches them: cuGetProcAddress(_v2) found with dlsym in the driver's own
// handle, and what it gives.
#include <dlfcn.h>

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
void* stub_last_context();
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
int cudaMemcpyAsync(void*, const void*, size_t, int, void*);
int cuCtxSynchronize();
int cuStreamSynchronize(void*);
int cuEventSynchronize(void*);
}

namespace {
using GetProcAddressV2 = int (*)(const char*, void**, int, unsigned long long, int*);
using GetProcAddress = int (*)(const char*, void**, int, unsigned long long);
using LaunchKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, void*, void**, void**);
using LaunchCooperativeKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, unsigned, void*, void**);
using LaunchKernelEx = int (*)(const void*, void*, void**, void**);
using GraphLaunch = int (*)(void*, void*);
using OneHandle = int (*)(void*);
using NoArgument = int (*)();
using ContextSynchronize = int (*)(void*);
using Memcpy = int (*)(unsigned long long, unsigned long long, size_t);
using MemcpyAsync = int (*)(unsigned long long, unsigned long long, size_t, void*);
using MemcpyDtoH = int (*)(void*, unsigned long long, size_t);
using MemcpyDtoHAsync = int (*)(void*, unsigned long long, size_t, void*);
using MemcpyHtoD = int (*)(unsigned long long, const void*, size_t);
using MemcpyHtoDAsync = int (*)(unsigned long long, const void*, size_t, void*);
using MemcpyDtoHV1 = int (*)(void*, unsigned, unsigned);

template <typename Fn>
Fn Found(GetProcAddressV2 get, const char* name, unsigned long long flags = 0,
         int version = 12080) {
  void* fn = nullptr;
  int status = -1;
  if (get(name, &fn, version, flags, &status) != 0 || status != 0) return nullptr;
  return reinterpret_cast<Fn>(fn);
}

// The "lookup" mode: 8 launches, 4 synchronisations (one of them CUDA 13's cuCtxSynchronize,
// which takes a context) and 8 copies (one of the CUDA 3.0 ABI), `n` times each; 1 when one was
// not found. Says where cuLaunchKernel found by name in the driver's handle lies: "stub" when it
// is the driver's own function, "wrapper" when it is not.
int Lookups(int n) {
  void* driver = ::dlopen("libpswitch_cuda_stub.so", RTLD_LAZY | RTLD_NOLOAD);
  if (driver == nullptr) return std::printf("no driver: %s\n", ::dlerror()), 1;
  auto get = reinterpret_cast<GetProcAddressV2>(::dlsym(driver, "cuGetProcAddress_v2"));
  auto get_v1 = reinterpret_cast<GetProcAddress>(::dlsym(driver, "cuGetProcAddress"));
  if (get == nullptr || get_v1 == nullptr) return std::printf("no cuGetProcAddress\n"), 1;
  auto launch = Found<LaunchKernel>(get, "cuLaunchKernel");
  auto launch_ptsz = Found<LaunchKernel>(get, "cuLaunchKernel", 2);
  auto launch_ex = Found<LaunchKernelEx>(get, "cuLaunchKernelEx");
  auto cooperative = Found<LaunchCooperativeKernel>(get, "cuLaunchCooperativeKernel");
  auto graph = Found<GraphLaunch>(get, "cuGraphLaunch");
  auto stream_sync = Found<OneHandle>(get, "cuStreamSynchronize");
  auto event_sync = Found<OneHandle>(get, "cuEventSynchronize");
  auto ctx_sync = Found<NoArgument>(get, "cuCtxSynchronize", 0, 12080);
  auto ctx_sync_v2 = Found<ContextSynchronize>(get, "cuCtxSynchronize", 0, 13000);
  auto memcpy_ = Found<Memcpy>(get, "cuMemcpy");
  auto memcpy_async = Found<MemcpyAsync>(get, "cuMemcpyAsync");
  auto dtoh = Found<MemcpyDtoH>(get, "cuMemcpyDtoH");
  auto dtoh_async = Found<MemcpyDtoHAsync>(get, "cuMemcpyDtoHAsync");
  auto htod = Found<MemcpyHtoD>(get, "cuMemcpyHtoD");
  auto htod_async = Found<MemcpyHtoDAsync>(get, "cuMemcpyHtoDAsync");
  auto dtoh_v1 = Found<MemcpyDtoHV1>(get, "cuMemcpyDtoH", 0, 3000);
  auto dtoh_by_name = reinterpret_cast<MemcpyDtoH>(::dlsym(driver, "cuMemcpyDtoH_v2"));
  // cuGetProcAddress asked for itself, and the older ABI's.
  auto self = Found<GetProcAddressV2>(get, "cuGetProcAddress");
  void* from_v1 = nullptr;
  get_v1("cuLaunchKernel", &from_v1, 11000, 0);
  auto graph_again = self == nullptr ? nullptr : Found<GraphLaunch>(self, "cuGraphLaunch");
  // A driver entry point found by name in the driver's handle (as Triton's launcher does).
  auto by_name = reinterpret_cast<LaunchKernel>(::dlsym(driver, "cuLaunchKernel"));
  if (!launch || !launch_ptsz || !launch_ex || !cooperative || !graph || !stream_sync ||
      !event_sync || !ctx_sync || !ctx_sync_v2 || !graph_again || !from_v1 || !by_name ||
      !memcpy_ || !memcpy_async || !dtoh || !dtoh_async || !htod || !htod_async || !dtoh_v1 ||
      !dtoh_by_name) {
    return std::printf("an entry point was not found\n"), 1;
  }
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    failed += launch(nullptr, 7, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr) != 0;
    failed += launch_ptsz(nullptr, 7, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr) != 0;
    failed += launch_ex(nullptr, nullptr, nullptr, nullptr) != 0;
    failed += cooperative(nullptr, 7, 1, 1, 32, 1, 1, 0, nullptr, nullptr) != 0;
    failed += graph(nullptr, nullptr) != 0;
    failed += graph_again(nullptr, nullptr) != 0;
    failed += reinterpret_cast<LaunchKernel>(from_v1)(nullptr, 7, 1, 1, 32, 1, 1, 0, nullptr,
                                                      nullptr, nullptr) != 0;
    failed += by_name(nullptr, static_cast<unsigned>(i + 3), 1, 1, 32, 1, 1, 0, nullptr, nullptr,
                      nullptr) != 0;
    failed += stream_sync(nullptr) != 0;
    failed += event_sync(nullptr) != 0;
    failed += ctx_sync() != 0;
    failed += ctx_sync_v2(reinterpret_cast<void*>(0x1234)) != 0;
    failed += memcpy_(0, 0, 0) != 0;
    failed += memcpy_async(0, 0, 0, nullptr) != 0;
    failed += dtoh(nullptr, 0, 0) != 0;
    failed += dtoh_async(nullptr, 0, 0, nullptr) != 0;
    failed += htod(0, nullptr, 0) != 0;
    failed += htod_async(0, nullptr, 0, nullptr) != 0;
    failed += dtoh_v1(nullptr, 0, 0) != 0;
    failed += dtoh_by_name(nullptr, 0, 0) != 0;
  }
  const bool context_kept = stub_last_context() == reinterpret_cast<void*>(0x1234);
  // cuGetProcAddress asked for itself answers with its status, through whatever it gave.
  int status = -1;
  void* again = nullptr;
  failed += self("cuStreamSynchronize", &again, 12080, 0, &status) != 0 || status != 0;
  Dl_info where{};
  const bool by_name_is_stub = ::dladdr(reinterpret_cast<void*>(by_name), &where) != 0 &&
                               std::strstr(where.dli_fname, "cuda_stub") != nullptr;
  // Each variant reached its own real function (the per-thread stream's adds 1000).
  launch_ptsz(nullptr, 7, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr);
  const bool ptsz_kept = stub_last_grid_x() == 1007;
  launch(nullptr, 7, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr);
  const bool variants_kept = ptsz_kept && stub_last_grid_x() == 7;
  // RTLD_NEXT is relative to its caller (this program) with the monitor's dlsym in between: the
  // next definition after the program is the first in the global scope.
  const bool next_kept =
      ::dlsym(RTLD_NEXT, "cuLaunchKernel") == ::dlsym(RTLD_DEFAULT, "cuLaunchKernel");
  std::printf("calls=%d failed=%d variants=%s context=%s rtld_next=%s by_name=%s\n", stub_calls(),
              failed, variants_kept ? "kept" : "mixed", context_kept ? "kept" : "lost",
              next_kept ? "kept" : "moved", by_name_is_stub ? "stub" : "wrapper");
  return failed == 0 && variants_kept && context_kept && next_kept ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 1;
  int failed = 0;
  if (argc > 2 && std::strcmp(argv[2], "lookup") == 0) return Lookups(n);
  if (argc > 2 && std::strcmp(argv[2], "sync") == 0) {
    for (int i = 0; i < n; ++i) {
      failed += cudaDeviceSynchronize() != 0;
      failed += cudaStreamSynchronize(nullptr) != 0;
      failed += cudaEventSynchronize(nullptr) != 0;
      failed += cudaMemcpy(nullptr, nullptr, 0, 0) != 0;
      failed += cudaMemcpyAsync(nullptr, nullptr, 0, 0, nullptr) != 0;
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
