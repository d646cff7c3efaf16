// Inception-v3, ported from torchvision 0.14 (torchvision.models.inception.Inception3 with
// aux_logits=True). The aux head runs only in train mode, so in eval its layers are listed as
// not executed and the worker does not transmit them.
#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "models/internal/architectures.h"
#include "models/weight_init.h"

namespace pswitch::models::internal {
namespace {

namespace nn = torch::nn;

struct ConvSpec {
  int64_t kh, kw, stride = 1, ph = 0, pw = 0;
};

// torchvision BasicConv2d: conv (no bias) + BatchNorm(eps=1e-3) + functional ReLU.
class BasicConv2dImpl : public nn::Module {
 public:
  BasicConv2dImpl(int64_t in, int64_t out, ConvSpec spec, double init_std = 0.1)
      : init_std_(init_std) {
    conv_ = register_module("conv", nn::Conv2d(nn::Conv2dOptions(in, out, {spec.kh, spec.kw})
                                                   .stride(spec.stride)
                                                   .padding({spec.ph, spec.pw})
                                                   .bias(false)));
    bn_ = register_module("bn", nn::BatchNorm2d(nn::BatchNorm2dOptions(out).eps(0.001)));
  }
  at::Tensor Forward(LayerTape& tape, const at::Tensor& x) {
    at::Tensor y = RunLayer(tape, bn_, RunLayer(tape, conv_, x));
    return at::relu_(y);
  }
  double init_std() const { return init_std_; }

 private:
  const double init_std_;
  nn::Conv2d conv_{nullptr};
  nn::BatchNorm2d bn_{nullptr};
};
TORCH_MODULE(BasicConv2d);

ConvSpec K(int64_t k, int64_t stride = 1, int64_t pad = 0) { return {k, k, stride, pad, pad}; }
constexpr ConvSpec k1x7{1, 7, 1, 0, 3};
constexpr ConvSpec k7x1{7, 1, 1, 3, 0};
constexpr ConvSpec k1x3{1, 3, 1, 0, 1};
constexpr ConvSpec k3x1{3, 1, 1, 1, 0};

at::Tensor AvgPool3(const at::Tensor& x) { return at::avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}); }
at::Tensor MaxPool3s2(const at::Tensor& x) { return at::max_pool2d(x, {3, 3}, {2, 2}); }

// Every Inception block: a module whose children are BasicConv2d, registered by name.
class BlockImpl : public nn::Module {
 public:
  virtual at::Tensor Forward(LayerTape& tape, const at::Tensor& x) = 0;

 protected:
  BasicConv2d Add(const std::string& name, int64_t in, int64_t out, ConvSpec spec,
                  double init_std = 0.1) {
    return register_module(name, BasicConv2d(in, out, spec, init_std));
  }
};

class InceptionA : public BlockImpl {
 public:
  InceptionA(int64_t in, int64_t pool_features)
      : b1_(Add("branch1x1", in, 64, K(1))),
        b5_1_(Add("branch5x5_1", in, 48, K(1))),
        b5_2_(Add("branch5x5_2", 48, 64, K(5, 1, 2))),
        d1_(Add("branch3x3dbl_1", in, 64, K(1))),
        d2_(Add("branch3x3dbl_2", 64, 96, K(3, 1, 1))),
        d3_(Add("branch3x3dbl_3", 96, 96, K(3, 1, 1))),
        pool_(Add("branch_pool", in, pool_features, K(1))) {}
  at::Tensor Forward(LayerTape& t, const at::Tensor& x) override {
    at::Tensor a = b1_->Forward(t, x);
    at::Tensor b = b5_2_->Forward(t, b5_1_->Forward(t, x));
    at::Tensor c = d3_->Forward(t, d2_->Forward(t, d1_->Forward(t, x)));
    at::Tensor d = pool_->Forward(t, AvgPool3(x));
    return at::cat({a, b, c, d}, 1);
  }

 private:
  BasicConv2d b1_, b5_1_, b5_2_, d1_, d2_, d3_, pool_;
};

