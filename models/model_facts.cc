#include "models/model_facts.h"

#include <map>
#include <string>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

namespace pswitch::models {
namespace {

constexpr char kMetadataKey[] = "pswitch.facts";
constexpr char kProfileKey[] = "pswitch.profile";
constexpr int kFormat = 1;
constexpr size_t kMaxRank = 16;
constexpr int64_t kMaxDim = int64_t{1} << 40;

std::string TensorKey(size_t layer, size_t tensor) { return absl::StrCat(layer, "/", tensor); }

nlohmann::json SpecJson(const FactsTensorSpec& spec) {
  return {{"dtype", std::string(DTypeName(spec.dtype))}, {"shape", spec.shape}};
}

// Reads untrusted JSON without throwing: every access checks the type first.
class Reader {
 public:
  explicit Reader(absl::string_view origin) : origin_(origin) {}

  absl::Status Bad(absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(origin_, ": ", why));
  }

  absl::StatusOr<const nlohmann::json*> Field(const nlohmann::json& object, const char* key) const {
    if (!object.is_object()) return Bad(absl::StrCat("expected an object holding \"", key, "\""));
    auto it = object.find(key);
    if (it == object.end()) return Bad(absl::StrCat("\"", key, "\" is missing"));
    return &*it;
  }

  absl::StatusOr<std::string> String(const nlohmann::json& object, const char* key,
                                     size_t max_bytes, bool allow_empty) const {
    PSWITCH_ASSIGN_OR_RETURN(const nlohmann::json* value, Field(object, key));
    if (!value->is_string()) return Bad(absl::StrCat("\"", key, "\" is not a string"));
    const auto& text = value->get_ref<const std::string&>();
    if (text.size() > max_bytes) return Bad(absl::StrCat("\"", key, "\" is too long"));
    if (text.empty() && !allow_empty) return Bad(absl::StrCat("\"", key, "\" is empty"));
    return text;
  }

  absl::StatusOr<uint64_t> Unsigned(const nlohmann::json& object, const char* key) const {
    PSWITCH_ASSIGN_OR_RETURN(const nlohmann::json* value, Field(object, key));
    if (!value->is_number_unsigned()) {
      return Bad(absl::StrCat("\"", key, "\" is not a non-negative integer"));
    }
    return value->get<uint64_t>();
  }

  absl::StatusOr<FactsTensorSpec> Spec(const nlohmann::json& object, const char* key) const {
    PSWITCH_ASSIGN_OR_RETURN(const nlohmann::json* value, Field(object, key));
    PSWITCH_ASSIGN_OR_RETURN(std::string dtype_name, String(*value, "dtype", 8, false));
    FactsTensorSpec spec;
    absl::StatusOr<DType> dtype = ParseDType(dtype_name);
    if (!dtype.ok() || (*dtype != DType::kF32 && *dtype != DType::kF16 && *dtype != DType::kBF16 &&
                        *dtype != DType::kI64 && *dtype != DType::kI32)) {
      return Bad(absl::StrCat("the ", key, " is not F32, F16, BF16, I64 or I32"));
    }
    spec.dtype = *dtype;
    PSWITCH_ASSIGN_OR_RETURN(const nlohmann::json* shape, Field(*value, "shape"));
    if (!shape->is_array() || shape->size() > kMaxRank) {
      return Bad(absl::StrCat("the ", key, "'s shape is not an array of at most ", kMaxRank));
    }
    for (size_t i = 0; i < shape->size(); ++i) {
      const nlohmann::json& dim = (*shape)[i];
      const bool batch = i == 0;
      if (!dim.is_number_integer() || dim.get<int64_t>() < (batch ? -1 : 0) ||
          dim.get<int64_t>() > kMaxDim || (batch && dim.get<int64_t>() != -1)) {
        return Bad(absl::StrCat("the ", key, "'s dimension ", i,
                                batch ? " is not -1 (the batch)" : " is out of range"));
      }
      spec.shape.push_back(dim.get<int64_t>());
    }
    return spec;
  }

 private:
  std::string origin_;
};

}  // namespace

namespace {

// The facts' tensors and metadata, as both encoders write them; the entries point into `facts`.
struct FactsFile {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};

FactsFile ToFile(const ModelFacts& facts) {
  FactsFile file;
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < facts.layers.size(); ++l) {
    const FactsLayer& layer = facts.layers[l];
    nlohmann::json names = nlohmann::json::array();
    for (size_t t = 0; t < layer.tensors.size(); ++t) {
      const FactsTensor& tensor = layer.tensors[t];
      names.push_back(tensor.name);
      file.entries.push_back({TensorKey(l, t),
                              DType::kU8,
                              {static_cast<int64_t>(tensor.bytes.size())},
                              tensor.bytes.data(),
                              tensor.bytes.size()});
    }
    layers.push_back({{"name", layer.name}, {"executed", layer.executed}, {"tensors", names}});
  }
  const nlohmann::json meta = {{"format", kFormat},
                               {"layers", std::move(layers)},
                               {"train_order", facts.train_order},
                               {"optimizer_slot_bytes", facts.optimizer_slot_bytes},
                               {"trainable",
                                {{"code", static_cast<int>(facts.trainable.code())},
                                 {"message", std::string(facts.trainable.message())}}},
                               {"input", SpecJson(facts.input)},
                               {"output", SpecJson(facts.output)},
                               {"profile_us", facts.profile_us}};
  // Names come from the model: invalid UTF-8 is replaced rather than thrown on.
  file.metadata[kMetadataKey] = meta.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (!facts.profile_json.empty()) file.metadata[kProfileKey] = facts.profile_json;
  return file;
}

}  // namespace

