#include "models/script_model.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/library.h>
#include <torch/nn/functional/loss.h>
#include <torch/script.h>

#include <array>
#include <exception>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/json.h"
#include "base/status.h"
#include "models/registry.h"
#include "models/torch_version.h"

namespace pswitch::models {
namespace {

constexpr int kTableFormat = 1;
constexpr size_t kMaxGates = 1 << 16;
constexpr size_t kMaxTableBytes = 16 << 20;
constexpr int64_t kMaxSampleElements = int64_t{1} << 28;
constexpr char kRootLayerName[] = "(model)";

class ScriptModel;

// The model whose forward pass runs on this thread: the gate operator's target.
thread_local ScriptModel* active_model = nullptr;

void GateOp(int64_t layer);

TORCH_LIBRARY(pswitch, m) {
  // CONSERVATIVE: the call has effects TorchScript cannot see, so passes keep it in place.
  m.def(torch::schema("gate(int layer) -> ()", c10::AliasAnalysisKind::CONSERVATIVE), &GateOp);
}

struct TensorSpecEntry {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;  // the example's, batch first
  int64_t high = 1;            // int64: exclusive bound for random values
};

struct LayerTable {
  std::string method;
  std::string torch_version;
  std::vector<std::string> gates;  // gate id -> module path; gates[0] == ""
  TensorSpecEntry input;
  // Further inputs, in the forward's argument order after `input` (kInputNames' order).
  std::optional<TensorSpecEntry> attention_mask, token_type_ids;
  std::optional<TensorSpecEntry> target;
  bool loss = false;
};

absl::Status TableError(const std::string& origin, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("archive '", origin, "': layer table ", kLayerTableFile, ": ", what));
}

absl::StatusOr<TensorSpecEntry> ParseSpec(const nlohmann::json& j, const std::string& origin,
                                          const std::string& what, bool allow_float,
                                          bool allow_int) {
  if (!j.is_object()) return TableError(origin, absl::StrCat(what, " is not an object"));
  TensorSpecEntry spec;
  auto dtype = j.find("dtype");
  if (dtype == j.end() || !dtype->is_string()) {
    return TableError(origin, absl::StrCat(what, " has no \"dtype\""));
  }
  if (*dtype == "float32" && allow_float) {
    spec.dtype = at::kFloat;
  } else if (*dtype == "float16" && allow_float) {
    spec.dtype = at::kHalf;
  } else if (*dtype == "bfloat16" && allow_float) {
    spec.dtype = at::kBFloat16;
  } else if (*dtype == "int64" && allow_int) {
    spec.dtype = at::kLong;
  } else {
    return TableError(origin, absl::StrCat(what, " dtype ", dtype->dump(), " is not supported (",
                                           allow_float ? "float32, float16, bfloat16" : "",
                                           allow_float && allow_int ? " or " : "",
                                           allow_int ? "int64" : "", ")"));
  }
  auto shape = j.find("shape");
  if (shape == j.end() || !shape->is_array() || shape->empty() || shape->size() > 8) {
    return TableError(origin, absl::StrCat(what, " needs a \"shape\" of 1 to 8 dimensions"));
  }
  int64_t elements = 1;
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() < 1 || d.get<uint64_t>() > (1u << 24)) {
      return TableError(origin, absl::StrCat(what, " shape ", shape->dump(), " is not positive"));
    }
    spec.shape.push_back(d.get<int64_t>());
    if (spec.shape.size() > 1) elements *= spec.shape.back();
    if (elements > kMaxSampleElements) {
      return TableError(origin, absl::StrCat(what, " shape ", shape->dump(), " is too large"));
    }
  }
  if (spec.dtype == at::kLong) {
    auto high = j.find("high");
    if (high == j.end() || !high->is_number_integer() || high->get<int64_t>() < 1) {
      return TableError(origin, absl::StrCat(what, " (int64) needs a positive \"high\""));
    }
    spec.high = high->get<int64_t>();
  }
  return spec;
}

absl::StatusOr<LayerTable> ParseTable(const std::string& text, const std::string& origin) {
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "archive '", origin, "' has no layer table (", kLayerTableFile,
        "): export the model with pswitch.export; a plain torch.jit.save file has no gates"));
  }
  if (text.size() > kMaxTableBytes) return TableError(origin, "over 16 MiB");
  PSWITCH_ASSIGN_OR_RETURN(nlohmann::json j,
                           base::ParseUntrustedJson(text, absl::StrCat("archive '", origin, "'")));
  if (!j.is_object()) return TableError(origin, "not a JSON object");
  auto format = j.find("format");
  if (format == j.end() || !format->is_number_integer() || format->get<int64_t>() != kTableFormat) {
    return TableError(origin, absl::StrCat("format must be ", kTableFormat,
                                           " (made by another pswitch version?)"));
  }
  LayerTable table;
  if (auto m = j.find("method"); m != j.end() && m->is_string()) table.method = *m;
  if (auto t = j.find("torch"); t != j.end() && t->is_string()) table.torch_version = *t;
  auto gates = j.find("gates");
  if (gates == j.end() || !gates->is_array() || gates->empty() || gates->size() > kMaxGates) {
    return TableError(origin, "\"gates\" must list 1 to 65536 module paths");
  }
  std::set<std::string> seen;
  for (const auto& g : *gates) {
    if (!g.is_string()) return TableError(origin, "\"gates\" holds a non-string");
    if (!seen.insert(g.get<std::string>()).second) {
      return TableError(origin, absl::StrCat("module '", g.get<std::string>(), "' gated twice"));
    }
    table.gates.push_back(g.get<std::string>());
  }
  if (!table.gates[0].empty()) {
    return TableError(origin, "gate 0 must be the model itself (\"\")");
  }
  // The names clients send inputs under, in the forward's argument order.
  static constexpr const char* kInputNames[] = {"input", "attention_mask", "token_type_ids"};
  auto inputs = j.find("inputs");
  if (inputs == j.end() || !inputs->is_array() || inputs->empty() || inputs->size() > 3) {
    return TableError(origin, "\"inputs\" must describe 1 to 3 input tensors");
  }
  for (size_t i = 0; i < inputs->size(); ++i) {
    const nlohmann::json& entry = (*inputs)[i];
    auto name = entry.is_object() ? entry.find("name") : entry.end();
    if (name == entry.end() || !name->is_string() || *name != kInputNames[i]) {
      return TableError(origin, absl::StrCat("input ", i, " must be named '", kInputNames[i],
                                             "' (inputs follow the forward's argument order)"));
    }
    PSWITCH_ASSIGN_OR_RETURN(TensorSpecEntry spec,
                             ParseSpec(entry, origin, kInputNames[i], true, true));
    if (i > 0 && spec.shape[0] != table.input.shape[0]) {
      return TableError(origin, absl::StrCat(kInputNames[i], "'s batch differs from the input's"));
    }
    (i == 0   ? table.input
     : i == 1 ? table.attention_mask.emplace()
              : table.token_type_ids.emplace()) = std::move(spec);
  }
  if (auto target = j.find("target"); target != j.end() && !target->is_null()) {
    PSWITCH_ASSIGN_OR_RETURN(table.target, ParseSpec(*target, origin, "target", true, true));
  }
  if (auto loss = j.find("loss"); loss != j.end()) {
    if (!loss->is_boolean()) return TableError(origin, "\"loss\" must be a boolean");
    table.loss = loss->get<bool>();
  }
  if (table.loss && !table.target.has_value()) {
    return TableError(origin, "a loss needs a \"target\"");
  }
  return table;
}