class InceptionB : public BlockImpl {
 public:
  explicit InceptionB(int64_t in)
      : b3_(Add("branch3x3", in, 384, K(3, 2))),
        d1_(Add("branch3x3dbl_1", in, 64, K(1))),
        d2_(Add("branch3x3dbl_2", 64, 96, K(3, 1, 1))),
        d3_(Add("branch3x3dbl_3", 96, 96, K(3, 2))) {}
  at::Tensor Forward(LayerTape& t, const at::Tensor& x) override {
    at::Tensor a = b3_->Forward(t, x);
    at::Tensor b = d3_->Forward(t, d2_->Forward(t, d1_->Forward(t, x)));
    return at::cat({a, b, MaxPool3s2(x)}, 1);
  }

 private:
  BasicConv2d b3_, d1_, d2_, d3_;
};

class InceptionC : public BlockImpl {
 public:
  InceptionC(int64_t in, int64_t c7)
      : b1_(Add("branch1x1", in, 192, K(1))),
        s1_(Add("branch7x7_1", in, c7, K(1))),
        s2_(Add("branch7x7_2", c7, c7, k1x7)),
        s3_(Add("branch7x7_3", c7, 192, k7x1)),
        d1_(Add("branch7x7dbl_1", in, c7, K(1))),
        d2_(Add("branch7x7dbl_2", c7, c7, k7x1)),
        d3_(Add("branch7x7dbl_3", c7, c7, k1x7)),
        d4_(Add("branch7x7dbl_4", c7, c7, k7x1)),
        d5_(Add("branch7x7dbl_5", c7, 192, k1x7)),
        pool_(Add("branch_pool", in, 192, K(1))) {}
  at::Tensor Forward(LayerTape& t, const at::Tensor& x) override {
    at::Tensor a = b1_->Forward(t, x);
    at::Tensor b = s3_->Forward(t, s2_->Forward(t, s1_->Forward(t, x)));
    at::Tensor c = d1_->Forward(t, x);
    for (auto* conv : {&d2_, &d3_, &d4_, &d5_}) c = (*conv)->Forward(t, c);
    at::Tensor d = pool_->Forward(t, AvgPool3(x));
    return at::cat({a, b, c, d}, 1);
  }

 private:
  BasicConv2d b1_, s1_, s2_, s3_, d1_, d2_, d3_, d4_, d5_, pool_;
};

class InceptionD : public BlockImpl {
 public:
  explicit InceptionD(int64_t in)
      : a1_(Add("branch3x3_1", in, 192, K(1))),
        a2_(Add("branch3x3_2", 192, 320, K(3, 2))),
        b1_(Add("branch7x7x3_1", in, 192, K(1))),
        b2_(Add("branch7x7x3_2", 192, 192, k1x7)),
        b3_(Add("branch7x7x3_3", 192, 192, k7x1)),
        b4_(Add("branch7x7x3_4", 192, 192, K(3, 2))) {}
  at::Tensor Forward(LayerTape& t, const at::Tensor& x) override {
    at::Tensor a = a2_->Forward(t, a1_->Forward(t, x));
    at::Tensor b = b4_->Forward(t, b3_->Forward(t, b2_->Forward(t, b1_->Forward(t, x))));
    return at::cat({a, b, MaxPool3s2(x)}, 1);
  }

 private:
  BasicConv2d a1_, a2_, b1_, b2_, b3_, b4_;
};

class InceptionE : public BlockImpl {
 public:
  explicit InceptionE(int64_t in)
      : b1_(Add("branch1x1", in, 320, K(1))),
        s1_(Add("branch3x3_1", in, 384, K(1))),
        s2a_(Add("branch3x3_2a", 384, 384, k1x3)),
        s2b_(Add("branch3x3_2b", 384, 384, k3x1)),
        d1_(Add("branch3x3dbl_1", in, 448, K(1))),
        d2_(Add("branch3x3dbl_2", 448, 384, K(3, 1, 1))),
        d3a_(Add("branch3x3dbl_3a", 384, 384, k1x3)),
        d3b_(Add("branch3x3dbl_3b", 384, 384, k3x1)),
        pool_(Add("branch_pool", in, 192, K(1))) {}
  at::Tensor Forward(LayerTape& t, const at::Tensor& x) override {
    at::Tensor a = b1_->Forward(t, x);
    at::Tensor s = s1_->Forward(t, x);
    at::Tensor b = at::cat({s2a_->Forward(t, s), s2b_->Forward(t, s)}, 1);
    at::Tensor d = d2_->Forward(t, d1_->Forward(t, x));
    at::Tensor c = at::cat({d3a_->Forward(t, d), d3b_->Forward(t, d)}, 1);
    at::Tensor p = pool_->Forward(t, AvgPool3(x));
    return at::cat({a, b, c, p}, 1);
  }