absl::StatusOr<std::string> EncodeModelFacts(const ModelFacts& facts) {
  const FactsFile file = ToFile(facts);
  return SerializeSafetensors(file.entries, file.metadata);
}

absl::Status WriteModelFacts(const ModelFacts& facts, int fd, absl::string_view what) {
  const FactsFile file = ToFile(facts);
  return WriteSafetensorsTo(fd, file.entries, file.metadata, what);
}

absl::StatusOr<ModelFacts> DecodeModelFacts(std::string bytes, absl::string_view origin,
                                            const ModelFactsLimits& limits) {
  auto owner = std::make_shared<const std::string>(std::move(bytes));
  const absl::string_view view(*owner);
  return DecodeModelFacts(std::move(owner), view, origin, limits);
}

absl::StatusOr<ModelFacts> DecodeModelFacts(std::shared_ptr<const void> owner,
                                            absl::string_view bytes, absl::string_view origin,
                                            const ModelFactsLimits& limits) {
  const Reader read(origin);
  PSWITCH_ASSIGN_OR_RETURN(
      SafetensorsFile parsed,
      SafetensorsFile::ParseShared(std::move(owner), bytes, origin, limits.file));
  auto file = std::make_shared<const SafetensorsFile>(std::move(parsed));
  auto meta_it = file->metadata().find(kMetadataKey);
  if (meta_it == file->metadata().end()) {
    return read.Bad(absl::StrCat("no \"", kMetadataKey, "\" metadata"));
  }
  PSWITCH_ASSIGN_OR_RETURN(nlohmann::json meta,
                           base::ParseUntrustedJson(meta_it->second, origin));
  PSWITCH_ASSIGN_OR_RETURN(const nlohmann::json* format, read.Field(meta, "format"));
  if (!format->is_number_integer() || format->get<int64_t>() != kFormat) {
    return read.Bad(absl::StrCat("format is not ", kFormat));
  }
  ModelFacts facts;
  PSWITCH_ASSIGN_OR_RETURN(const nlohmann::json* layers, read.Field(meta, "layers"));
  if (!layers->is_array() || layers->size() > limits.max_layers) {
    return read.Bad(absl::StrCat("\"layers\" is not an array of at most ", limits.max_layers));
  }
  std::unordered_set<std::string> layer_names;
  size_t tensor_count = 0;
  for (size_t l = 0; l < layers->size(); ++l) {
    const nlohmann::json& entry = (*layers)[l];
    FactsLayer layer;
    PSWITCH_ASSIGN_OR_RETURN(layer.name, read.String(entry, "name", limits.max_name_bytes, false));
    if (!layer_names.insert(layer.name).second) {
      return read.Bad(absl::StrCat("layer ", l, "'s name repeats an earlier one"));
    }
    PSWITCH_ASSIGN_OR_RETURN(const nlohmann::json* executed, read.Field(entry, "executed"));
    if (!executed->is_boolean()) return read.Bad(absl::StrCat("layer ", l, ": \"executed\""));
    layer.executed = executed->get<bool>();
    PSWITCH_ASSIGN_OR_RETURN(const nlohmann::json* names, read.Field(entry, "tensors"));
    if (!names->is_array()) return read.Bad(absl::StrCat("layer ", l, ": \"tensors\""));
    std::unordered_set<std::string> tensor_names;
    for (size_t t = 0; t < names->size(); ++t) {
      const nlohmann::json& name = (*names)[t];
      if (!name.is_string() || name.get_ref<const std::string&>().empty() ||
          name.get_ref<const std::string&>().size() > limits.max_name_bytes ||
          !tensor_names.insert(name.get<std::string>()).second) {
        return read.Bad(absl::StrCat("layer ", l, "'s tensor ", t,
                                     " has no name, too long a name or a repeated one"));
      }
      const SafetensorsTensor* data = file->Find(TensorKey(l, t));
      if (data == nullptr || data->dtype != DType::kU8 || data->shape.size() != 1) {
        return read.Bad(absl::StrCat("layer ", l, "'s tensor ", t, " has no U8 data"));
      }
      layer.tensors.push_back(
          {name.get<std::string>(),
           std::span<const std::byte>(reinterpret_cast<const std::byte*>(data->data), data->bytes)});
    }
    tensor_count += layer.tensors.size();
    facts.layers.push_back(std::move(layer));
  }
  if (tensor_count != file->tensors().size()) {
    return read.Bad(absl::StrCat("the file holds ", file->tensors().size(),
                                 " tensors but the layers name ", tensor_count));
  }
  PSWITCH_ASSIGN_OR_RETURN(const nlohmann::json* train_order, read.Field(meta, "train_order"));
  if (!train_order->is_array() || train_order->size() > facts.layers.size()) {
    return read.Bad("\"train_order\" is not an array of at most one entry per layer");
  }
  std::vector<bool> trained(facts.layers.size(), false);
  for (const nlohmann::json& index : *train_order) {
    if (!index.is_number_unsigned() || index.get<uint64_t>() >= facts.layers.size() ||
        trained[index.get<uint64_t>()]) {
      return read.Bad("\"train_order\" holds an index that is no layer's, or one twice");
    }
    trained[index.get<uint64_t>()] = true;
    facts.train_order.push_back(static_cast<uint32_t>(index.get<uint64_t>()));
  }
  PSWITCH_ASSIGN_OR_RETURN(facts.optimizer_slot_bytes,
                           read.Unsigned(meta, "optimizer_slot_bytes"));
  PSWITCH_ASSIGN_OR_RETURN(const nlohmann::json* trainable, read.Field(meta, "trainable"));
  PSWITCH_ASSIGN_OR_RETURN(uint64_t code, read.Unsigned(*trainable, "code"));
  PSWITCH_ASSIGN_OR_RETURN(std::string message,
                           read.String(*trainable, "message", limits.max_message_bytes, true));
  if (code > static_cast<uint64_t>(absl::StatusCode::kUnauthenticated)) {
    return read.Bad("\"trainable\" has an unknown status code");
  }
  facts.trainable = absl::Status(static_cast<absl::StatusCode>(code), message);
  PSWITCH_ASSIGN_OR_RETURN(facts.input, read.Spec(meta, "input"));
  PSWITCH_ASSIGN_OR_RETURN(facts.output, read.Spec(meta, "output"));
  if (meta.contains("profile_us")) {
    PSWITCH_ASSIGN_OR_RETURN(facts.profile_us, read.Unsigned(meta, "profile_us"));
  }
  if (auto profile = file->metadata().find(kProfileKey); profile != file->metadata().end()) {
    if (profile->second.size() > limits.max_profile_bytes) {
      return read.Bad(absl::StrCat("the profile is over ", limits.max_profile_bytes, " bytes"));
    }
    facts.profile_json = profile->second;
  }
  facts.keep_alive = std::move(file);
  return facts;
}

