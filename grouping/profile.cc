#include "grouping/profile.h"

#include <cerrno>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/json.h"
#include "base/status.h"

namespace pswitch::grouping {
namespace {

using Json = nlohmann::json;

// Where a field lives, for error messages: "profile 'm': " or "profile 'm': layers[3] 'x': ".
std::string Where(const std::string& model, int layer_index = -1,
                  const std::string& layer_name = "") {
  std::string where = absl::StrCat("profile '", model, "': ");
  if (layer_index >= 0) {
    absl::StrAppend(&where, "layers[", layer_index, "]");
    if (!layer_name.empty()) absl::StrAppend(&where, " '", layer_name, "'");
    absl::StrAppend(&where, ": ");
  }
  return where;
}

bool IsFiniteNonNegative(double value) { return std::isfinite(value) && value >= 0.0; }

absl::Status CheckNonNegative(const std::string& where, absl::string_view field, double value) {
  if (IsFiniteNonNegative(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s%s must be finite and >= 0, got %g", where, field, value));
}

// Looks up `field` in `object`; InvalidArgument when it is missing.
absl::StatusOr<const Json*> Field(const Json& object, const std::string& where, const char* field) {
  auto it = object.find(field);
  if (it == object.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "missing field '", field, "'"));
  }
  return &*it;
}

absl::StatusOr<std::string> StringField(const Json& object, const std::string& where,
                                        const char* field) {
  PSWITCH_ASSIGN_OR_RETURN(const Json* value, Field(object, where, field));
  if (!value->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "field '", field, "' must be a string, got ", value->type_name()));
  }
  return value->get<std::string>();
}

absl::StatusOr<double> NumberField(const Json& object, const std::string& where,
                                   const char* field) {
  PSWITCH_ASSIGN_OR_RETURN(const Json* value, Field(object, where, field));
  if (!value->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "field '", field, "' must be a number, got ", value->type_name()));
  }
  return value->get<double>();
}

// A non-negative integer; integral floats such as 1e6 are accepted.
absl::StatusOr<int64_t> ByteCountField(const Json& object, const std::string& where,
                                       const char* field) {
  PSWITCH_ASSIGN_OR_RETURN(const Json* value, Field(object, where, field));
  if (value->is_number_unsigned()) {
    uint64_t bytes = value->get<uint64_t>();
    if (bytes <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(bytes);
    }
  } else if (value->is_number_integer()) {
    int64_t bytes = value->get<int64_t>();
    if (bytes >= 0) return bytes;
  } else if (value->is_number_float()) {
    double bytes = value->get<double>();
    // 2^63 is exactly representable; anything below it converts without overflow.
    if (IsFiniteNonNegative(bytes) && bytes < 9223372036854775808.0 && bytes == std::floor(bytes)) {
      return static_cast<int64_t>(bytes);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "field '", field, "' must be a non-negative integer, got ", value->type_name()));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, "field '", field, "' must be a non-negative integer, got ", value->dump()));
}

// Where in the document a SAX parse stopped, as "layers[1].exec_s". JSON errors (syntax,
// number overflow) carry only a byte offset; this names the field and index instead.
class JsonPathTracker {
 public:
  using Number = Json::number_float_t;