// What an archive's code may call: ATen and TorchScript's own operators and the gate, minus those
// that reach the file system (torch.from_file maps any file the server can open), run code on
// other threads (fork: its gates would not reach the worker), or can address memory outside the
// tensors they are given. Custom operators and TorchBind classes (some open files or sockets) are
// refused. An archive is code pswitchd runs: this closes the known ways out of the tensor world,
// it does not make a hostile archive safe (docs/export.md).
//
// Memory. A worker's tensors are views into one shared arena (weights, other workers' leases),
// so an operator that builds a view from raw numbers (a storage offset, strides, a storage) reads
// and writes neighbours when its bounds check can be overflowed or is absent: as_strided and its
// variants, set_ with a storage or offset, _reshape_alias, empty_strided's strides, the nested
// tensor's raw view, and every layout whose metadata is a tensor the program can write (sparse
// indices, quantized and MKL-DNN tensors) so that later kernels index past the values. Private
// ATen operators (aten::_x) skip argument checks by design; only those TorchScript itself emits
// for nn modules and tracing are admitted (kAllowedPrivateOperators).
// clang-format off
constexpr const char* kAllowedNamespaces[] = {"aten::", "prim::", "pswitch::"};
constexpr const char* kRefusedOperators[] = {
    // Files, threads, raw pointers.
    "aten::from_file", "prim::fork", "aten::wait", "prim::awaitable", "aten::data_ptr",
    // Views from raw offsets and strides.
    "aten::as_strided", "aten::as_strided_", "aten::as_strided_scatter",
    "aten::as_strided_copy", "aten::set", "aten::set_", "aten::empty_strided",
    "aten::new_empty_strided", "aten::segment_reduce",
    // Storage resizing: a view grown over its storage's spare bytes.
    "aten::resize", "aten::resize_", "aten::resize_as", "aten::resize_as_",
    "aten::resize_as_sparse_",
    // Unchecked by name.
    "aten::unsafe_split", "aten::unsafe_split_with_sizes", "aten::unsafe_chunk",
    // Tensors whose indexing metadata is itself a writable tensor (sparse indices, nested
    // sizes) or an opaque layout.
    "aten::indices", "aten::crow_indices", "aten::col_indices", "aten::ccol_indices",
    "aten::row_indices", "aten::sparse_mask", "aten::int_repr", "aten::dequantize",
    "aten::quantize_per_tensor", "aten::quantize_per_tensor_dynamic",
    "aten::quantize_per_channel",
};
// Families refused by prefix (after the namespace).
constexpr const char* kRefusedPrefixes[] = {
    "aten::sparse_", "aten::to_sparse", "aten::to_mkldnn", "aten::mkldnn_", "aten::q_",
    "aten::fbgemm_", "aten::nested_", "aten::unsafe_",
};
// Private operators that TorchScript emits for nn modules (transformer fast paths, tracing's
// convolution, interpolation) or for script builtins; each checks its arguments.
constexpr const char* kAllowedPrivateOperators[] = {
    "aten::_convolution", "aten::_convolution_mode", "aten::_softmax", "aten::_log_softmax",
    "aten::_batch_norm_impl_index", "aten::_native_multi_head_attention",
    "aten::_transformer_encoder_layer_fwd", "aten::_nested_tensor_from_mask",
    "aten::_nested_tensor_from_mask_left_aligned", "aten::_masked_softmax",
    "aten::_set_item", "aten::_shape_as_tensor", "aten::_reshape_from_tensor",
    "aten::_dim_arange", "aten::_to_copy", "aten::_adaptive_avg_pool2d",
    "aten::_adaptive_avg_pool3d", "aten::_weight_norm", "aten::_weight_norm_interface",
    "aten::_pack_padded_sequence", "aten::_pad_packed_sequence", "aten::_infer_size",
    "aten::_pad_circular", "aten::_pad_enum", "aten::_unique", "aten::_unique2",
    "aten::_aminmax", "aten::_cdist_forward", "aten::_euclidean_dist", "aten::_assert_async",
    "aten::_scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math",
    "aten::_fused_sdp_choice", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_list_to_tensor",
    "aten::_tensor_to_list", "aten::_no_grad_uniform_", "aten::_no_grad_normal_",
    "aten::_no_grad_fill_", "aten::_no_grad_zero_", "aten::_get_tracing_state",
    "aten::_hash_tensor",
};
constexpr const char* kAllowedPrivatePrefixes[] = {"aten::_upsample_", "aten::_cast_"};
// clang-format on

