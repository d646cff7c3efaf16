#include "memdaemon/synthetic_model.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace pswitch::memdaemon {

std::unique_ptr<SyntheticModel> MakeSyntheticModel(const std::string& name, uint32_t num_layers,
                                                   uint64_t total_bytes, uint32_t seed) {
  auto out = std::make_unique<SyntheticModel>();
  out->model.name = name;
  // Relative sizes: conv-like layers grow linearly with depth, norm layers are 1/64 of a conv.
  std::vector<double> weight(num_layers);
  double sum = 0;
  for (uint32_t l = 0; l < num_layers; ++l) {
    weight[l] = (l % 2 == 0) ? 1.0 + 4.0 * l / num_layers : (1.0 + 4.0 * l / num_layers) / 64;
    sum += weight[l];
  }
  for (uint32_t l = 0; l < num_layers; ++l) {
    bool conv = l % 2 == 0;
    uint64_t bytes = static_cast<uint64_t>(weight[l] / sum * static_cast<double>(total_bytes));
    bytes = std::max<uint64_t>(4, bytes & ~uint64_t{3});
    LayerBytes layer{absl::StrCat(conv ? "conv" : "bn", l), {}};
    // A norm layer has two tensors, as BatchNorm has weight and bias (plus running stats).
    std::vector<uint64_t> parts = conv
                                      ? std::vector<uint64_t>{bytes}
                                      : std::vector<uint64_t>{bytes / 8 * 4, bytes - bytes / 8 * 4};
    for (size_t t = 0; t < parts.size(); ++t) {
      std::vector<std::byte> data(parts[t]);
      uint32_t x = seed * 2654435761u + static_cast<uint32_t>(out->storage.size()) * 40503u + 1;
      for (size_t i = 0; i + 4 <= data.size(); i += 4) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        std::memcpy(&data[i], &x, 4);
      }
      out->storage.push_back(std::move(data));
      layer.tensors.push_back(
          TensorBytes{absl::StrCat(layer.name, t == 0 ? ".weight" : ".bias"), out->storage.back()});
    }
    out->model.layers.push_back(std::move(layer));
  }
  return out;
}

}  // namespace pswitch::memdaemon