  std::string error_path() const { return error_path_; }

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(Json::number_integer_t) { return Value(); }
  bool number_unsigned(Json::number_unsigned_t) { return Value(); }
  bool number_float(Number, const Json::string_t&) { return Value(); }
  bool string(Json::string_t&) { return Value(); }
  bool binary(Json::binary_t&) { return Value(); }
  bool start_object(std::size_t) { return Push(false); }
  bool start_array(std::size_t) { return Push(true); }
  bool key(Json::string_t& key) {
    frames_.back().key = key;
    return true;
  }
  bool end_object() { return Pop(); }
  bool end_array() { return Pop(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    error_path_ = Path();
    return false;
  }

 private:
  struct Frame {
    bool array = false;
    size_t index = 0;  // arrays: the element being parsed
    std::string key;   // objects: the member being parsed
  };

  bool Value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool Push(bool array) {
    frames_.push_back(Frame{array, 0, ""});
    return true;
  }
  bool Pop() {
    frames_.pop_back();
    return Value();
  }
  std::string Path() const {
    std::string path;
    for (const Frame& frame : frames_) {
      if (frame.array) {
        absl::StrAppend(&path, "[", frame.index, "]");
      } else if (!frame.key.empty()) {
        absl::StrAppend(&path, path.empty() ? "" : ".", frame.key);
      }
    }
    return path;
  }

  std::vector<Frame> frames_;
  std::string error_path_;
};

std::string JsonErrorPath(absl::string_view json_text) {
  JsonPathTracker tracker;
  try {
    Json::sax_parse(json_text.begin(), json_text.end(), &tracker);
  } catch (const std::exception&) {
    // The tracker already recorded the path, if the parser got that far.
  }
  return tracker.error_path();
}

absl::StatusOr<LayerProfile> ParseLayer(const Json& json, const std::string& model, int index) {
  std::string where = Where(model, index);
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "must be an object, got ", json.type_name()));
  }
  LayerProfile layer;
  PSWITCH_ASSIGN_OR_RETURN(layer.name, StringField(json, where, "name"));
  where = Where(model, index, layer.name);
  PSWITCH_ASSIGN_OR_RETURN(layer.param_bytes, ByteCountField(json, where, "param_bytes"));
  PSWITCH_ASSIGN_OR_RETURN(layer.exec_s, NumberField(json, where, "exec_s"));
  return layer;
}

absl::StatusOr<Profile> ParseProfile(const Json& json) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: must be a JSON object, got ", json.type_name()));
  }
  Profile profile;
  PSWITCH_ASSIGN_OR_RETURN(profile.model, StringField(json, "profile: ", "model"));
  const std::string where = Where(profile.model);
  PSWITCH_ASSIGN_OR_RETURN(profile.bandwidth_bytes_per_s,
                           NumberField(json, where, "bandwidth_bytes_per_s"));
  PSWITCH_ASSIGN_OR_RETURN(profile.transfer_overhead_s,
                           NumberField(json, where, "transfer_overhead_s"));
  PSWITCH_ASSIGN_OR_RETURN(profile.group_sync_overhead_s,
                           NumberField(json, where, "group_sync_overhead_s"));
  PSWITCH_ASSIGN_OR_RETURN(const Json* layers, Field(json, where, "layers"));
  if (!layers->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "field 'layers' must be an array, got ", layers->type_name()));
  }
  // Checked before parsing so a huge input is not copied into memory first.
  if (layers->size() > static_cast<size_t>(kMaxProfileLayers)) {
    return absl::InvalidArgumentError(absl::StrCat(where, "field 'layers' has ", layers->size(),
                                                   " entries; at most ", kMaxProfileLayers,
                                                   " are supported"));
  }
  profile.layers.reserve(layers->size());
  for (size_t i = 0; i < layers->size(); ++i) {
    PSWITCH_ASSIGN_OR_RETURN(LayerProfile layer,
                             ParseLayer((*layers)[i], profile.model, static_cast<int>(i)));
    profile.layers.push_back(std::move(layer));
  }
  PSWITCH_RETURN_IF_ERROR(ValidateProfile(profile));
  return profile;
}

}  // namespace