// OK when every element `tensor` can address lies in its own storage (strides >= 0, no overflow):
// the archive's pickles set a tensor's offset, sizes and strides without libtorch checking them.
absl::Status CheckInsideStorage(const at::Tensor& tensor, const std::string& what) {
  if (!tensor.defined() || tensor.is_sparse() || tensor.is_mkldnn() || tensor.is_quantized() ||
      tensor.is_nested()) {
    return tensor.defined() ? absl::InvalidArgumentError(absl::StrCat(what, " is not strided"))
                            : absl::OkStatus();
  }
  if (tensor.numel() == 0) return absl::OkStatus();
  uint64_t last = 0;  // the highest element index reached, from the storage's start
  bool overflow = tensor.storage_offset() < 0;
  if (!overflow) last = static_cast<uint64_t>(tensor.storage_offset());
  for (int64_t d = 0; d < tensor.dim() && !overflow; ++d) {
    const int64_t stride = tensor.stride(d);
    uint64_t span = 0;
    overflow |= stride < 0 ||
                __builtin_mul_overflow(static_cast<uint64_t>(tensor.size(d) - 1),
                                       static_cast<uint64_t>(stride), &span) ||
                __builtin_add_overflow(last, span, &last);
  }
  uint64_t end_bytes = 0;
  overflow = overflow || __builtin_add_overflow(last, uint64_t{1}, &last) ||
             __builtin_mul_overflow(last, static_cast<uint64_t>(tensor.element_size()), &end_bytes);
  if (overflow || end_bytes > tensor.storage().nbytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " addresses memory outside its storage (offset ",
                     tensor.storage_offset(), ", sizes [", absl::StrJoin(tensor.sizes(), ", "),
                     "], strides [", absl::StrJoin(tensor.strides(), ", "), "], storage ",
                     tensor.storage().nbytes(), " bytes)"));
  }
  return absl::OkStatus();
}

bool IsPrivateAten(const std::string& kind) {
  return absl::StartsWith(kind, "aten::_") && !absl::StartsWith(kind, "aten::__");
}

// Why `node` may not run, or "" when it may.
std::string RefusalOf(const torch::jit::Node& node, const std::string& kind) {
  bool in_namespace = false;
  for (const char* ns : kAllowedNamespaces) in_namespace |= absl::StartsWith(kind, ns);
  if (!in_namespace) return "a custom operator";
  for (const char* refused : kRefusedOperators) {
    if (kind == refused) return "files, other threads, raw pointers or memory outside its tensors";
  }
  for (const char* prefix : kRefusedPrefixes) {
    if (absl::StartsWith(kind, prefix)) {
      return "a tensor layout whose metadata the program could write (sparse, quantized, "
             "MKL-DNN, nested) or unchecked memory access";
    }
  }
  if (IsPrivateAten(kind)) {
    bool allowed = false;
    for (const char* ok : kAllowedPrivateOperators) allowed |= kind == ok;
    for (const char* prefix : kAllowedPrivatePrefixes) allowed |= absl::StartsWith(kind, prefix);
    if (!allowed) return "a private ATen operator, which does not check its arguments";
  }
  for (const torch::jit::Value* value : node.inputs()) {
    if (value->type()->kind() == c10::TypeKind::StorageType) return "a raw storage";
  }
  for (const torch::jit::Value* out : node.outputs()) {
    // Objects of TorchBind classes (torch.classes.*) are C++ code of their own.
    if (absl::StrContains(out->type()->str(), "__torch__.torch.classes")) {
      return "a TorchBind class (C++ code of its own)";
    }
    if (out->type()->kind() == c10::TypeKind::StorageType) return "a raw storage";
  }
  // A layout argument other than strided makes a sparse or MKL-DNN tensor (torch.zeros(...,
  // layout=torch.sparse_coo)): only a constant None or torch.strided passes.
  if (const c10::FunctionSchema* schema = node.maybeSchema(); schema != nullptr) {
    const auto& args = schema->arguments();
    for (size_t i = 0; i < args.size() && i < node.inputs().size(); ++i) {
      if (args[i].name() != "layout") continue;
      auto constant = torch::jit::toIValue(node.inputs()[i]);
      const bool strided =
          constant.has_value() &&
          (constant->isNone() ||
           (constant->isInt() && constant->toInt() == static_cast<int64_t>(c10::kStrided)));
      if (!strided) return "a layout other than a constant torch.strided";
    }
  }
  // A tensor constant is unpickled with the archive's own offset and sizes: it must lie in its
  // storage.
  if (node.kind() == c10::prim::Constant && node.outputs().size() == 1) {
    auto constant = torch::jit::toIValue(node.output());
    if (constant.has_value() && constant->isTensor()) {
      absl::Status in = CheckInsideStorage(constant->toTensor(), "a tensor constant");
      if (!in.ok()) return std::string(in.message());
    }
  }
  return "";
}

absl::Status CheckNode(const torch::jit::Node& node, const std::string& origin,
                       const std::string& function) {
  const std::string kind = node.kind().toQualString();
  const std::string why = RefusalOf(node, kind);
  if (why.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("archive '", origin, "': ", function, " calls ",
                                                 kind, ", which pswitchd does not run (", why,
                                                 ")"));
}

// Every function of `module`'s compilation unit (methods, hooks, helpers), each walked once.
absl::Status CheckOperators(const torch::jit::Module& module, const std::string& origin) {
  for (torch::jit::Function* function : module._ivalue()->compilation_unit()->get_functions()) {
    if (!function->isGraphFunction()) continue;
    std::vector<torch::jit::Block*> blocks = {
        torch::jit::toGraphFunction(*function).graph()->block()};
    while (!blocks.empty()) {
      torch::jit::Block* block = blocks.back();
      blocks.pop_back();
      for (torch::jit::Node* node : block->nodes()) {
        PSWITCH_RETURN_IF_ERROR(CheckNode(*node, origin, function->qualname().qualifiedName()));
        for (torch::jit::Block* inner : node->blocks()) blocks.push_back(inner);
      }
    }
  }
  return absl::OkStatus();
}

// Code that runs while torch::jit::load unpickles the archive (a class's __setstate__) would run
// before CheckOperators could look at it: such archives are refused unread.
absl::Status CheckNoSetstate(absl::string_view bytes, const std::string& origin) {
  std::istringstream in{std::string(bytes), std::ios::binary};
  caffe2::serialize::PyTorchStreamReader reader(&in);
  for (const std::string& record : reader.getAllRecords()) {
    if (!absl::StartsWith(record, "code/") || !absl::EndsWith(record, ".py")) continue;
    auto [data, size] = reader.getRecord(record);
    const absl::string_view code(static_cast<const char*>(data.get()), size);
    if (absl::StrContains(code, "__setstate__")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "archive '", origin, "': ", record,
          " defines __setstate__, code that would run while the archive loads; pswitchd does not "
          "load it"));
    }
  }
  return absl::OkStatus();
}

