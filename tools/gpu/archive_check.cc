// Loads pswitch.export archives with this libtorch, runs them on their recorded input (gate
// operator registered as a counter) and compares with Python's output.
#include <torch/script.h>
#include <torch/library.h>
#include <torch/version.h>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

static int gates = 0;
void Gate(int64_t) { ++gates; }
TORCH_LIBRARY(pswitch, m) {
  m.def(torch::schema("gate(int layer) -> ()", c10::AliasAnalysisKind::CONSERVATIVE), &Gate);
}

std::map<std::string, at::Tensor> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n; in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0'); in.read(header.data(), n);
  std::string rest((std::istreambuf_iterator<char>(in)), {});
  auto j = nlohmann::json::parse(header);
  std::map<std::string, at::Tensor> out;
  for (auto& [k, v] : j.items()) {
    if (k == "__metadata__") continue;
    std::vector<int64_t> shape = v["shape"];
    auto dtype = v["dtype"] == "F32" ? at::kFloat : at::kLong;
    size_t b = v["data_offsets"][0];
    out[k] = torch::from_blob(rest.data() + b, shape, dtype).clone();
  }
  return out;
}

int main(int argc, char** argv) {
  int failed = 0;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    try {
      torch::jit::ExtraFilesMap extra{{"pswitch/layers.json", ""}, {"pswitch/loss.pt", ""}};
      auto m = torch::jit::load(name + ".pswitch.pt", c10::Device(c10::kCPU), extra);
      auto io = ReadSafetensors(name + ".io.safetensors");
      m.eval();
      gates = 0;
      std::vector<c10::IValue> inputs;  // in the forward's order, as pswitchd passes them
      for (const char* key : {"input", "attention_mask", "token_type_ids"}) {
        if (io.count(key)) inputs.push_back(io[key]);
      }
      at::Tensor y = m.forward(inputs).toTensor();
      double diff = (y - io["output"]).abs().max().item<double>();
      std::istringstream loss_bytes(extra["pswitch/loss.pt"]);
      auto loss = torch::jit::load(loss_bytes);
      std::cout << name << ": torch " << TORCH_VERSION << " loads it (table "
                << extra["pswitch/layers.json"].size() << " bytes, loss archive loads), "
                << gates << " gate calls, max |diff| vs torch 1.13 in Python " << diff << "\n";
      if (diff > 1e-4 || gates == 0) ++failed;
    } catch (const std::exception& e) {
      std::cout << name << ": FAILED " << e.what() << "\n";
      ++failed;
    }
  }
  return failed;
}
