// Which backends this build's workers execute on, without libtorch: pswitchd refuses a backend
// up front instead of starting workers that would crash. The CUDA execution path (worker/cuda/)
// is built only against a CUDA libtorch; CMake tells this file which was built.
#ifndef PSWITCH_WORKER_BACKENDS_H_
#define PSWITCH_WORKER_BACKENDS_H_

#include "absl/status/status.h"
#include "gpu/device.h"

namespace pswitch::worker {

// OK when workers can execute tasks on `backend`; Unimplemented, saying how to build it, else.
absl::Status CheckWorkerBackend(gpu::Backend backend);

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_BACKENDS_H_
