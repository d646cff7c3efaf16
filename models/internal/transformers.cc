// BERT (BertForSequenceClassification) and GPT-2 (GPT2LMHeadModel), ported from Hugging Face
// transformers' eager implementations: same module tree and state_dict keys, same forward order,
// same initialisation (normal(0, 0.02), zero biases, unit LayerNorms).
#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "models/gpt2_parts.h"
#include "models/internal/architectures.h"
#include "models/weight_init.h"

namespace pswitch::models::internal {
namespace {

namespace nn = torch::nn;

constexpr float kMaskValue = std::numeric_limits<float>::lowest();  // torch.finfo(float32).min

nn::LayerNorm Norm(int64_t width, double eps) {
  return nn::LayerNorm(nn::LayerNormOptions({width}).eps(eps));
}

// [B, S, H] -> [B, heads, S, H / heads]
at::Tensor SplitHeads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).permute({0, 2, 1, 3});
}
at::Tensor MergeHeads(const at::Tensor& x) {
  return x.permute({0, 2, 1, 3}).contiguous().view({x.size(0), x.size(2), -1});
}

void InitTransformerWeights(nn::Module& root) {
  if (!InitWeights()) return;
  torch::NoGradGuard no_grad;
  for (auto& module : root.modules(/*include_self=*/false)) {
    if (auto* linear = module->as<nn::Linear>()) {
      linear->weight.normal_(0, 0.02);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = module->as<nn::Embedding>()) {
      embedding->weight.normal_(0, 0.02);
      if (embedding->options.padding_idx())
        embedding->weight[*embedding->options.padding_idx()].zero_();
    } else if (auto* norm = module->as<nn::LayerNorm>()) {
      norm->weight.fill_(1);
      norm->bias.zero_();
    }
  }
}

// ---------------------------------------------------------------- BERT

struct BertDims {
  int64_t hidden, heads, intermediate;
};

// Holds the leaves of one BertLayer under HF's names:
// attention.self.{query,key,value,dropout}, attention.output.{dense,LayerNorm,dropout},
// intermediate.dense, output.{dense,LayerNorm,dropout}.
class BertLayerImpl : public nn::Module {
 public:
  explicit BertLayerImpl(const BertDims& d) : heads_(d.heads) {
    auto attention = register_module("attention", std::make_shared<nn::Module>());
    auto self = attention->register_module("self", std::make_shared<nn::Module>());
    query_ = self->register_module("query", nn::Linear(d.hidden, d.hidden));
    key_ = self->register_module("key", nn::Linear(d.hidden, d.hidden));
    value_ = self->register_module("value", nn::Linear(d.hidden, d.hidden));
    attn_dropout_ = self->register_module("dropout", nn::Dropout(0.1));
    auto attn_out = attention->register_module("output", std::make_shared<nn::Module>());
    attn_dense_ = attn_out->register_module("dense", nn::Linear(d.hidden, d.hidden));
    attn_norm_ = attn_out->register_module("LayerNorm", Norm(d.hidden, 1e-12));
    attn_out_dropout_ = attn_out->register_module("dropout", nn::Dropout(0.1));
    auto intermediate = register_module("intermediate", std::make_shared<nn::Module>());
    inter_dense_ = intermediate->register_module("dense", nn::Linear(d.hidden, d.intermediate));
    auto output = register_module("output", std::make_shared<nn::Module>());
    out_dense_ = output->register_module("dense", nn::Linear(d.intermediate, d.hidden));
    out_norm_ = output->register_module("LayerNorm", Norm(d.hidden, 1e-12));
    out_dropout_ = output->register_module("dropout", nn::Dropout(0.1));
  }