// torch::jit::load's message for an operator this libtorch does not have names it.
std::string LoadErrorMessage(const std::string& full) {
  // libstdc++'s regex recurses per character: an archive-chosen name must not overflow the stack.
  const std::string what = full.substr(0, 512);
  static const std::regex unknown(R"(Unknown (?:builtin )?op(?:erator)?:? ?'?([A-Za-z0-9_:.]{1,200}))");
  std::smatch match;
  if (std::regex_search(what, match, unknown)) {
    return absl::StrCat("it needs the operator ", match[1].str(),
                        ", which this pswitchd's libtorch (", TORCH_VERSION_MAJOR, ".",
                        TORCH_VERSION_MINOR, ") does not have (exported with a newer torch, or a custom extension?)");
  }
  const std::vector<std::string> lines = absl::StrSplit(what, '\n');
  return lines.empty() ? what : lines[0];
}

at::Tensor RandomLike(const TensorSpecEntry& spec, int64_t batch, uint64_t seed,
                      c10::Device device) {
  std::vector<int64_t> shape = spec.shape;
  shape[0] = batch;
  at::Generator gen = SeededGenerator(seed, device);
  if (spec.dtype == at::kLong) {
    return at::randint(spec.high, shape, gen, at::TensorOptions().dtype(at::kLong).device(device));
  }
  // Drawn in float32 whatever the precision: the same seed gives the same values, rounded.
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat).device(device)).to(spec.dtype);
}

at::Tensor FirstTensor(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor();
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    TORCH_CHECK(!elements.empty() && elements[0].isTensor(),
                "the model's output tuple does not start with a tensor");
    return elements[0].toTensor();
  }
  if (value.isList()) {
    auto list = value.toList();
    TORCH_CHECK(list.size() > 0 && list.get(0).isTensor(),
                "the model's output list does not start with a tensor");
    return list.get(0).toTensor();
  }
  TORCH_CHECK(false, "the model returned ", value.tagKind(), "; pswitch needs a tensor");
}

