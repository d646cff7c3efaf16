// ResNet, VGG-19 and the tiny test models, ported from torchvision 0.14 (same module tree, names,
// forward order and initialisation).
#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "models/internal/architectures.h"
#include "models/weight_init.h"

namespace pswitch::models::internal {
namespace {

namespace nn = torch::nn;

at::Tensor RunSequential(LayerTape& tape, nn::Sequential& seq, at::Tensor x) {
  for (auto& module : *seq) {
    tape.Enter(module.ptr().get());
    x = module.forward(x);
  }
  return x;
}

at::Tensor RandomImages(int64_t batch, int64_t size, uint64_t seed, c10::Device device) {
  return at::randn({batch, 3, size, size}, SeededGenerator(seed, device),
                   at::TensorOptions().dtype(at::kFloat).device(device));
}

nn::Conv2d Conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
}

// torchvision BasicBlock (expansion 1) or Bottleneck (expansion 4).
class ResidualBlockImpl : public nn::Module {
 public:
  ResidualBlockImpl(bool bottleneck, int64_t inplanes, int64_t planes, int64_t stride)
      : bottleneck_(bottleneck) {
    const int64_t out = planes * (bottleneck ? 4 : 1);
    if (bottleneck) {
      conv1_ = register_module("conv1", Conv(inplanes, planes, 1, 1, 0));
      bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
      conv2_ = register_module("conv2", Conv(planes, planes, 3, stride, 1));
      bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
      conv3_ = register_module("conv3", Conv(planes, out, 1, 1, 0));
      bn3_ = register_module("bn3", nn::BatchNorm2d(out));
    } else {
      conv1_ = register_module("conv1", Conv(inplanes, planes, 3, stride, 1));
      bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
      conv2_ = register_module("conv2", Conv(planes, planes, 3, 1, 1));
      bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
    }
    relu_ = register_module("relu", nn::ReLU(nn::ReLUOptions(true)));
    if (stride != 1 || inplanes != out) {
      downsample_ = register_module(
          "downsample", nn::Sequential(Conv(inplanes, out, 1, stride, 0), nn::BatchNorm2d(out)));
    }
  }

  at::Tensor Forward(LayerTape& tape, const at::Tensor& x) {
    at::Tensor out = RunLayer(tape, conv1_, x);
    out = RunLayer(tape, bn1_, out);
    out = RunLayer(tape, relu_, out);
    out = RunLayer(tape, conv2_, out);
    out = RunLayer(tape, bn2_, out);
    if (bottleneck_) {
      out = RunLayer(tape, relu_, out);
      out = RunLayer(tape, conv3_, out);
      out = RunLayer(tape, bn3_, out);
    }
    at::Tensor identity = downsample_ ? RunSequential(tape, downsample_, x) : x;
    out += identity;
    return RunLayer(tape, relu_, out);
  }

