// Where a CUDA worker's tensors live. BoundModel places every parameter and buffer as a
// non-owning libtorch view (from_blob, no deleter) at its layout offset in the arena; on the CUDA
// backend those views must carry the CUDA device that holds the arena.
#ifndef PSWITCH_WORKER_CUDA_ARENA_DEVICE_H_
#define PSWITCH_WORKER_CUDA_ARENA_DEVICE_H_

#include <c10/core/Device.h>

#include "absl/status/statusor.h"

namespace pswitch::worker::cuda {

// The libtorch device of the arena memory at `in_arena`, mapped in this process (a restricted
// worker's arena is mapped only where it was granted: ask of its lease): cuda:N when it is
// device memory of GPU `device_ordinal`. FailedPrecondition when it is host memory or another
// GPU's memory. Initialises libtorch's CUDA state, so call it after CudaLeaseAllocator::Install.
absl::StatusOr<c10::Device> ArenaTensorDevice(const void* in_arena, int device_ordinal);

}  // namespace pswitch::worker::cuda

#endif  // PSWITCH_WORKER_CUDA_ARENA_DEVICE_H_