std::string ParentPath(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

std::string LeafName(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

class ScriptModel final : public ZooModel {
 public:
  static absl::StatusOr<std::shared_ptr<ScriptModel>> Load(const std::string& model_name,
                                                           absl::string_view bytes,
                                                           const std::string& origin);

  ModelInput MakeExampleInput(int64_t batch, uint64_t seed, c10::Device device) const override {
    ModelInput in;
    in.input = RandomLike(table_.input, batch, seed, device);
    // No row masked out entirely (its attention would be NaN): masks are all ones.
    if (table_.attention_mask.has_value()) {
      std::vector<int64_t> shape = table_.attention_mask->shape;
      shape[0] = batch;
      in.attention_mask =
          at::ones(shape, at::TensorOptions().dtype(table_.attention_mask->dtype).device(device));
    }
    if (table_.token_type_ids.has_value()) {
      in.token_type_ids = RandomLike(*table_.token_type_ids, batch, seed + 1, device);
    }
    return in;
  }
  at::Tensor MakeExampleTarget(int64_t batch, uint64_t seed, c10::Device device) const override {
    if (!table_.target.has_value()) return ZooModel::MakeExampleTarget(batch, seed, device);
    return RandomLike(*table_.target, batch, seed + 0x9e3779b97f4a7c15ull, device);
  }
  at::Tensor Loss(const ModelOutput& out, const at::Tensor& target) const override {
    TORCH_CHECK(loss_.has_value(), "model '", model_name(),
                "' was exported without a loss; training needs pswitch.export(..., loss=...)");
    if (loss_device_ != out.output.device()) {
      loss_->to(out.output.device());  // its buffers (class weights) follow the model, once
      loss_device_ = out.output.device();
    }
    torch::jit::GraphOptimizerEnabledGuard unoptimised(false);
    c10::IValue value = loss_->forward({out.output, target.to(out.output.device())});
    TORCH_CHECK(value.isTensor() && value.toTensor().numel() == 1,
                "the exported loss did not return a scalar tensor");
    return value.toTensor().reshape({});
  }
  bool has_loss() const { return loss_.has_value(); }
  bool IsIgnorableCheckpointKey(const std::string& key) const override {
    return aliases_.count(key) > 0;
  }
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    module_.train(on);
    if (loss_.has_value()) loss_->train(on);
  }
  using torch::nn::Module::to;
  void to(torch::Device device, bool non_blocking = false) override {
    torch::nn::Module::to(device, non_blocking);  // the shared tensors, in place
    if (loss_.has_value()) loss_->to(device, non_blocking);
  }

  // The gate operator, on this model's thread.
  void OnGate(int64_t layer) {
    if (recording_) {
      recorded_.push_back(layer);
      return;
    }
    try {
      // The worker maps the k-th gate call to layer k: a pass that takes another path than the
      // recorded one (data-dependent control flow) would wait for the wrong groups and read
      // weights still in flight. It is stopped at the first gate off the path.
      const std::vector<int64_t>& path = paths_[is_training() ? 1 : 0];
      const size_t index = static_cast<size_t>(tape().calls());
      TORCH_CHECK(index < path.size() && path[index] == layer, "model '", model_name(),
                  "': its forward pass took another path than the one recorded at registration "
                  "(gate ", layer, " as call ", index, "; data-dependent control flow is not "
                  "supported: pswitch pipelines a model along one fixed layer order)");
      tape().Enter(nullptr);
    } catch (...) {
      // TorchScript's interpreter rethrows what an operator throws as a plain runtime_error;
      // the original (the worker's GateFailure with its status) is rethrown after the call.
      gate_error_ = std::current_exception();
      throw;
    }
  }

 protected:
  ModelOutput ForwardImpl(const ModelInput& given) override {
    ModelInput input = given;
    // int32 token ids, as torch's own embedding takes them.
    if (input.input.defined() && input.input.scalar_type() == at::kInt &&
        table_.input.dtype == at::kLong) {
      input.input = input.input.to(at::kLong);
    }
    TORCH_CHECK_VALUE(input.input.defined() && input.input.scalar_type() == table_.input.dtype &&
                          input.input.dim() == static_cast<int64_t>(table_.input.shape.size()),
                      "model '", model_name(), "' takes a ", table_.input.shape.size(), "-d ",
                      c10::toString(table_.input.dtype), " input; got ",
                      input.input.defined() ? input.input.toString() : "none", " of ",
                      input.input.defined() ? input.input.dim() : 0, " dimensions");
    std::vector<c10::IValue> args = {input.input};
    if (table_.attention_mask.has_value()) {
      args.push_back(ExtraInput("attention_mask", input.attention_mask, *table_.attention_mask,
                                input.input, 1));
    } else {
      TORCH_CHECK_VALUE(!input.attention_mask.defined(), "model '", model_name(),
                        "' takes no 'attention_mask' (it was exported with 'input' only)");
    }
    if (table_.token_type_ids.has_value()) {
      args.push_back(ExtraInput("token_type_ids", input.token_type_ids, *table_.token_type_ids,
                                input.input, 0));
    } else {
      TORCH_CHECK_VALUE(!input.token_type_ids.defined(), "model '", model_name(),
                        "' takes no 'token_type_ids' (it was exported without)");
    }
    // No optimising pass may move a layer's operators across its gate (the flag is per thread).
    torch::jit::GraphOptimizerEnabledGuard unoptimised(false);
    ScriptModel* previous = std::exchange(active_model, this);
    gate_error_ = nullptr;
    c10::IValue result;
    try {
      // Gate 0, the model's own tensors, before anything runs: TorchScript runs a module's
      // pre-hooks only where a parent calls it, so the archive cannot hold this one.
      OnGate(0);
      result = module_.forward(std::move(args));
    } catch (...) {
      active_model = previous;
      if (gate_error_) std::rethrow_exception(std::exchange(gate_error_, nullptr));
      throw;
    }
    active_model = previous;
    ModelOutput out;
    out.output = FirstTensor(result);
    if (!recording_ && output_spec_.has_value()) CheckOutput(out.output, input.input);
    return out;
  }

  absl::StatusOr<std::vector<Layer>> RecordLayers() override;

  // An archive takes the input dtype it was exported with (its table's), whatever its weights'.
  ModelInput InModelDType(ModelInput input) override {
    if (input.input.defined() && input.input.is_floating_point() &&
        c10::isFloatingType(table_.input.dtype) &&
        input.input.scalar_type() != table_.input.dtype) {
      input.input = input.input.to(table_.input.dtype);
    }
    return input;
  }

  at::ScalarType FloatDType() override {
    for (const Held& held : held_) {
      if (held.is_parameter && held.tensor.is_floating_point()) return held.tensor.scalar_type();
    }
    return at::kFloat;
  }

  // The archive's tensors under their canonical names (a tied one once): what its layers hold.
  absl::StatusOr<std::vector<LayerTensor>> NamedTensors() override {
    std::vector<LayerTensor> tensors;
    for (const Held& held : held_) tensors.push_back({held.name, held.tensor, held.is_parameter});
    return tensors;
  }

 private:
  // Throws unless `output`, computed from `input`, has the recorded output's dtype and rank, and
  // each dimension its recorded size, or, where the recorded size was one of the recorded
  // input's dimensions (the batch, a sequence length), that dimension of `input`. An archive
  // cannot return more (or other) than it showed at registration: a larger view is refused.
  void CheckOutput(const at::Tensor& output, const at::Tensor& input) const {
    const OutputSpec& spec = *output_spec_;
    bool ok = output.scalar_type() == spec.dtype &&
              output.dim() == static_cast<int64_t>(spec.shape.size());
    for (int64_t d = 0; ok && d < output.dim(); ++d) {
      bool dim_ok = output.size(d) == spec.shape[d];
      for (size_t j = 0; !dim_ok && j < spec.input_shape.size(); ++j) {
        // The batch follows the batch only; other dimensions follow any non-batch one.
        if ((d == 0) != (j == 0) || static_cast<int64_t>(j) >= input.dim()) continue;
        dim_ok = spec.input_shape[j] == spec.shape[d] && output.size(d) == input.size(j);
      }
      if (d == 0 && !spec.input_shape.empty() && spec.shape[0] == spec.input_shape[0]) {
        dim_ok = input.dim() > 0 && output.size(0) == input.size(0);  // the batch, exactly
      }
      ok = dim_ok;
    }
    TORCH_CHECK(ok, "model '", model_name(), "' returned a ", c10::toString(output.scalar_type()),
                " tensor of shape ", output.sizes(), " for an input of shape ", input.sizes(),
                "; its recorded output is ", c10::toString(spec.dtype), " of shape ",
                c10::IntArrayRef(spec.shape), " for an input of shape ",
                c10::IntArrayRef(spec.input_shape),
                ": pswitch returns only outputs of the recorded dtype and shape");
  }

  // A further input as the forward takes it: `given`, or where the client left it out and it
  // was exported with the input's shape, `fill` in that shape (a mask of ones, type ids 0).
  at::Tensor ExtraInput(const char* name, const at::Tensor& given, const TensorSpecEntry& spec,
                        const at::Tensor& input, int64_t fill) const {
    if (!given.defined()) {
      TORCH_CHECK_VALUE(spec.shape == table_.input.shape, "model '", model_name(), "' needs '",
                        name, "' (it was exported with one of shape [",
                        absl::StrJoin(spec.shape, ", "), "])");
      return at::full(input.sizes(), fill, input.options().dtype(spec.dtype));
    }
    at::Tensor t = given;
    if (t.scalar_type() == at::kInt && spec.dtype == at::kLong) t = t.to(at::kLong);
    TORCH_CHECK_VALUE(
        t.scalar_type() == spec.dtype && t.dim() == static_cast<int64_t>(spec.shape.size()) &&
            t.size(0) == input.size(0),
        "model '", model_name(), "' takes a ", spec.shape.size(), "-d ", c10::toString(spec.dtype),
        " '", name, "' with the input's batch; got ", t.toString(), " of shape ", t.sizes());
    return t;
  }

 public:
  // Emulates the switch at its finest (one layer per group): every floating-point tensor starts
  // as NaN and gets its value back at its owner's gate. A pass that reads a tensor before then
  // (a parent reading a child's parameter before the child runs) differs from a normal pass:
  // served, it would read weights still in flight. InvalidArgument then.
  absl::Status CheckReadsFollowGates();

 private:
  struct Held {
    std::string name;  // canonical (first) state_dict name
    at::Tensor tensor;
    bool is_parameter = true;
    std::vector<std::string> holders;  // module paths holding it directly
  };

  explicit ScriptModel(const std::string& model_name) : ZooModel(model_name) {}

  absl::Status Adopt(const std::string& origin);
  absl::Status AddHeld(const std::string& name, const at::Tensor& tensor, bool is_parameter,
                       const std::string& origin);
  absl::Status Mirror(const std::string& origin);
  absl::StatusOr<std::vector<int64_t>> RecordGates();
  absl::Status AssignOwners(const std::vector<int64_t>& eval_calls);
  std::vector<Layer> BuildScriptLayers(const std::vector<int64_t>& calls) const;
  Layer MakeLayer(int64_t gate, const std::string& name, bool with_tensors, bool executed) const;

  torch::jit::Module module_;
  mutable std::optional<torch::jit::Module> loss_;
  LayerTable table_;
  std::string origin_;
  std::map<std::string, torch::jit::Module> submodules_;  // path -> module ("" = the model)
  std::vector<Held> held_;
  std::set<std::string> aliases_;  // state_dict names of tied duplicates
  std::vector<std::vector<size_t>> owned_;  // gate -> indices into held_
  bool owners_assigned_ = false;
  bool recording_ = false;
  std::vector<int64_t> recorded_;
  std::array<std::vector<int64_t>, 2> paths_;  // [eval, train]: the recorded gate calls
  std::exception_ptr gate_error_;
  mutable std::optional<c10::Device> loss_device_;  // where the loss's buffers are
  // The output of the first eval pass (the registration's): every later output must match it.
  struct OutputSpec {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    std::vector<int64_t> input_shape;  // the input it was computed from
  };
  std::optional<OutputSpec> output_spec_;
};

void GateOp(int64_t layer) {
  if (active_model != nullptr) active_model->OnGate(layer);
}

absl::StatusOr<std::shared_ptr<ScriptModel>> ScriptModel::Load(const std::string& model_name,
                                                               absl::string_view bytes,
                                                               const std::string& origin) {
  std::shared_ptr<ScriptModel> model(new ScriptModel(model_name));
  model->origin_ = origin;
  torch::jit::ExtraFilesMap extra{{kLayerTableFile, ""}, {kLossFile, ""}};
  try {
    PSWITCH_RETURN_IF_ERROR(CheckNoSetstate(bytes, origin));
    std::istringstream in(std::string(bytes), std::ios::binary);
    model->module_ = torch::jit::load(in, c10::Device(c10::kCPU), extra);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("archive '", origin,
                                                   "' cannot be loaded: ", LoadErrorMessage(e.what())));
  }
  PSWITCH_ASSIGN_OR_RETURN(model->table_, ParseTable(extra[kLayerTableFile], origin));
  if (model->table_.loss) {
    if (extra[kLossFile].empty()) {
      return TableError(origin, absl::StrCat("says it has a loss but ", kLossFile, " is missing"));
    }
    try {
      PSWITCH_RETURN_IF_ERROR(CheckNoSetstate(extra[kLossFile], absl::StrCat(origin, " (loss)")));
      std::istringstream in(extra[kLossFile], std::ios::binary);
      model->loss_ = torch::jit::load(in, c10::Device(c10::kCPU));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "archive '", origin, "': its loss cannot be loaded: ", LoadErrorMessage(e.what())));
    }
    if (model->loss_->parameters().size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "archive '", origin, "': its loss has parameters; pswitch trains the model's only"));
    }
  }
  absl::Status operators;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("archive '", origin, "': reading its code"), [&] {
    operators = CheckOperators(model->module_, origin);
    if (operators.ok() && model->loss_.has_value()) {
      operators = CheckOperators(*model->loss_, absl::StrCat(origin, " (loss)"));
    }
  }));
  PSWITCH_RETURN_IF_ERROR(operators);
  PSWITCH_RETURN_IF_ERROR(model->Adopt(origin));
  model->eval();
  return model;
}

