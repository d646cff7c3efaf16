#include "worker/cuda/compute_stream.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "models/zoo_model.h"

namespace pswitch::worker::cuda {

struct ComputeStreamScope::Guard {
  std::optional<c10::cuda::CUDAStreamGuard> guard;
};

absl::StatusOr<std::unique_ptr<ComputeStreamScope>> ComputeStreamScope::Enter(
    const gpu::Stream& stream, int device_ordinal) {
  auto* handle = static_cast<cudaStream_t>(stream.native_handle());
  if (handle == nullptr) {
    return absl::InvalidArgumentError(
        "the worker's compute stream has no CUDA handle (host backend?)");
  }
  auto guard = std::make_unique<Guard>();
  absl::Status entered = models::CatchTorch("entering the compute stream", [&] {
    // A wrapped external stream: libtorch neither creates nor destroys it.
    guard->guard.emplace(
        c10::cuda::getStreamFromExternal(handle, static_cast<c10::DeviceIndex>(device_ordinal)));
  });
  if (!entered.ok()) return entered;
  return std::unique_ptr<ComputeStreamScope>(new ComputeStreamScope(std::move(guard)));
}

ComputeStreamScope::ComputeStreamScope(std::unique_ptr<Guard> guard) : guard_(std::move(guard)) {}

ComputeStreamScope::~ComputeStreamScope() = default;

absl::Status ComputeStreamScope::Synchronize(const std::string& what,
                                             absl::Duration timeout) const {
  const c10::cuda::CUDAStream stream = guard_->guard->current_stream();
  const absl::Time start = absl::Now();
  absl::Duration pause = absl::Microseconds(1);
  bool done = false;
  absl::Status status = models::CatchTorch(absl::StrCat(what, ": compute stream"), [&] {
    // Poll rather than block, so a stream stuck on a flag cannot hang the worker. Tasks usually
    // end within microseconds of the last kernel: yield first, then back off to short sleeps.
    while (!(done = stream.query())) {
      absl::Duration waited = absl::Now() - start;
      if (waited > timeout) return;
      if (waited < absl::Milliseconds(1)) {
        std::this_thread::yield();
      } else {
        absl::SleepFor(pause);
        pause = std::min(pause * 2, absl::Microseconds(50));
      }
    }
    stream.synchronize();  // finished: this only reports an asynchronous kernel error, if any
  });
  if (!status.ok()) return status;
  if (!done) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": compute stream still busy after ",
                                                    absl::FormatDuration(timeout),
                                                    " (waiting on a ready flag never written?)"));
  }
  return absl::OkStatus();
}

}  // namespace pswitch::worker::cuda