  // `mask` is the additive [B, 1, 1, S] attention mask.
  at::Tensor Forward(LayerTape& t, const at::Tensor& h, const at::Tensor& mask) {
    at::Tensor q = SplitHeads(RunLayer(t, query_, h), heads_);
    at::Tensor k = SplitHeads(RunLayer(t, key_, h), heads_);
    at::Tensor v = SplitHeads(RunLayer(t, value_, h), heads_);
    at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(q.size(-1)));
    at::Tensor probs = RunLayer(t, attn_dropout_, at::softmax(scores + mask, -1));
    at::Tensor context = MergeHeads(at::matmul(probs, v));
    at::Tensor a = RunLayer(t, attn_out_dropout_, RunLayer(t, attn_dense_, context));
    a = RunLayer(t, attn_norm_, a + h);
    at::Tensor i = at::gelu(RunLayer(t, inter_dense_, a));
    at::Tensor o = RunLayer(t, out_dropout_, RunLayer(t, out_dense_, i));
    return RunLayer(t, out_norm_, o + a);
  }

 private:
  const int64_t heads_;
  nn::Linear query_{nullptr}, key_{nullptr}, value_{nullptr}, attn_dense_{nullptr},
      inter_dense_{nullptr}, out_dense_{nullptr};
  nn::Dropout attn_dropout_{nullptr}, attn_out_dropout_{nullptr}, out_dropout_{nullptr};
  nn::LayerNorm attn_norm_{nullptr}, out_norm_{nullptr};
};
TORCH_MODULE(BertLayer);

class Bert : public ZooModel {
 public:
  Bert(const std::string& name, const ModelConfig& c)
      : ZooModel(name),
        vocab_(c.Get("vocab_size")),
        seq_len_(c.Get("seq_len")),
        num_labels_(c.Get("num_labels")) {
    const int64_t hidden = c.Get("hidden_size");
    auto bert = register_module("bert", std::make_shared<nn::Module>());
    auto emb = bert->register_module("embeddings", std::make_shared<nn::Module>());
    word_ = emb->register_module(
        "word_embeddings", nn::Embedding(nn::EmbeddingOptions(vocab_, hidden).padding_idx(0)));
    position_ = emb->register_module("position_embeddings",
                                     nn::Embedding(c.Get("max_position_embeddings"), hidden));
    token_type_ = emb->register_module("token_type_embeddings",
                                       nn::Embedding(c.Get("type_vocab_size"), hidden));
    emb_norm_ = emb->register_module("LayerNorm", Norm(hidden, 1e-12));
    emb_dropout_ = emb->register_module("dropout", nn::Dropout(0.1));
    auto encoder = bert->register_module("encoder", std::make_shared<nn::Module>());
    auto list = encoder->register_module("layer", nn::ModuleList());
    const BertDims dims{hidden, c.Get("num_attention_heads"), c.Get("intermediate_size")};
    TORCH_CHECK(hidden % dims.heads == 0, "hidden_size ", hidden, " is not a multiple of ",
                dims.heads, " heads");
    for (int64_t i = 0; i < c.Get("num_hidden_layers"); ++i) {
      layers_.push_back(BertLayer(dims));
      list->push_back(layers_.back());
    }
    auto pooler = bert->register_module("pooler", std::make_shared<nn::Module>());
    pooler_dense_ = pooler->register_module("dense", nn::Linear(hidden, hidden));
    pooler_act_ = pooler->register_module("activation", nn::Tanh());
    dropout_ = register_module("dropout", nn::Dropout(0.1));
    classifier_ = register_module("classifier", nn::Linear(hidden, num_labels_));
    InitTransformerWeights(*this);
  }

  ModelInput MakeExampleInput(int64_t batch, uint64_t seed, c10::Device device) const override {
    return Tokens(batch, seq_len_, seed, device);
  }
  at::Tensor MakeExampleTarget(int64_t batch, uint64_t seed, c10::Device device) const override {
    return at::randint(num_labels_, {batch}, SeededGenerator(seed, device),
                       at::TensorOptions().dtype(at::kLong).device(device));
  }

