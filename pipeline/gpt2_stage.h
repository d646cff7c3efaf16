// Real training compute for a pipeline stage: the zoo's GPT-2 split by transformer blocks.
//
// Stage 0 owns the embeddings (wte, wpe) and its blocks; the last stage owns its blocks, the
// final layer norm, the LM head and the loss; stages in between own only blocks. Every stage
// builds the whole model from the same seed (so all start from the weights an unsplit run would
// have) and then releases the tensors it does not own. Forward keeps each micro-batch's autograd
// graph until its backward; backward runs the stage's graph from the received gradient (the last
// stage from its loss / M) and returns the gradient of the stage's input. The LM head is tied to
// wte, so the first and last stage each hold a copy: as in Megatron-LM, they exchange their
// gradients of it after the last backward and add them, and since both then take the same SGD
// step the copies stay identical. Each iteration's batch is derived from the seed and the
// iteration index (IterationTokens), so the first stage's inputs and the last stage's targets
// agree without being sent.
//
// Thread-compatible; runs libtorch on one intra-op thread (the process's setting).
#ifndef PSWITCH_PIPELINE_GPT2_STAGE_H_
#define PSWITCH_PIPELINE_GPT2_STAGE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2_parts.h"
#include "models/registry.h"
#include "models/zoo_model.h"
#include "pipeline/stage_compute.h"

namespace torch::optim {
class SGD;
}

namespace pswitch::pipeline {

struct Gpt2StageOptions {
  int stage = 0;
  int stages = 1;
  int microbatches = 1;
  int64_t microbatch_size = 2;       // sequences per micro-batch
  models::ModelConfig model_config;  // overrides of the zoo's "gpt2" defaults
  uint64_t seed = 0;                 // weights and data
  double learning_rate = 0.01;       // SGD
  double momentum = 0.9;
  bool dropout = true;  // false: modules in eval mode (no dropout), so runs are deterministic
  int profile_microbatches = 3;  // timed forward+backward runs per Profile(), after one warm-up
  // Where the stage computes. On a single-GPU machine every stage may share cuda:0 (functional
  // runs; the stages then time-slice the GPU). Messages always travel as host tensors.
  c10::Device device = c10::Device(c10::kCPU);
};

// Blocks [first, end) of stage `stage` when `blocks` are split over `stages` as evenly as
// possible, earlier stages taking one more where it does not divide.
std::pair<int, int> StageBlocks(int blocks, int stages, int stage);

// Token ids of iteration `iteration`: [samples, seq_len] int64, identical on every stage and
// for an unsplit reference run of the same model and seed.
at::Tensor IterationTokens(const models::ZooModel& model, int64_t samples, uint64_t seed,
                           int iteration);

class Gpt2StageCompute final : public StageCompute {
 public:
  // Builds the stage; InvalidArgument for a bad split (fewer blocks than stages, ...) or model
  // settings. Sets libtorch's intra-op threads to 1 for the process.
  static absl::StatusOr<std::unique_ptr<Gpt2StageCompute>> Create(const Gpt2StageOptions& options);
  ~Gpt2StageCompute() override;

  TensorSpec InputSpec() const override { return activation_spec_; }
  TensorSpec OutputSpec() const override { return activation_spec_; }
  absl::StatusOr<StageCost> Profile() override;
  absl::Status StartIteration(int iteration) override;
  absl::StatusOr<WireTensor> Forward(int microbatch, WireTensor input) override;
  absl::StatusOr<WireTensor> Backward(int microbatch, WireTensor output_grad) override;
  absl::StatusOr<std::optional<WireTensor>> TiedGradient() override;
  absl::Status AddTiedGradient(const WireTensor& peer) override;
  absl::StatusOr<double> FinishIteration() override;

  // The parameters this stage trains, by state_dict name ("transformer.h.3.ln_1.weight"); the
  // tied "transformer.wte.weight" appears on both the first and the last stage.
  const std::vector<std::pair<std::string, at::Tensor>>& Parameters() const { return params_; }

 private:
  struct InFlight {
    at::Tensor input;   // the received activation (a leaf that collects its gradient)
    at::Tensor output;  // the sent activation, or loss / M on the last stage
  };

  Gpt2StageCompute(const Gpt2StageOptions& options, std::shared_ptr<models::ZooModel> model,
                   models::Gpt2Parts* parts, int64_t seq_len, int64_t embd);
  bool first() const { return options_.stage == 0; }
  bool last() const { return options_.stage == options_.stages - 1; }
  bool holds_tied() const { return options_.stages > 1 && (first() || last()); }
  absl::Status SelectParameters();
  // The forward of one micro-batch; `ids` are its tokens (first stage input, last stage target).
  InFlight RunForward(const at::Tensor& input, const at::Tensor& ids);
  at::Tensor MicrobatchTokens(int microbatch) const;
  void SyncDevice() const;

  const Gpt2StageOptions options_;
  const std::shared_ptr<models::ZooModel> model_;
  models::Gpt2Parts* const parts_;  // borrowed from *model_
  const TensorSpec activation_spec_;
  int first_block_ = 0, end_block_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  at::Tensor tied_weight_;  // wte.weight on the first and last stage
  std::unique_ptr<torch::optim::SGD> optimizer_;

  int iteration_ = -1;
  at::Tensor tokens_;  // this iteration's batch (first and last stage)
  std::map<int, InFlight> in_flight_;
  double loss_sum_ = 0;
};

}  // namespace pswitch::pipeline

#endif  // PSWITCH_PIPELINE_GPT2_STAGE_H_