 private:
  BasicConv2d b1_, s1_, s2a_, s2b_, d1_, d2_, d3a_, d3b_, pool_;
};

class InceptionAux : public BlockImpl {
 public:
  InceptionAux(int64_t in, int64_t num_classes)
      : conv0_(Add("conv0", in, 128, K(1))), conv1_(Add("conv1", 128, 768, K(5), 0.01)) {
    fc_ = register_module("fc", nn::Linear(768, num_classes));
  }
  at::Tensor Forward(LayerTape& t, const at::Tensor& x) override {
    at::Tensor y = conv1_->Forward(t, conv0_->Forward(t, at::avg_pool2d(x, {5, 5}, {3, 3})));
    return RunLayer(t, fc_, at::adaptive_avg_pool2d(y, {1, 1}).flatten(1));
  }
  nn::Linear& fc() { return fc_; }

 private:
  BasicConv2d conv0_, conv1_;
  nn::Linear fc_{nullptr};
};

class InceptionV3 : public ZooModel {
 public:
  InceptionV3(const std::string& name, const ModelConfig& config)
      : ZooModel(name),
        image_size_(config.Get("image_size")),
        transform_input_(config.Get("transform_input") != 0) {
    const int64_t classes = config.Get("num_classes");
    stem_ = {Conv("Conv2d_1a_3x3", 3, 32, K(3, 2)), Conv("Conv2d_2a_3x3", 32, 32, K(3)),
             Conv("Conv2d_2b_3x3", 32, 64, K(3, 1, 1))};
    maxpool1_ = register_module("maxpool1", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2)));
    stem2_ = {Conv("Conv2d_3b_1x1", 64, 80, K(1)), Conv("Conv2d_4a_3x3", 80, 192, K(3))};
    maxpool2_ = register_module("maxpool2", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2)));
    Block("Mixed_5b", std::make_shared<InceptionA>(192, 32), &mixed_);
    Block("Mixed_5c", std::make_shared<InceptionA>(256, 64), &mixed_);
    Block("Mixed_5d", std::make_shared<InceptionA>(288, 64), &mixed_);
    Block("Mixed_6a", std::make_shared<InceptionB>(288), &mixed_);
    Block("Mixed_6b", std::make_shared<InceptionC>(768, 128), &mixed_);
    Block("Mixed_6c", std::make_shared<InceptionC>(768, 160), &mixed_);
    Block("Mixed_6d", std::make_shared<InceptionC>(768, 160), &mixed_);
    Block("Mixed_6e", std::make_shared<InceptionC>(768, 192), &mixed_);
    aux_ = register_module("AuxLogits", std::make_shared<InceptionAux>(768, classes));
    Block("Mixed_7a", std::make_shared<InceptionD>(768), &late_);
    Block("Mixed_7b", std::make_shared<InceptionE>(1280), &late_);
    Block("Mixed_7c", std::make_shared<InceptionE>(2048), &late_);
    avgpool_ = register_module("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)));
    dropout_ = register_module("dropout", nn::Dropout(0.5));
    fc_ = register_module("fc", nn::Linear(2048, classes));
    Initialize();
  }

  ModelInput MakeExampleInput(int64_t batch, uint64_t seed, c10::Device device) const override {
    return {at::randn({batch, 3, image_size_, image_size_}, SeededGenerator(seed, device),
                      at::TensorOptions().device(device)),
            {},
            {}};
  }
  // torchvision's training loss for Inception: main + 0.4 * aux.
  at::Tensor Loss(const ModelOutput& out, const at::Tensor& target) const override {
    at::Tensor loss = ZooModel::Loss(out, target);
    if (out.aux.defined()) loss = loss + 0.4 * ZooModel::Loss({out.aux, {}}, target);
    return loss;
  }

 protected:
  ModelOutput ForwardImpl(const ModelInput& in) override {
    at::Tensor x = in.input;
    if (transform_input_) {
      x = at::cat({x.select(1, 0).unsqueeze(1) * (0.229 / 0.5) + (0.485 - 0.5) / 0.5,
                   x.select(1, 1).unsqueeze(1) * (0.224 / 0.5) + (0.456 - 0.5) / 0.5,
                   x.select(1, 2).unsqueeze(1) * (0.225 / 0.5) + (0.406 - 0.5) / 0.5},
                  1);
    }
    for (auto& conv : stem_) x = conv->Forward(tape(), x);
    x = RunLayer(tape(), maxpool1_, x);
    for (auto& conv : stem2_) x = conv->Forward(tape(), x);
    x = RunLayer(tape(), maxpool2_, x);
    for (auto& block : mixed_) x = block->Forward(tape(), x);
    ModelOutput out;
    if (is_training()) out.aux = aux_->Forward(tape(), x);
    for (auto& block : late_) x = block->Forward(tape(), x);
    x = RunLayer(tape(), avgpool_, x);
    x = RunLayer(tape(), dropout_, x);
    out.output = RunLayer(tape(), fc_, x.flatten(1));
    return out;
  }
  // Eval runs on inputs down to 75 pixels; the aux head (train mode) needs Mixed_6e maps of at
  // least 17x17 for its 5x5/3 pooling and 5x5 conv, i.e. the full 299-pixel input.
  ModelInput TraceInput() const override {
    at::Generator gen = at::detail::createCPUGenerator(0);
    const int64_t size = is_training() ? 299 : 75;
    return {at::randn({2, 3, size, size}, gen), {}, {}};
  }

 private:
  BasicConv2d Conv(const std::string& name, int64_t in, int64_t out, ConvSpec spec) {
    return register_module(name, BasicConv2d(in, out, spec));
  }
  void Block(const std::string& name, std::shared_ptr<BlockImpl> block,
             std::vector<std::shared_ptr<BlockImpl>>* list) {
    list->push_back(register_module(name, std::move(block)));
  }
  // torchvision: trunc_normal(std=0.1; 0.01 aux conv1; 0.001 aux fc) on conv/linear weights.
  // With |x| <= 2 and std <= 0.1 the truncation is a 20-sigma event, so a clamp is equivalent.
  void Initialize() {
    if (!InitWeights()) return;
    torch::NoGradGuard no_grad;
    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* basic = module->as<BasicConv2dImpl>()) {
        for (auto& child : basic->modules(/*include_self=*/false)) {
          if (auto* conv = child->as<nn::Conv2d>()) {
            conv->weight.normal_(0, basic->init_std()).clamp_(-2, 2);
          }
        }
      }
    }
    for (auto* linear : {fc_.get(), aux_->fc().get()}) {
      const double std = linear == fc_.get() ? 0.1 : 0.001;
      linear->weight.normal_(0, std).clamp_(-2, 2);
    }
  }

  const int64_t image_size_;
  const bool transform_input_;
  std::vector<BasicConv2d> stem_, stem2_;
  nn::MaxPool2d maxpool1_{nullptr}, maxpool2_{nullptr};
  std::vector<std::shared_ptr<BlockImpl>> mixed_, late_;
  std::shared_ptr<InceptionAux> aux_;
  nn::AdaptiveAvgPool2d avgpool_{nullptr};
  nn::Dropout dropout_{nullptr};
  nn::Linear fc_{nullptr};
};

}  // namespace

std::shared_ptr<ZooModel> MakeInceptionV3(const std::string& name, const ModelConfig& config) {
  return std::make_shared<InceptionV3>(name, config);
}

}  // namespace pswitch::models::internal
