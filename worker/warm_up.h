// A model's warm-up when a worker loads it: the one-off costs of its first run (on CUDA: kernel
// modules, cuBLAS/cuDNN handles and plans at the batch it will serve, autograd's threads, the
// optimizer's kernels) are paid here instead of by the first task or the first fill step, and,
// when asked, a second, warm step is timed so that a fill job's first step is admitted into a
// bubble only once it has been measured on this worker.
//
// The weights region may hold another model's bytes or be receiving them while this runs: the
// warm-up only reads it. A training step's forward writes running statistics (swapped for
// scratch copies, ScratchBuffers) and its optimizer would write the parameters, so the optimizer
// is warmed on a scratch parameter instead (models::WarmOptimizer); the gradients it leaves are
// dropped.
#ifndef PSWITCH_WORKER_WARM_UP_H_
#define PSWITCH_WORKER_WARM_UP_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/device.h"
#include "models/zoo_model.h"
#include "proto/worker_generated.h"

namespace torch::nn {
class Module;
}

namespace pswitch::worker {

class BoundModel;
class Executor;
class LeaseAllocator;

// Largest warm-up batch a worker accepts (registry::kMaxBatchSize; the worker does not link the
// registry).
inline constexpr uint32_t kMaxWarmBatch = 4096;

// proto::WarmUp, checked.
struct WarmSpec {
  uint32_t batch = 0;  // 0: no warm-up
  bool train = false;
  bool train_required = false;
  bool measure = false;
  // Null: no warm-up. InvalidArgument for a batch above `max_batch`.
  static absl::StatusOr<WarmSpec> From(const proto::WarmUp* warm, uint32_t max_batch);
};

struct WarmResult {
  int64_t infer_step_ns = 0;  // a warm inference forward at the spec's batch (0: not measured)
  int64_t train_step_ns = 0;  // a warm training step (0: not measured, or it failed)
  // The training step's failure when it was not required (the model still serves).
  absl::Status train_status;
};

// What the warm-up runs on: the worker's executor, stream and activation lease.
struct WarmContext {
  Executor& executor;
  gpu::Stream& stream;
  LeaseAllocator* activations;  // host backend's lease (null on CUDA: every allocation is)
  c10::Device device;
  absl::Duration timeout;  // bound on each synchronisation
};

// A training step's synthetic batch (`seed`'s example input and target, drawn on `device`), made
// as every training step makes it, so a warm-up's measured step pays for it too: a fill job's
// prediction must cover all of a real step. Throws c10::Error.
struct TrainingBatch {
  models::ModelInput input;
  at::Tensor target;
};
TrainingBatch SyntheticTrainingBatch(models::ZooModel& model, uint32_t batch, uint64_t seed,
                                     c10::Device device);

// Warms `bound` (model `name`) as `spec` says. An error fails the load: the model cannot run at
// its batch here (for instance it needs more than the activation lease), or a required training
// step failed.
absl::StatusOr<WarmResult> WarmUp(BoundModel& bound, const std::string& name, const WarmSpec& spec,
                                  const WarmContext& context);

// For its lifetime, every buffer of `module` (running statistics, step counters) is a scratch
// copy of itself; the originals (views into the weights region) are put back after. Throws
// c10::Error like any libtorch call.
class ScratchBuffers {
 public:
  explicit ScratchBuffers(torch::nn::Module& module);
  ~ScratchBuffers();
  ScratchBuffers(const ScratchBuffers&) = delete;
  ScratchBuffers& operator=(const ScratchBuffers&) = delete;

 private:
  void Restore();

  std::vector<at::Tensor> buffers_;    // the module's own tensors, whose data is swapped
  std::vector<at::Tensor> originals_;  // their data before
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_WARM_UP_H_
