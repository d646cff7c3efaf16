// Whether a backend can run on this machine, probed without touching CUDA in this process: a
// process that initialised CUDA cannot fork workers that use it.
#ifndef PSWITCH_TESTS_GPU_PROBE_H_
#define PSWITCH_TESTS_GPU_PROBE_H_

#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "gpu/device.h"

namespace pswitch::e2e {

// Why `backend`'s device cannot be opened here, or "" when it can (the host always can).
inline std::string DeviceSkipReason(gpu::Backend backend) {
  if (backend == gpu::Backend::kHost) return "";
  if (!gpu::CudaBackendBuilt()) return "built without the CUDA backend";
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    gpu::DeviceOptions options;
    options.backend = backend;
    auto device = gpu::Device::Open(options);
    std::string why = device.ok() ? "" : "no usable GPU: " + std::string(device.status().message());
    (void)!::write(fds[1], why.data(), why.size());
    _exit(0);
  }
  ::close(fds[1]);
  std::string why;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) why.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int wstatus = 0;
  ::waitpid(child, &wstatus, 0);
  return WIFEXITED(wstatus) ? why : "the GPU probe crashed";
}

}  // namespace pswitch::e2e

#endif  // PSWITCH_TESTS_GPU_PROBE_H_
