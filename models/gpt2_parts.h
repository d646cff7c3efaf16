// The zoo's GPT-2 as its pieces in execution order, so a pipeline-parallel trainer
// (pipeline/gpt2_stage.h) can run the model split by transformer blocks across processes.
// Embed, then Block(0) ... Block(num_blocks() - 1), then Head composes to exactly what
// ZooModel::Forward computes. Parameters keep the model's state_dict names: a piece's tensors
// are those under "transformer.wte." / "transformer.wpe." (Embed), "transformer.h.<i>." (Block i)
// and "transformer.ln_f." plus the tied "transformer.wte.weight" (Head).
#ifndef PSWITCH_MODELS_GPT2_PARTS_H_
#define PSWITCH_MODELS_GPT2_PARTS_H_

#include <ATen/core/Tensor.h>

#include "models/zoo_model.h"

namespace pswitch::models {

// Not thread-safe, like the model it belongs to; each call may throw c10::Error.
class Gpt2Parts {
 public:
  virtual int num_blocks() const = 0;
  // Token ids [N, S] int64 -> hidden states [N, S, n_embd]: wte + wpe, then dropout.
  virtual at::Tensor Embed(const at::Tensor& ids) = 0;
  // Transformer block `index` in [0, num_blocks()).
  virtual at::Tensor Block(int index, const at::Tensor& hidden) = 0;
  // Final layer norm and the LM head (tied to wte): hidden -> logits [N, S, vocab].
  virtual at::Tensor Head(const at::Tensor& hidden) = 0;

 protected:
  ~Gpt2Parts() = default;
};

// The pieces of `model` when it is the zoo's "gpt2", else nullptr. Borrowed: valid while the
// model lives.
Gpt2Parts* AsGpt2Parts(ZooModel& model);

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_GPT2_PARTS_H_