absl::Status ScriptModel::AddHeld(const std::string& name, const at::Tensor& tensor,
                                  bool is_parameter, const std::string& origin) {
  const std::string what = absl::StrCat("archive '", origin, "': ",
                                        is_parameter ? "parameter '" : "buffer '", name, "'");
  if (!tensor.defined()) return absl::OkStatus();  // an optional slot (e.g. bias=None)
  if (!tensor.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is on ", tensor.device().str(),
        "; export on the CPU (pswitch moves the weights to the GPU itself)"));
  }
  const at::ScalarType dtype = tensor.scalar_type();
  if (is_parameter && dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has dtype ", c10::toString(dtype),
        "; pswitch serves float32, float16 and bfloat16 parameters (call model.float(), "
        ".half() or .bfloat16() before pswitch.export)"));
  }
  if (is_parameter) {
    // One precision per model: the worker feeds it inputs in that dtype (InModelDType).
    for (const Held& held : held_) {
      if (held.is_parameter && held.tensor.scalar_type() != dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " has dtype ", c10::toString(dtype), " but '", held.name, "' has ",
            c10::toString(held.tensor.scalar_type()),
            "; pswitch serves a model in one precision (convert it whole before pswitch.export)"));
      }
    }
  }
  if (tensor.is_sparse() || !tensor.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a dense contiguous tensor"));
  }
  PSWITCH_RETURN_IF_ERROR(CheckInsideStorage(tensor, what));
  const std::string holder = ParentPath(name);
  for (Held& held : held_) {
    if (held.tensor.unsafeGetTensorImpl() == tensor.unsafeGetTensorImpl()) {
      held.holders.push_back(holder);
      aliases_.insert(name);
      return absl::OkStatus();
    }
  }
  if (tensor.nbytes() > 0) {
    for (Held& held : held_) {
      if (held.tensor.nbytes() == 0 ||
          held.tensor.storage().unsafeGetStorageImpl() != tensor.storage().unsafeGetStorageImpl()) {
        continue;
      }
      if (held.tensor.sizes() == tensor.sizes() && held.tensor.strides() == tensor.strides() &&
          held.tensor.storage_offset() == tensor.storage_offset() &&
          held.tensor.scalar_type() == tensor.scalar_type() && held.is_parameter == is_parameter) {
        // The same tensor saved twice (ties survive torch.jit.save as shared storage): make the
        // slot hold the first, so rebinding one rebinds both.
        submodules_.at(holder).setattr(LeafName(name), held.tensor);
        held.holders.push_back(holder);
        aliases_.insert(name);
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat(
          what, " shares memory with '", held.name,
          "' as a different view; pswitch lays every tensor out on its own (tie weights by "
          "assigning the same Parameter, not a slice or view of it)"));
    }
  }
  held_.push_back(Held{name, tensor, is_parameter, {holder}});
  return absl::OkStatus();
}

