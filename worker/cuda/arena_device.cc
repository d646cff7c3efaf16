#include "worker/cuda/arena_device.h"

#include <ATen/Context.h>

#include "absl/strings/str_cat.h"
#include "models/zoo_model.h"

namespace pswitch::worker::cuda {

absl::StatusOr<c10::Device> ArenaTensorDevice(const void* in_arena, int device_ordinal) {
  c10::Device device(c10::kCPU);
  // libtorch asks the CUDA runtime it links (cudaPointerGetAttributes), as from_blob does for
  // every view; it throws for host memory that CUDA does not know.
  absl::Status asked = models::CatchTorch("locating the arena", [&] {
    device = at::globalContext().getDeviceFromPtr(const_cast<void*>(in_arena), c10::kCUDA);
  });
  if (!asked.ok()) return absl::FailedPreconditionError(asked.message());
  if (!device.is_cuda() || device.index() != device_ordinal) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the arena is memory of ", device.str(), ", the worker runs on cuda:", device_ordinal));
  }
  return device;
}

}  // namespace pswitch::worker::cuda