absl::Status ValidateProfile(const Profile& profile) {
  const std::string where = Where(profile.model);
  if (!std::isfinite(profile.bandwidth_bytes_per_s) || profile.bandwidth_bytes_per_s <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%sbandwidth_bytes_per_s must be finite and > 0, got %g", where,
                        profile.bandwidth_bytes_per_s));
  }
  PSWITCH_RETURN_IF_ERROR(
      CheckNonNegative(where, "transfer_overhead_s", profile.transfer_overhead_s));
  PSWITCH_RETURN_IF_ERROR(
      CheckNonNegative(where, "group_sync_overhead_s", profile.group_sync_overhead_s));
  if (profile.layers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "field 'layers' is empty"));
  }
  if (profile.layers.size() > static_cast<size_t>(kMaxProfileLayers)) {
    return absl::InvalidArgumentError(absl::StrCat(where, "field 'layers' has ",
                                                   profile.layers.size(), " entries; at most ",
                                                   kMaxProfileLayers, " are supported"));
  }
  int64_t total_bytes = 0;
  double total_exec_s = 0.0;
  for (size_t i = 0; i < profile.layers.size(); ++i) {
    const LayerProfile& layer = profile.layers[i];
    const std::string layer_where = Where(profile.model, static_cast<int>(i), layer.name);
    if (layer.param_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(layer_where, "param_bytes must be >= 0, got ", layer.param_bytes));
    }
    if (layer.param_bytes > std::numeric_limits<int64_t>::max() - total_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(layer_where, "param_bytes: the running total overflows 64 bits"));
    }
    total_bytes += layer.param_bytes;
    PSWITCH_RETURN_IF_ERROR(CheckNonNegative(layer_where, "exec_s", layer.exec_s));
    total_exec_s += layer.exec_s;
    if (!std::isfinite(total_exec_s)) {
      return absl::InvalidArgumentError(
          absl::StrCat(layer_where, "exec_s: the running total is not finite"));
    }
  }
  // Every time the cost model computes must be finite, or comparisons stop meaning anything.
  const double n = static_cast<double>(profile.layers.size());
  const double worst_s = n * (profile.transfer_overhead_s + profile.group_sync_overhead_s) +
                         static_cast<double>(total_bytes) / profile.bandwidth_bytes_per_s +
                         total_exec_s;
  if (!std::isfinite(worst_s)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%sbandwidth_bytes_per_s %g (or the overheads) make the total time non-finite", where,
        profile.bandwidth_bytes_per_s));
  }
  return absl::OkStatus();
}

absl::StatusOr<Profile> ParseProfileJson(absl::string_view json_text) {
  // Depth and size first: the error path below re-reads the text with a recursive tracker.
  if (absl::Status limits = base::CheckJsonLimits(json_text, "profile"); !limits.ok()) {
    return limits;
  }
  Json json;
  try {
    json = Json::parse(json_text.begin(), json_text.end());
    return ParseProfile(json);
  } catch (const Json::exception& e) {
    const std::string path = JsonErrorPath(json_text);
    return absl::InvalidArgumentError(absl::StrCat(
        "profile: invalid JSON", path.empty() ? "" : absl::StrCat(" at ", path), ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("profile: ", e.what()));
  }
}

absl::StatusOr<Profile> LoadProfileFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(absl::StrCat("profile: cannot open '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return ErrnoStatus(absl::StrCat("profile: cannot read '", path, "'"));
  absl::StatusOr<Profile> profile = ParseProfileJson(text.str());
  if (!profile.ok()) {
    return absl::Status(profile.status().code(),
                        absl::StrCat(path, ": ", profile.status().message()));
  }
  return profile;
}

nlohmann::json ProfileToJson(const Profile& profile) {
  Json layers = Json::array();
  for (const LayerProfile& layer : profile.layers) {
    layers.push_back(
        {{"name", layer.name}, {"param_bytes", layer.param_bytes}, {"exec_s", layer.exec_s}});
  }
  return Json{{"model", profile.model},
              {"bandwidth_bytes_per_s", profile.bandwidth_bytes_per_s},
              {"transfer_overhead_s", profile.transfer_overhead_s},
              {"group_sync_overhead_s", profile.group_sync_overhead_s},
              {"layers", std::move(layers)}};
}

}  // namespace pswitch::grouping