 protected:
  ModelOutput ForwardImpl(const ModelInput& in) override {
    const at::Tensor& ids = in.input;
    const int64_t seq = ids.size(1);
    at::Tensor types = in.token_type_ids.defined() ? in.token_type_ids : at::zeros_like(ids);
    at::Tensor positions = at::arange(seq, ids.options()).unsqueeze(0);
    at::Tensor h = RunLayer(tape(), word_, ids);
    h = h + RunLayer(tape(), token_type_, types);
    h = h + RunLayer(tape(), position_, positions);
    h = RunLayer(tape(), emb_dropout_, RunLayer(tape(), emb_norm_, h));
    at::Tensor mask = in.attention_mask.defined() ? in.attention_mask : at::ones_like(ids);
    mask = (1.0 - mask.to(h.scalar_type()).unsqueeze(1).unsqueeze(2)) * kMaskValue;
    for (auto& layer : layers_) h = layer->Forward(tape(), h, mask);
    at::Tensor pooled =
        RunLayer(tape(), pooler_act_, RunLayer(tape(), pooler_dense_, h.select(1, 0)));
    return {RunLayer(tape(), classifier_, RunLayer(tape(), dropout_, pooled)), {}};
  }
  ModelInput TraceInput() const override { return Tokens(2, 8, 0, c10::kCPU); }

 private:
  ModelInput Tokens(int64_t batch, int64_t seq, uint64_t seed, c10::Device device) const {
    const auto i64 = at::TensorOptions().dtype(at::kLong).device(device);
    return {at::randint(vocab_, {batch, seq}, SeededGenerator(seed, device), i64),
            at::ones({batch, seq}, i64), at::zeros({batch, seq}, i64)};
  }

  const int64_t vocab_, seq_len_, num_labels_;
  nn::Embedding word_{nullptr}, position_{nullptr}, token_type_{nullptr};
  nn::LayerNorm emb_norm_{nullptr};
  nn::Dropout emb_dropout_{nullptr}, dropout_{nullptr};
  std::vector<BertLayer> layers_;
  nn::Linear pooler_dense_{nullptr}, classifier_{nullptr};
  nn::Tanh pooler_act_{nullptr};
};

// ---------------------------------------------------------------- GPT-2

// HF's Conv1D: a linear layer whose weight is stored transposed, [in, out].
class Conv1DImpl : public nn::Module {
 public:
  Conv1DImpl(int64_t out, int64_t in, double init_std) {
    at::Tensor w = at::zeros({in, out});
    if (InitWeights()) w.normal_(0, init_std);
    weight = register_parameter("weight", w);
    bias = register_parameter("bias", at::zeros({out}));
  }
  at::Tensor forward(const at::Tensor& x) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(1);
    return at::addmm(bias, x.reshape({-1, x.size(-1)}), weight).view(shape);
  }
  at::Tensor weight, bias;
};
TORCH_MODULE(Conv1D);

// GPT2LMHeadModel's lm_head: tied to transformer.wte, so it owns no tensor of its own.
class TiedLmHeadImpl : public nn::Module {
 public:
  explicit TiedLmHeadImpl(nn::Embedding wte) : wte_(std::move(wte)) {}
  at::Tensor forward(const at::Tensor& x) { return at::matmul(x, wte_->weight.t()); }

 private:
  nn::Embedding wte_;  // shared with the transformer; lives as long as the model
};
TORCH_MODULE(TiedLmHead);