std::string EncodeRefusal(const absl::Status& status) {
  const nlohmann::json json = {{"code", static_cast<int>(status.code())},
                               {"message", std::string(status.message())}};
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::Status DecodeRefusal(absl::string_view text, absl::string_view origin,
                           size_t max_message_bytes) {
  auto internal = [&](absl::string_view why) {
    return absl::InternalError(absl::StrCat(origin, " failed and its report ", why));
  };
  absl::StatusOr<nlohmann::json> json =
      base::ParseUntrustedJson(text, origin, {.max_bytes = 2 * max_message_bytes + 256,
                                              .max_depth = 2});
  if (!json.ok() || !json->is_object()) return internal("is not a status");
  auto code = json->find("code");
  auto message = json->find("message");
  if (code == json->end() || !code->is_number_unsigned() || code->get<uint64_t>() == 0 ||
      code->get<uint64_t>() > static_cast<uint64_t>(absl::StatusCode::kUnauthenticated) ||
      message == json->end() || !message->is_string()) {
    return internal("is not a status");
  }
  std::string text_out = message->get<std::string>();
  if (text_out.size() > max_message_bytes) {
    size_t cut = max_message_bytes;
    while (cut > 0 && (static_cast<unsigned char>(text_out[cut]) & 0xC0) == 0x80) --cut;
    text_out.resize(cut);  // at a character boundary: the text stays UTF-8
    text_out += "...";
  }
  return absl::Status(static_cast<absl::StatusCode>(code->get<uint64_t>()), text_out);
}

std::string DescribeInspectionProgress(const InspectionProgress& progress) {
  switch (progress.step) {
    case InspectionStep::kBuild:
      return "building the model";
    case InspectionStep::kCheckpoint:
      return "applying the checkpoint";
    case InspectionStep::kLayers:
      return "recording its layers";
    case InspectionStep::kProfile:
      // Run 0: the move to the profile's device and the forward that warms it up.
      if (progress.done == 0) return "profiling: warming up";
      return absl::StrCat("profiling: run ", progress.done, " of ", progress.total);
  }
  return "inspecting";
}

}  // namespace pswitch::models