absl::Status ScriptModel::Adopt(const std::string& origin) {
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("archive '", origin, "'"), [&] {
    for (const auto& sub : module_.named_modules()) submodules_.emplace(sub.name, sub.value);
  }));
  // Every gate names a module of the archive, and gated leaves have no children.
  for (size_t g = 1; g < table_.gates.size(); ++g) {
    auto it = submodules_.find(table_.gates[g]);
    if (it == submodules_.end() || table_.gates[g].empty()) {
      return TableError(origin, absl::StrCat("gate ", g, " names module '", table_.gates[g],
                                             "', which the archive does not have"));
    }
  }
  std::set<std::string> tensor_names;
  absl::Status status;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(absl::StrCat("archive '", origin, "'"), [&] {
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
      tensor_names.insert(p.name);
      status = AddHeld(p.name, p.value, true, origin);
      if (!status.ok()) return;
    }
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
      tensor_names.insert(b.name);
      status = AddHeld(b.name, b.value, false, origin);
      if (!status.ok()) return;
    }
    // A tensor attribute that is neither would stay in the worker's memory, off the arena (and
    // on the CPU when the model computes on the GPU).
    for (const auto& a : module_.named_attributes(/*recurse=*/true)) {
      bool holds_tensor = a.value.isTensor() && a.value.toTensor().defined();
      if (!holds_tensor && (a.value.isList() || a.value.isTuple() || a.value.isGenericDict())) {
        // Tensors in a list, tuple or dict attribute would stay off the arena too, unpickled with
        // whatever offset the archive gave them.
        c10::IValue::HashAliasedIValues inside;
        a.value.getSubValues(inside);
        for (const c10::IValue& v : inside) holds_tensor |= v.isTensor() && v.toTensor().defined();
      }
      if (holds_tensor && !tensor_names.count(a.name)) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "archive '", origin, "': tensor attribute '", a.name,
            "' is neither a parameter nor a buffer; register it with register_buffer"));
        return;
      }
    }
  }));
  PSWITCH_RETURN_IF_ERROR(status);
  if (held_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("archive '", origin, "' has no parameters"));
  }
  return Mirror(origin);
}

absl::Status ScriptModel::Mirror(const std::string& origin) {
  return CatchTorch(absl::StrCat("archive '", origin, "': mirroring tensors"), [&] {
    std::map<std::string, std::shared_ptr<torch::nn::Module>> children;
    auto module_at = [&](const std::string& path) -> torch::nn::Module& {
      torch::nn::Module* current = this;
      std::string prefix;
      for (const auto& part : absl::StrSplit(path, '.', absl::SkipEmpty())) {
        prefix = prefix.empty() ? std::string(part) : absl::StrCat(prefix, ".", part);
        auto& child = children[prefix];
        if (child == nullptr) {
          child = current->register_module(std::string(part),
                                           std::make_shared<torch::nn::Module>("ScriptModule"));
        }
        current = child.get();
      }
      return *current;
    };
    for (const Held& held : held_) {
      torch::nn::Module& owner = module_at(ParentPath(held.name));
      if (held.is_parameter) {
        owner.register_parameter(LeafName(held.name), held.tensor, held.tensor.requires_grad());
      } else {
        owner.register_buffer(LeafName(held.name), held.tensor);
      }
    }
  });
}

absl::StatusOr<std::vector<int64_t>> ScriptModel::RecordGates() {
  recording_ = true;
  recorded_.clear();
  absl::Status ran = CatchTorch(
      absl::StrCat("model '", model_name(), "': recording layers (", is_training() ? "train" : "eval",
                   " mode)"),
      [&] {
        torch::NoGradGuard no_grad;
        const ModelInput trace = OnModelDevice(TraceInput());
        const at::Tensor output = ForwardImpl(trace).output;
        if (!is_training() && !output_spec_.has_value()) {
          output_spec_ =
              OutputSpec{output.scalar_type(), output.sizes().vec(), trace.input.sizes().vec()};
        }
      });
  recording_ = false;
  PSWITCH_RETURN_IF_ERROR(ran);
  std::vector<int64_t> calls = std::move(recorded_);
  int root_calls = 0;
  for (int64_t g : calls) {
    if (g < 0 || g >= static_cast<int64_t>(table_.gates.size())) {
      return absl::InvalidArgumentError(absl::StrCat("archive '", origin_, "': gate ", g,
                                                     " is not in the layer table"));
    }
    root_calls += g == 0 ? 1 : 0;
  }
  if (root_calls != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "archive '", origin_, "': gate 0 ran ", root_calls,
        " times in one pass (it is the server's; the archive must not call it)"));
  }
  if (calls.size() == 1 && table_.gates.size() > 1 && !is_training()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "archive '", origin_, "': its forward pass calls none of the ", table_.gates.size() - 1,
        " gates its layer table lists, so they cover none of its parameters: the modules they "
        "gate did not run (a fused fast path, such as torch's nn.TransformerEncoderLayer in eval "
        "mode without gradients, computes without calling its submodules), or the archive was "
        "not made by pswitch.export"));
  }
  return calls;
}

absl::Status ScriptModel::AssignOwners(const std::vector<int64_t>& eval_calls) {
  std::map<std::string, int64_t> first_call;  // module path -> first position in the pass
  for (size_t i = 0; i < eval_calls.size(); ++i) {
    first_call.emplace(table_.gates[eval_calls[i]], static_cast<int64_t>(i));
  }
  std::map<std::string, int64_t> gate_of;
  for (size_t g = 0; g < table_.gates.size(); ++g) gate_of[table_.gates[g]] = static_cast<int64_t>(g);
  owned_.assign(table_.gates.size(), {});
  for (size_t i = 0; i < held_.size(); ++i) {
    int64_t owner = 0;  // gate 0 runs before anything reads a tensor
    int64_t earliest = std::numeric_limits<int64_t>::max();
    for (const std::string& holder : held_[i].holders) {
      auto call = first_call.find(holder);
      if (holder.empty() || call == first_call.end() || call->second >= earliest) continue;
      earliest = call->second;
      owner = gate_of.at(holder);
    }
    owned_[owner].push_back(i);
  }
  owners_assigned_ = true;
  return absl::OkStatus();
}