 private:
  const bool bottleneck_;
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  nn::ReLU relu_{nullptr};
  nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(ResidualBlock);

void InitConvsAndNorms(nn::Module& root) {
  if (!InitWeights()) return;
  for (auto& module : root.modules(/*include_self=*/false)) {
    if (auto* conv = module->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(conv->weight, 0, torch::kFanOut, torch::kReLU);
      if (conv->bias.defined()) nn::init::zeros_(conv->bias);
    } else if (auto* bn = module->as<nn::BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  }
}

class ResNet : public ZooModel {
 public:
  ResNet(const std::string& name, const ModelConfig& config)
      : ZooModel(name), image_size_(config.Get("image_size")) {
    const int64_t depth = config.Get("depth");
    std::vector<int64_t> blocks;
    bool bottleneck = true;
    if (depth == 18) {
      blocks = {2, 2, 2, 2}, bottleneck = false;
    } else if (depth == 34) {
      blocks = {3, 4, 6, 3}, bottleneck = false;
    } else if (depth == 50) {
      blocks = {3, 4, 6, 3};
    } else if (depth == 101) {
      blocks = {3, 4, 23, 3};
    } else if (depth == 152) {
      blocks = {3, 8, 36, 3};
    } else {
      TORCH_CHECK(false, "unsupported ResNet depth ", depth);
    }
    conv1_ = register_module("conv1", Conv(3, 64, 7, 2, 3));
    bn1_ = register_module("bn1", nn::BatchNorm2d(64));
    relu_ = register_module("relu", nn::ReLU(nn::ReLUOptions(true)));
    maxpool_ =
        register_module("maxpool", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
    int64_t inplanes = 64;
    const int64_t expansion = bottleneck ? 4 : 1;
    for (int stage = 0; stage < 4; ++stage) {
      const int64_t planes = 64 << stage;
      nn::ModuleList list;
      for (int64_t b = 0; b < blocks[stage]; ++b) {
        ResidualBlock block(bottleneck, inplanes, planes, (b == 0 && stage > 0) ? 2 : 1);
        inplanes = planes * expansion;
        list->push_back(block);
        blocks_.push_back(block);
      }
      register_module(absl::StrCat("layer", stage + 1), list);
    }
    avgpool_ = register_module("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)));
    fc_ = register_module("fc", nn::Linear(512 * expansion, config.Get("num_classes")));
    InitConvsAndNorms(*this);
  }

  ModelInput MakeExampleInput(int64_t batch, uint64_t seed, c10::Device device) const override {
    return {RandomImages(batch, image_size_, seed, device), {}, {}};
  }

 protected:
  ModelOutput ForwardImpl(const ModelInput& in) override {
    at::Tensor x = RunLayer(tape(), conv1_, in.input);
    x = RunLayer(tape(), bn1_, x);
    x = RunLayer(tape(), relu_, x);
    x = RunLayer(tape(), maxpool_, x);
    for (auto& block : blocks_) x = block->Forward(tape(), x);
    x = RunLayer(tape(), avgpool_, x);
    return {RunLayer(tape(), fc_, x.flatten(1)), {}};
  }
  ModelInput TraceInput() const override { return {RandomImages(2, 32, 0, c10::kCPU), {}, {}}; }

 private:
  const int64_t image_size_;
  nn::Conv2d conv1_{nullptr};
  nn::BatchNorm2d bn1_{nullptr};
  nn::ReLU relu_{nullptr};
  nn::MaxPool2d maxpool_{nullptr};
  std::vector<ResidualBlock> blocks_;
  nn::AdaptiveAvgPool2d avgpool_{nullptr};
  nn::Linear fc_{nullptr};
};

class Vgg19 : public ZooModel {
 public:
  Vgg19(const std::string& name, const ModelConfig& config)
      : ZooModel(name), image_size_(config.Get("image_size")) {
    const std::vector<int64_t> cfg = {64,  64,  0,   128, 128, 0,   256, 256, 256, 256, 0,
                                      512, 512, 512, 512, 0,   512, 512, 512, 512, 0};  // 0 = "M"
    features_ = register_module("features", nn::Sequential());
    int64_t in = 3;
    for (int64_t v : cfg) {
      if (v == 0) {
        features_->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2).stride(2)));
      } else {
        features_->push_back(nn::Conv2d(nn::Conv2dOptions(in, v, 3).padding(1)));
        features_->push_back(nn::ReLU(nn::ReLUOptions(true)));
        in = v;
      }
    }
    avgpool_ = register_module("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(7)));
    classifier_ = register_module(
        "classifier",
        nn::Sequential(nn::Linear(512 * 7 * 7, 4096), nn::ReLU(nn::ReLUOptions(true)),
                       nn::Dropout(0.5), nn::Linear(4096, 4096), nn::ReLU(nn::ReLUOptions(true)),
                       nn::Dropout(0.5), nn::Linear(4096, config.Get("num_classes"))));
    InitConvsAndNorms(*this);
    for (auto& module : modules(/*include_self=*/false)) {
      if (!InitWeights()) break;
      if (auto* linear = module->as<nn::Linear>()) {
        nn::init::normal_(linear->weight, 0, 0.01);
        nn::init::zeros_(linear->bias);
      }
    }
  }

  ModelInput MakeExampleInput(int64_t batch, uint64_t seed, c10::Device device) const override {
    return {RandomImages(batch, image_size_, seed, device), {}, {}};
  }

 protected:
  ModelOutput ForwardImpl(const ModelInput& in) override {
    at::Tensor x = RunSequential(tape(), features_, in.input);
    x = RunLayer(tape(), avgpool_, x);
    return {RunSequential(tape(), classifier_, x.flatten(1)), {}};
  }
  ModelInput TraceInput() const override { return {RandomImages(2, 32, 0, c10::kCPU), {}, {}}; }

 private:
  const int64_t image_size_;
  nn::Sequential features_{nullptr};
  nn::AdaptiveAvgPool2d avgpool_{nullptr};
  nn::Sequential classifier_{nullptr};
};

class TinyMlp : public ZooModel {
 public:
  TinyMlp(const std::string& name, const ModelConfig& config) : ZooModel(name) {
    fc1_ = register_module("fc1", nn::Linear(64, config.Get("hidden")));
    relu_ = register_module("relu", nn::ReLU());
    fc2_ = register_module("fc2", nn::Linear(config.Get("hidden"), config.Get("num_classes")));
  }
  ModelInput MakeExampleInput(int64_t batch, uint64_t seed, c10::Device device) const override {
    return {at::randn({batch, 64}, SeededGenerator(seed, device),
                      at::TensorOptions().dtype(at::kFloat).device(device)),
            {},
            {}};
  }

 protected:
  ModelOutput ForwardImpl(const ModelInput& in) override {
    at::Tensor x = RunLayer(tape(), fc1_, in.input);
    x = RunLayer(tape(), relu_, x);
    return {RunLayer(tape(), fc2_, x), {}};
  }

 private:
  nn::Linear fc1_{nullptr}, fc2_{nullptr};
  nn::ReLU relu_{nullptr};
};

class TinyCnn : public ZooModel {
 public:
  TinyCnn(const std::string& name, const ModelConfig& config) : ZooModel(name) {
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)));
    bn1_ = register_module("bn1", nn::BatchNorm2d(8));
    relu_ = register_module("relu", nn::ReLU());
    pool_ = register_module("pool", nn::MaxPool2d(nn::MaxPool2dOptions(2)));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(8, 16, 3).padding(1)));
    bn2_ = register_module("bn2", nn::BatchNorm2d(16));
    dropout_ = register_module("dropout", nn::Dropout(0.25));
    avgpool_ = register_module("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)));
    fc_ = register_module("fc", nn::Linear(16, config.Get("num_classes")));
  }
  ModelInput MakeExampleInput(int64_t batch, uint64_t seed, c10::Device device) const override {
    return {RandomImages(batch, 16, seed, device), {}, {}};
  }

 protected:
  ModelOutput ForwardImpl(const ModelInput& in) override {
    at::Tensor x = RunLayer(tape(), conv1_, in.input);
    x = RunLayer(tape(), bn1_, x);
    x = RunLayer(tape(), relu_, x);
    x = RunLayer(tape(), pool_, x);
    x = RunLayer(tape(), conv2_, x);
    x = RunLayer(tape(), bn2_, x);
    x = RunLayer(tape(), relu_, x);
    x = RunLayer(tape(), dropout_, x);
    x = RunLayer(tape(), avgpool_, x);
    return {RunLayer(tape(), fc_, x.flatten(1)), {}};
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  nn::ReLU relu_{nullptr};
  nn::MaxPool2d pool_{nullptr};
  nn::Dropout dropout_{nullptr};
  nn::AdaptiveAvgPool2d avgpool_{nullptr};
  nn::Linear fc_{nullptr};
};

}  // namespace

std::shared_ptr<ZooModel> MakeResNet(const std::string& name, const ModelConfig& config) {
  return std::make_shared<ResNet>(name, config);
}
std::shared_ptr<ZooModel> MakeVgg19(const std::string& name, const ModelConfig& config) {
  return std::make_shared<Vgg19>(name, config);
}
std::shared_ptr<ZooModel> MakeTinyMlp(const std::string& name, const ModelConfig& config) {
  return std::make_shared<TinyMlp>(name, config);
}
std::shared_ptr<ZooModel> MakeTinyCnn(const std::string& name, const ModelConfig& config) {
  return std::make_shared<TinyCnn>(name, config);
}

}  // namespace pswitch::models::internal