class Gpt2BlockImpl : public nn::Module {
 public:
  Gpt2BlockImpl(int64_t embd, int64_t heads, int64_t n_layer) : heads_(heads) {
    const double proj_std = 0.02 / std::sqrt(2.0 * n_layer);  // HF's scaled c_proj init
    ln_1_ = register_module("ln_1", Norm(embd, 1e-5));
    auto attn = register_module("attn", std::make_shared<nn::Module>());
    c_attn_ = attn->register_module("c_attn", Conv1D(3 * embd, embd, 0.02));
    attn_c_proj_ = attn->register_module("c_proj", Conv1D(embd, embd, proj_std));
    attn_dropout_ = attn->register_module("attn_dropout", nn::Dropout(0.1));
    resid_dropout_ = attn->register_module("resid_dropout", nn::Dropout(0.1));
    ln_2_ = register_module("ln_2", Norm(embd, 1e-5));
    auto mlp = register_module("mlp", std::make_shared<nn::Module>());
    c_fc_ = mlp->register_module("c_fc", Conv1D(4 * embd, embd, 0.02));
    mlp_c_proj_ = mlp->register_module("c_proj", Conv1D(embd, 4 * embd, proj_std));
    mlp_dropout_ = mlp->register_module("dropout", nn::Dropout(0.1));
  }

  at::Tensor Forward(LayerTape& t, const at::Tensor& x) {
    const int64_t embd = x.size(-1), seq = x.size(1);
    auto qkv = RunLayer(t, c_attn_, RunLayer(t, ln_1_, x)).split(embd, 2);
    at::Tensor q = SplitHeads(qkv[0], heads_), k = SplitHeads(qkv[1], heads_),
               v = SplitHeads(qkv[2], heads_);
    at::Tensor w = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(v.size(-1)));
    at::Tensor causal = at::ones({seq, seq}, x.options().dtype(at::kBool)).tril();
    w = at::where(causal, w, at::scalar_tensor(kMaskValue, w.options()));
    at::Tensor a = at::matmul(RunLayer(t, attn_dropout_, at::softmax(w, -1)), v);
    a = RunLayer(t, resid_dropout_, RunLayer(t, attn_c_proj_, MergeHeads(a)));
    at::Tensor h = x + a;
    at::Tensor m = at::gelu(RunLayer(t, c_fc_, RunLayer(t, ln_2_, h)), "tanh");
    return h + RunLayer(t, mlp_dropout_, RunLayer(t, mlp_c_proj_, m));
  }

 private:
  const int64_t heads_;
  nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  Conv1D c_attn_{nullptr}, attn_c_proj_{nullptr}, c_fc_{nullptr}, mlp_c_proj_{nullptr};
  nn::Dropout attn_dropout_{nullptr}, resid_dropout_{nullptr}, mlp_dropout_{nullptr};
};
TORCH_MODULE(Gpt2Block);

class Gpt2 : public ZooModel, public Gpt2Parts {
 public:
  Gpt2(const std::string& name, const ModelConfig& c)
      : ZooModel(name), vocab_(c.Get("vocab_size")), seq_len_(c.Get("seq_len")) {
    const int64_t embd = c.Get("n_embd"), heads = c.Get("n_head"), n_layer = c.Get("n_layer");
    TORCH_CHECK(embd % heads == 0, "n_embd ", embd, " is not a multiple of n_head ", heads);
    TORCH_CHECK(seq_len_ <= c.Get("n_positions"), "seq_len exceeds n_positions");
    auto transformer = register_module("transformer", std::make_shared<nn::Module>());
    wte_ = transformer->register_module("wte", nn::Embedding(vocab_, embd));
    wpe_ = transformer->register_module("wpe", nn::Embedding(c.Get("n_positions"), embd));
    drop_ = transformer->register_module("drop", nn::Dropout(0.1));
    auto list = transformer->register_module("h", nn::ModuleList());
    for (int64_t i = 0; i < n_layer; ++i) {
      blocks_.push_back(Gpt2Block(embd, heads, n_layer));
      list->push_back(blocks_.back());
    }
    ln_f_ = transformer->register_module("ln_f", Norm(embd, 1e-5));
    lm_head_ = register_module("lm_head", TiedLmHead(wte_));
    torch::NoGradGuard no_grad;
    if (InitWeights()) {
      wte_->weight.normal_(0, 0.02);
      wpe_->weight.normal_(0, 0.02);
    }
  }