Layer ScriptModel::MakeLayer(int64_t gate, const std::string& name, bool with_tensors,
                             bool executed) const {
  Layer layer;
  layer.name = name;
  layer.type = gate == 0 ? "model"
                         : submodules_.at(table_.gates[gate]).type()->name()->qualifiedName();
  layer.executed = executed;
  if (with_tensors) {
    for (size_t i : owned_[gate]) {
      const Held& held = held_[i];
      layer.tensors.push_back({held.name, held.tensor, held.is_parameter});
      const int64_t bytes = static_cast<int64_t>(held.tensor.nbytes());
      layer.total_bytes += bytes;
      if (held.tensor.is_floating_point()) layer.param_bytes += bytes;
    }
  }
  return layer;
}

std::vector<Layer> ScriptModel::BuildScriptLayers(const std::vector<int64_t>& calls) const {
  std::vector<Layer> layers;
  std::vector<int> seen(table_.gates.size(), 0);
  for (int64_t gate : calls) {
    const std::string base = gate == 0 ? std::string(kRootLayerName) : table_.gates[gate];
    const int count = ++seen[gate];
    layers.push_back(count == 1 ? MakeLayer(gate, base, true, true)
                                : MakeLayer(gate, absl::StrCat(base, "#", count), false, true));
  }
  for (size_t gate = 1; gate < table_.gates.size(); ++gate) {
    if (seen[gate] == 0) {
      layers.push_back(MakeLayer(static_cast<int64_t>(gate), table_.gates[gate], true, false));
    }
  }
  return layers;
}

absl::Status ScriptModel::CheckReadsFollowGates() {
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<Layer>* layers, Layers());
  const ModelInput input = TraceInput();
  std::map<const c10::TensorImpl*, at::Tensor> saved;
  at::Tensor reference, poisoned;
  absl::Status ran = CatchTorch(absl::StrCat("archive '", origin_, "': checking reads"), [&] {
    torch::NoGradGuard no_grad;
    reference = ForwardImpl(input).output.clone();
    for (const Held& held : held_) {
      if (!held.tensor.is_floating_point()) continue;
      saved.emplace(held.tensor.unsafeGetTensorImpl(), held.tensor.clone());
      at::Tensor(held.tensor).fill_(std::numeric_limits<float>::quiet_NaN());
    }
    SetGateHook([&](int index) {
      for (const LayerTensor& t : (*layers)[index].tensors) {
        auto it = saved.find(t.tensor.unsafeGetTensorImpl());
        if (it != saved.end()) at::Tensor(t.tensor).copy_(it->second);
      }
    });
    poisoned = Forward(input).output;
  });
  SetGateHook(nullptr);
  absl::Status restored = CatchTorch("restoring tensors", [&] {
    torch::NoGradGuard no_grad;
    for (const Held& held : held_) {
      auto it = saved.find(held.tensor.unsafeGetTensorImpl());
      if (it != saved.end()) at::Tensor(held.tensor).copy_(it->second);
    }
  });
  PSWITCH_RETURN_IF_ERROR(restored);
  PSWITCH_RETURN_IF_ERROR(ran);
  if (!at::equal(reference, poisoned)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "archive '", origin_, "': its forward pass reads a tensor before the layer that holds it "
        "runs (for example a parent module using a child's parameter before calling the child); "
        "pswitch would compute on weights still being copied. Let the child module use it, or "
        "make it a parameter of the parent"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Layer>> ScriptModel::RecordLayers() {
  PSWITCH_ASSIGN_OR_RETURN(std::vector<int64_t> calls, RecordGates());
  paths_[is_training() ? 1 : 0] = calls;
  if (!owners_assigned_) {
    // Ownership follows the eval pass (the layout's order) in both modes.
    std::vector<int64_t> eval_calls = calls;
    if (is_training()) {
      train(false);
      absl::StatusOr<std::vector<int64_t>> eval = RecordGates();
      train(true);
      PSWITCH_ASSIGN_OR_RETURN(eval_calls, std::move(eval));
    }
    PSWITCH_RETURN_IF_ERROR(AssignOwners(eval_calls));
  }
  return BuildScriptLayers(calls);
}

}  // namespace

absl::StatusOr<std::shared_ptr<ZooModel>> LoadScriptModel(const std::string& model_name,
                                                          absl::string_view bytes,
                                                          const std::string& origin) {
  PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<ScriptModel> model,
                           ScriptModel::Load(model_name, bytes, origin));
  // Recorded now, so an archive whose gates do not cover the model fails here, not at serving.
  model->train();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<Layer>* train_layers, model->Layers());
  model->eval();
  PSWITCH_ASSIGN_OR_RETURN(const std::vector<Layer>* eval_layers, model->Layers());
  PSWITCH_RETURN_IF_ERROR(model->CheckReadsFollowGates());
  // Workers lay a model out in eval order and find each train-mode layer there by name.
  std::set<std::string> laid_out;
  for (const Layer& layer : *eval_layers) laid_out.insert(layer.name);
  for (const Layer& layer : *train_layers) {
    if (!laid_out.count(layer.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "archive '", origin, "': layer '", layer.name,
          "' runs in train mode only (a module called more often when training); pswitch lays a "
          "model out in its eval order"));
    }
  }
  return model;
}

absl::StatusOr<std::shared_ptr<ZooModel>> CreateModelFrom(const ModelSource& source,
                                                          const std::string& model_name) {
  if (source.archive != nullptr) {
    return LoadScriptModel(model_name, *source.archive, source.archive_name);
  }
  return CreateModel(source.zoo_model);
}

bool IsScriptModel(const ZooModel& model) {
  return dynamic_cast<const ScriptModel*>(&model) != nullptr;
}

absl::Status CheckTrainable(const ZooModel& model) {
  const auto* script = dynamic_cast<const ScriptModel*>(&model);
  if (script == nullptr || script->has_loss()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "model '", model.model_name(),
      "' was exported without a loss, so it serves inference only; to train it, export it with "
      "pswitch.export(..., loss=..., example_target=...)"));
}

}  // namespace pswitch::models