  ModelInput MakeExampleInput(int64_t batch, uint64_t seed, c10::Device device) const override {
    return {at::randint(vocab_, {batch, seq_len_}, SeededGenerator(seed, device),
                        at::TensorOptions().dtype(at::kLong).device(device)),
            {},
            {}};
  }
  // Language modelling: the target is the token sequence itself (shifted inside Loss).
  at::Tensor MakeExampleTarget(int64_t batch, uint64_t seed, c10::Device device) const override {
    return MakeExampleInput(batch, seed, device).input;
  }
  at::Tensor Loss(const ModelOutput& out, const at::Tensor& target) const override {
    const int64_t seq = out.output.size(1);
    at::Tensor logits = out.output.narrow(1, 0, seq - 1).reshape({-1, out.output.size(-1)});
    at::Tensor labels = target.to(logits.device()).narrow(1, 1, seq - 1).reshape({-1});
    return torch::nn::functional::cross_entropy(logits, labels);
  }
  // HF checkpoints may carry the causal-mask buffers and the tied head's copy of wte.
  bool IsIgnorableCheckpointKey(const std::string& key) const override {
    return absl::EndsWith(key, ".attn.bias") || absl::EndsWith(key, ".attn.masked_bias") ||
           key == "lm_head.weight";
  }

 protected:
  ModelOutput ForwardImpl(const ModelInput& in) override {
    const at::Tensor& ids = in.input;
    at::Tensor positions = at::arange(ids.size(1), ids.options()).unsqueeze(0);
    at::Tensor h = RunLayer(tape(), wte_, ids);
    h = h + RunLayer(tape(), wpe_, positions);
    h = RunLayer(tape(), drop_, h);
    for (auto& block : blocks_) h = block->Forward(tape(), h);
    return {RunLayer(tape(), lm_head_, RunLayer(tape(), ln_f_, h)), {}};
  }
  ModelInput TraceInput() const override {
    at::Generator gen = at::detail::createCPUGenerator(0);
    return {at::randint(vocab_, {2, 8}, gen, at::TensorOptions().dtype(at::kLong)), {}, {}};
  }

 public:
  // Gpt2Parts: the same calls ForwardImpl makes, one piece at a time.
  int num_blocks() const override { return static_cast<int>(blocks_.size()); }
  at::Tensor Embed(const at::Tensor& ids) override {
    at::Tensor positions = at::arange(ids.size(1), ids.options()).unsqueeze(0);
    at::Tensor h = RunLayer(tape(), wte_, ids);
    h = h + RunLayer(tape(), wpe_, positions);
    return RunLayer(tape(), drop_, h);
  }
  at::Tensor Block(int index, const at::Tensor& hidden) override {
    return blocks_.at(index)->Forward(tape(), hidden);
  }
  at::Tensor Head(const at::Tensor& hidden) override {
    return RunLayer(tape(), lm_head_, RunLayer(tape(), ln_f_, hidden));
  }

 private:
  const int64_t vocab_, seq_len_;
  nn::Embedding wte_{nullptr}, wpe_{nullptr};
  nn::Dropout drop_{nullptr};
  std::vector<Gpt2Block> blocks_;
  nn::LayerNorm ln_f_{nullptr};
  TiedLmHead lm_head_{nullptr};
};

}  // namespace

std::shared_ptr<ZooModel> MakeBert(const std::string& name, const ModelConfig& config) {
  return std::make_shared<Bert>(name, config);
}
std::shared_ptr<ZooModel> MakeGpt2(const std::string& name, const ModelConfig& config) {
  return std::make_shared<Gpt2>(name, config);
}

}  // namespace pswitch::models::internal

namespace pswitch::models {

Gpt2Parts* AsGpt2Parts(ZooModel& model) { return dynamic_cast<Gpt2Parts*>(&model); }

}  // namespace pswitch::models
