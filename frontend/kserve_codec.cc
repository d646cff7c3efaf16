#include "frontend/kserve_codec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status.h"
#include "base/text.h"
#include "nlohmann/json.hpp"
#include "proto/dtype.h"

namespace pswitch::frontend {
namespace {

// Half-precision values as KServe JSON carries them (numbers, taken as floats). Both round to
// nearest even as PyTorch's conversions do (no library in the stack converts to float16, and
// clang 14 has no _Float16 on x86). float16: IEEE binary16, subnormals, overflow to infinity;
// bfloat16: a float's upper half. NaN stays a quiet NaN.
uint16_t HalfBits(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7fffffff;
  if (x >= 0x7f800000) return sign | (x > 0x7f800000 ? 0x7e00 : 0x7c00);
  if (x >= 0x477ff000) return sign | 0x7c00;  // 65520 and above round past 65504
  uint32_t h, rest, half;
  if (x >= 0x38800000) {  // a normal half (2^-14 and above): rebias, drop 13 mantissa bits
    h = (x - 0x38000000) >> 13;
    rest = x & 0x1fff;
    half = 0x1000;
  } else {
    if (x < 0x33000000) return sign;  // below 2^-25 (a tie at 2^-25 goes to even: zero)
    // A subnormal half counts units of 2^-24: the 24-bit significand shifted right.
    const uint32_t shift = 126 - (x >> 23);  // 14 to 24
    const uint32_t significand = (x & 0x7fffff) | 0x800000;
    h = significand >> shift;
    rest = significand & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  }
  if (rest > half || (rest == half && (h & 1))) ++h;  // a carry into the exponent is right too
  return static_cast<uint16_t>(sign | h);
}
float HalfToFloat(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  uint32_t exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ffu, x;
  if (exponent == 0x1f) {
    x = sign | 0x7f800000 | (mantissa << 13);
  } else if (exponent != 0) {
    x = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    x = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    x = sign | (exponent << 23) | ((mantissa & 0x3ff) << 13);
  }
  float value;
  std::memcpy(&value, &x, 4);
  return value;
}
uint16_t BFloat16Bits(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float BFloat16ToFloat(uint16_t bits) {
  const uint32_t u = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &u, 4);
  return value;
}

using nlohmann::json;
using Event = json::parse_event_t;

// Where the parser is, in the request's shape: {"inputs": [{..., "data": [...]}, ...], ...}.
// Depths as nlohmann reports them: root keys at 1, an input's keys at 3, data elements at 4+.
constexpr int kRootKeyDepth = 1;
constexpr int kInputDepth = 2;
constexpr int kInputKeyDepth = 3;

// Values pass one may keep outside the tensor data: far beyond what a request needs (names,
// shapes, parameters, a few outputs), and small enough that nlohmann's callback parser, which
// scans an object's parent when it closes, stays cheap and the document small.
constexpr size_t kMaxStructureValues = 4096;

// Pass one: the request without its "data" elements, which are counted per input instead.
class StructurePass {
 public:
  explicit StructurePass(size_t max_inputs) : max_inputs_(max_inputs) {}

  bool operator()(int depth, Event event, json& parsed) {
    if (!error_.ok()) return false;
    if (!Keep(depth, event)) return false;
    if (depth == kRootKeyDepth && event == Event::key) {
      in_inputs_ = parsed == "inputs";
      if (in_inputs_ && seen_inputs_) Fail("\"inputs\" appears twice");
      seen_inputs_ = seen_inputs_ || in_inputs_;
      return true;
    }
    if (!in_inputs_) return true;
    if (depth == kInputDepth && event == Event::object_start) {
      if (counts_.size() >= max_inputs_) {
        Fail(absl::StrCat("a task takes at most ", max_inputs_, " input tensors"));
      }
      counts_.push_back(0);
      has_data_.push_back(false);
      return true;
    }
    if (depth == kInputKeyDepth && event == Event::key) {
      in_data_ = parsed == "data";
      if (in_data_ && !has_data_.empty()) {
        if (has_data_.back()) Fail("an input's \"data\" appears twice");
        has_data_.back() = true;
      }
      return true;
    }
    if (!in_data_ || counts_.empty()) return true;
    // Inside an input's "data": count its elements and keep none of them.
    if (event == Event::value && depth >= kInputKeyDepth) {
      if (!parsed.is_number()) Fail("tensor data must be numbers");
      ++counts_.back();
      return false;
    }
    if (event == Event::array_end && depth > kInputKeyDepth) return false;
    if ((event == Event::array_end || event == Event::object_end) && depth == kInputKeyDepth) {
      in_data_ = false;
    }
    if (event == Event::object_start && depth >= kInputKeyDepth) {
      Fail("tensor data must be numbers");
    }
    return true;
  }

  void Fail(std::string why) {
    if (error_.ok()) error_ = absl::InvalidArgumentError(std::move(why));
  }

  // Counts the values kept outside "data" (elements inside it are dropped, not kept).
  bool Keep(int depth, Event event) {
    const bool makes_value =
        event == Event::value || event == Event::object_start || event == Event::array_start;
    const bool inside_data = in_data_ && depth > kInputKeyDepth;
    if (!makes_value || inside_data) return true;
    if (++kept_ <= kMaxStructureValues) return true;
    Fail(absl::StrCat("an infer request may hold at most ", kMaxStructureValues,
                      " values besides its tensor data"));
    return false;
  }
  const absl::Status& error() const { return error_; }
  const std::vector<uint64_t>& counts() const { return counts_; }
  const std::vector<bool>& has_data() const { return has_data_; }

 private:
  const size_t max_inputs_;
  size_t kept_ = 0;
  absl::Status error_;
  bool seen_inputs_ = false;
  bool in_inputs_ = false;
  bool in_data_ = false;
  std::vector<uint64_t> counts_;
  std::vector<bool> has_data_;
};

// Pass two: each "data" element written straight into its tensor (sized by pass one), as SAX
// events so nothing is built. Only the elements' positions are tracked; pass one checked shape.
// Where one input's decoded elements go: its `data`, or its slice of the caller's placement.
struct DataTarget {
  proto::DType dtype = proto::DType::F32;
  uint8_t* bytes = nullptr;
  size_t size = 0;
};

class DataPass : public nlohmann::json_sax<json> {
 public:
  // A null target's elements are skipped (inputs given as binary data or in shared memory).
  explicit DataPass(std::vector<const DataTarget*> tensors) : tensors_(std::move(tensors)) {}

  bool null() override { return Scalar(); }
  bool boolean(bool) override { return Scalar(); }
  bool number_integer(number_integer_t v) override { return Integer(v, v >= 0); }
  bool number_unsigned(number_unsigned_t v) override {
    if (InData() && v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Put(static_cast<double>(v), /*integral=*/false, 0);
    }
    return Integer(static_cast<int64_t>(v), true);
  }
  bool number_float(number_float_t v, const string_t&) override {
    return InData() ? Put(v, /*integral=*/false, 0) : Scalar();
  }
  bool string(string_t&) override { return Scalar(); }
  bool binary(binary_t&) override { return Scalar(); }
  bool start_object(std::size_t) override {
    ++depth_;
    if (depth_ == kInputDepth + 1 && key_at_root_ == "inputs") ++input_;
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    if (depth_ == kRootKeyDepth) key_at_root_ = k;
    if (depth_ == kInputKeyDepth) key_in_input_ = k;
    return true;
  }
  bool start_array(std::size_t) override {
    ++depth_;
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    error_ = absl::InvalidArgumentError("the infer request changed between passes");
    return false;
  }
  const absl::Status& error() const { return error_; }
  // Bytes written into inputs[i]'s buffer.
  size_t written(int i) const {
    auto it = written_.find(i);
    return it == written_.end() ? 0 : it->second;
  }

 private:
  // A value inside inputs[input_].data (depth_ counts containers around the value).
  bool InData() const {
    return key_at_root_ == "inputs" && key_in_input_ == "data" && depth_ >= kInputKeyDepth &&
           input_ >= 0 && static_cast<size_t>(input_) < tensors_.size() &&
           tensors_[static_cast<size_t>(input_)] != nullptr;
  }
  bool Scalar() { return true; }
  bool Integer(int64_t v, bool) {
    if (!InData()) return true;
    return Put(static_cast<double>(v), /*integral=*/true, v);
  }
  // Appends one element as its tensor's dtype; range and kind errors stop the parse.
  bool Put(double as_double, bool integral, int64_t as_int) {
    const DataTarget& t = *tensors_[static_cast<size_t>(input_)];
    const size_t width = proto::DTypeBytes(t.dtype);
    size_t& at = written_.try_emplace(input_, 0).first->second;
    if (at + width > t.size) {
      error_ = absl::InvalidArgumentError("more data elements than the shape holds");
      return false;
    }
    uint8_t* dst = t.bytes + at;
    at += width;
    auto store = [dst](auto v) { std::memcpy(dst, &v, sizeof(v)); };
    switch (t.dtype) {
      case proto::DType::F32:
        store(static_cast<float>(as_double));
        return true;
      case proto::DType::F16:
        store(HalfBits(static_cast<float>(as_double)));
        return true;
      case proto::DType::BF16:
        store(BFloat16Bits(static_cast<float>(as_double)));
        return true;
      case proto::DType::I64:
      case proto::DType::I32:
      case proto::DType::U8:
        break;
      default:
        error_ = absl::InvalidArgumentError("unsupported datatype");
        return false;
    }
    if (!integral) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat(KserveDTypeName(t.dtype), " data must be integers"));
      return false;
    }
    if (t.dtype == proto::DType::I64) {
      store(as_int);
    } else if (t.dtype == proto::DType::I32) {
      if (as_int < std::numeric_limits<int32_t>::min() ||
          as_int > std::numeric_limits<int32_t>::max()) {
        error_ = absl::InvalidArgumentError("INT32 data out of range");
        return false;
      }
      store(static_cast<int32_t>(as_int));
    } else {
      if (as_int < 0 || as_int > 255) {
        error_ = absl::InvalidArgumentError("UINT8 data out of range");
        return false;
      }
      store(static_cast<uint8_t>(as_int));
    }
    return true;
  }

  std::vector<const DataTarget*> tensors_;
  absl::Status error_;
  int depth_ = 0;
  int input_ = -1;
  std::string key_at_root_;
  std::string key_in_input_;
  std::map<int, size_t> written_;
};

// A tensor's "parameters"."binary_data_size" (the binary tensor data extension), if given.
absl::StatusOr<std::optional<uint64_t>> BinarySize(const json& tensor) {
  auto p = tensor.find("parameters");
  if (p == tensor.end() || !p->is_object()) return std::nullopt;
  auto size = p->find("binary_data_size");
  if (size == p->end()) return std::nullopt;
  if (!size->is_number_unsigned()) {
    return absl::InvalidArgumentError("binary_data_size must be a byte count");
  }
  return size->get<uint64_t>();
}

// A tensor's Triton shared-memory parameters, if it names a region.
absl::StatusOr<std::optional<ShmReference>> ShmParameters(const json& tensor) {
  auto p = tensor.find("parameters");
  if (p == tensor.end() || !p->is_object()) return std::nullopt;
  auto region = p->find("shared_memory_region");
  if (region == p->end()) return std::nullopt;
  if (!region->is_string()) {
    return absl::InvalidArgumentError("shared_memory_region must be a region's name");
  }
  ShmReference ref;
  ref.region = region->get<std::string>();
  if (ref.region.empty()) return absl::InvalidArgumentError("shared_memory_region is empty");
  PSWITCH_RETURN_IF_ERROR(base::CheckText(ref.region, "shared_memory_region", 128));
  auto size = p->find("shared_memory_byte_size");
  if (size == p->end() || !size->is_number_unsigned()) {
    return absl::InvalidArgumentError(
        "a tensor in shared memory needs shared_memory_byte_size (a byte count)");
  }
  ref.bytes = size->get<uint64_t>();
  if (auto offset = p->find("shared_memory_offset"); offset != p->end()) {
    if (!offset->is_number_unsigned()) {
      return absl::InvalidArgumentError("shared_memory_offset must be a byte count");
    }
    ref.offset = offset->get<uint64_t>();
  }
  if (ref.offset > std::numeric_limits<uint64_t>::max() - ref.bytes) {
    return absl::InvalidArgumentError("shared_memory_offset + shared_memory_byte_size overflows");
  }
  return ref;
}

// One input's name, dtype and shape; `*json_bytes` its size when its data is JSON, or
// `*binary_part` its size when it comes as binary data (the next `*binary_part` of the
// `binary_left` bytes not yet claimed; copied only once reserved), or `*shm` the region slice it
// lies in (then neither: the bytes never pass through here).
absl::StatusOr<proto::HostTensor> InputHead(const json& in, bool has_data, uint64_t count,
                                            uint64_t& binary_left, size_t* json_bytes,
                                            uint64_t* binary_part,
                                            std::optional<ShmReference>* shm) {
  if (!in.is_object() || !in.contains("name") || !in["name"].is_string() || !in.contains("shape") ||
      !in["shape"].is_array() || !in.contains("datatype") || !in["datatype"].is_string()) {
    return absl::InvalidArgumentError(
        "each input needs \"name\", \"shape\", \"datatype\" and its data");
  }
  PSWITCH_ASSIGN_OR_RETURN(std::optional<uint64_t> binary_size, BinarySize(in));
  PSWITCH_ASSIGN_OR_RETURN(*shm, ShmParameters(in));
  if (shm->has_value() && (binary_size || has_data)) {
    return absl::InvalidArgumentError(
        "an input in shared memory has no \"data\" and no binary_data_size");
  }
  if (!binary_size && !has_data && !shm->has_value()) {
    return absl::InvalidArgumentError(
        "an input needs \"data\", a binary_data_size or a shared_memory_region");
  }
  proto::HostTensor t;
  t.name = in["name"].get<std::string>();
  PSWITCH_RETURN_IF_ERROR(base::CheckText(t.name, "input name", 128));
  std::optional<proto::DType> dtype = KserveDType(in["datatype"].get<std::string>());
  if (!dtype) {
    return absl::InvalidArgumentError(
        "datatype must be FP32, FP16, BF16, INT64, INT32 or UINT8 (as the model's metadata says)");
  }
  t.dtype = *dtype;
  for (const json& d : in["shape"]) {
    if (!d.is_number_integer()) return absl::InvalidArgumentError("shape must be integers");
    t.shape.push_back(d.get<int64_t>());
  }
  PSWITCH_ASSIGN_OR_RETURN(uint64_t elements, proto::ElementCount(t.shape));
  *json_bytes = 0;
  if (shm->has_value()) {
    const ShmReference& ref = **shm;
    const size_t width = proto::DTypeBytes(t.dtype);
    if (elements > std::numeric_limits<uint64_t>::max() / width || elements * width != ref.bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", t.name, "': shape holds ", elements, " elements of ", width,
                       " bytes, shared_memory_byte_size is ", ref.bytes));
    }
    t.place = proto::Place::Region;
    t.slice = proto::ByteSlice{0, ref.offset, ref.bytes};
    return t;
  }
  if (binary_size) {
    if (*binary_size > binary_left) {
      return absl::InvalidArgumentError(
          "binary_data_size runs past the end of the request's binary data");
    }
    const size_t width = proto::DTypeBytes(t.dtype);
    if (elements > std::numeric_limits<uint64_t>::max() / width ||
        elements * width != *binary_size) {
      return absl::InvalidArgumentError(absl::StrCat("input '", t.name, "': shape holds ", elements,
                                                     " elements, binary_data_size is ",
                                                     *binary_size, " bytes"));
    }
    *binary_part = *binary_size;
    binary_left -= *binary_size;
  } else {
    if (count != elements) {
      return absl::InvalidArgumentError(absl::StrCat("input '", t.name, "': shape holds ", elements,
                                                     " elements, data has ", count));
    }
    *json_bytes = static_cast<size_t>(elements) * proto::DTypeBytes(t.dtype);
  }
  return t;
}

// The region a request asked output `name` into; with one output in shared memory, that one
// (the model's output may be named otherwise than the request guessed).
std::string OutputRegionName(const InferRequest& request, const std::string& name) {
  for (const auto& [output, ref] : request.output_regions) {
    if (output == name) return ref.region;
  }
  return request.output_regions.empty() ? std::string()
                                        : request.output_regions.front().second.region;
}

bool IsTrue(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

// Appends `bytes`' elements (of `dtype`) as JSON numbers, row-major and flat (as the protocol
// allows).
void AppendNumbers(proto::DType dtype, absl::Span<const uint8_t> bytes, std::string& out) {
  const size_t width = std::max<size_t>(proto::DTypeBytes(dtype), 1);
  const size_t n = bytes.size() / width;
  out.reserve(out.size() + n * (dtype == proto::DType::F32 ? 14 : 4) + 2);
  out.push_back('[');
  char buf[32];
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out.push_back(',');
    const uint8_t* p = bytes.data() + i * width;
    std::to_chars_result r{buf, std::errc()};
    switch (dtype) {
      case proto::DType::F32: {
        float v;
        std::memcpy(&v, p, 4);
        if (!std::isfinite(v)) {  // JSON has no NaN or infinity (nlohmann also writes null)
          out.append("null");
          continue;
        }
        r = std::to_chars(buf, buf + sizeof(buf), v);
        break;
      }
      case proto::DType::F16:
      case proto::DType::BF16: {
        uint16_t bits;
        std::memcpy(&bits, p, 2);
        // Every half value is a float exactly: printed as its shortest float text.
        const float v = dtype == proto::DType::F16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
        if (!std::isfinite(v)) {
          out.append("null");
          continue;
        }
        r = std::to_chars(buf, buf + sizeof(buf), v);
        break;
      }
      case proto::DType::I64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        r = std::to_chars(buf, buf + sizeof(buf), v);
        break;
      }
      case proto::DType::I32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        r = std::to_chars(buf, buf + sizeof(buf), v);
        break;
      }
      case proto::DType::U8:
        r = std::to_chars(buf, buf + sizeof(buf), static_cast<int>(*p));
        break;
      default:
        out.append("null");
        continue;
    }
    out.append(buf, r.ptr);
  }
  out.push_back(']');
}

}  // namespace

std::optional<proto::DType> KserveDType(absl::string_view name) {
  const proto::DTypeInfo* info = proto::DTypeByKserve(name);
  if (info == nullptr || !info->kserve_input) return std::nullopt;
  return info->wire;
}

const char* KserveDTypeName(proto::DType dtype) {
  const proto::DTypeInfo* info = proto::FindDType(dtype);
  return info == nullptr ? "UNKNOWN" : info->kserve;
}

bool InferRequest::WantsBinary(const std::string& output) const {
  return all_outputs_binary ||
         std::find(binary_outputs.begin(), binary_outputs.end(), output) != binary_outputs.end();
}

namespace {

// DecodeInferRequest and DecodeInferHeader: `binary` holds the binary data (`binary_bytes` of
// it), or is null when it has not arrived (then `*binary_to` says where it goes).
absl::StatusOr<InferRequest> Decode(absl::string_view json_text, const uint8_t* binary,
                                    uint64_t binary_bytes, const InferRequestLimits& limits,
                                    const ReserveBytes& reserve, const PlaceInputs& place,
                                    std::vector<BinaryPlacement>* binary_to) {
  PSWITCH_RETURN_IF_ERROR(base::CheckJsonLimits(
      json_text, "infer request", base::JsonLimits{limits.max_json_bytes, limits.max_depth}));
  StructurePass structure(limits.max_inputs);
  json request = json::parse(json_text.begin(), json_text.end(), std::ref(structure),
                             /*allow_exceptions=*/false);
  PSWITCH_RETURN_IF_ERROR(structure.error());
  if (request.is_discarded()) return absl::InvalidArgumentError("the infer request is not JSON");
  if (!request.is_object() || !request.contains("inputs") || !request["inputs"].is_array()) {
    return absl::InvalidArgumentError("an infer request needs \"inputs\": [...]");
  }
  const json& inputs = request["inputs"];
  if (inputs.size() != structure.counts().size()) {
    return absl::InvalidArgumentError("each input must be an object");
  }
  InferRequest out;
  std::vector<size_t> json_bytes(inputs.size(), 0);
  std::vector<uint64_t> binary_parts(inputs.size(), 0);  // sizes, in the binary data's order
  uint64_t binary_left = binary_bytes;
  size_t decoded_bytes = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::optional<ShmReference> shm;
    PSWITCH_ASSIGN_OR_RETURN(proto::HostTensor t,
                             InputHead(inputs[i], structure.has_data()[i], structure.counts()[i],
                                       binary_left, &json_bytes[i], &binary_parts[i], &shm));
    decoded_bytes += json_bytes[i] + binary_parts[i];
    out.inputs.push_back(std::move(t));
    out.input_regions.push_back(std::move(shm));
  }
  if (binary_left != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(binary_left, " bytes of binary data belong to no input"));
  }
  if (reserve) PSWITCH_RETURN_IF_ERROR(reserve(decoded_bytes));
  // Where each input's bytes go: packed into the caller's placement (each at a 64-byte-aligned
  // offset), or each into its own `data`.
  std::vector<uint64_t> offsets(out.inputs.size(), 0);
  uint64_t placed_bytes = 0;
  for (size_t i = 0; i < out.inputs.size(); ++i) {
    const size_t bytes = json_bytes[i] + binary_parts[i];
    if (bytes == 0) continue;
    placed_bytes =
        (placed_bytes + kPlacementAlignment - 1) / kPlacementAlignment * kPlacementAlignment;
    offsets[i] = placed_bytes;
    placed_bytes += bytes;
  }
  uint8_t* placement = nullptr;
  if (binary == nullptr && !place) {
    return absl::InternalError("binary data that has not arrived needs a placement");
  }
  if (place) {
    PSWITCH_ASSIGN_OR_RETURN(placement, place(placed_bytes, out.inputs));
    if (placement == nullptr && placed_bytes > 0) {
      return absl::InternalError("no memory was given for the decoded inputs");
    }
  }
  std::vector<DataTarget> targets(out.inputs.size());
  for (size_t i = 0; i < out.inputs.size(); ++i) {
    proto::HostTensor& t = out.inputs[i];
    const size_t bytes = json_bytes[i] + binary_parts[i];
    targets[i].dtype = t.dtype;
    targets[i].size = bytes;
    if (bytes == 0) continue;
    if (placement != nullptr) {
      t.place = proto::Place::Region;
      t.slice = proto::ByteSlice{0, offsets[i], bytes};
      targets[i].bytes = placement + offsets[i];
    } else {
      t.data.resize(bytes);
      targets[i].bytes = t.data.data();
    }
    // Reserved: now the binary inputs' bytes are copied out of the body (the one copy they
    // take), or, not arrived yet, are to be received where they go.
    if (binary_parts[i] > 0) {
      if (binary != nullptr) {
        std::memcpy(targets[i].bytes, binary, binary_parts[i]);
      } else {
        binary_to->push_back(BinaryPlacement{offsets[i], binary_parts[i]});
      }
      binary += binary != nullptr ? binary_parts[i] : 0;
    }
  }
  std::vector<const DataTarget*> json_targets(out.inputs.size(), nullptr);
  bool any_json = false;
  for (size_t i = 0; i < out.inputs.size(); ++i) {
    if (json_bytes[i] > 0 || (structure.has_data()[i] && targets[i].size == 0)) {
      json_targets[i] = &targets[i];  // an empty tensor given as "data": [] is checked too
      any_json = any_json || json_bytes[i] > 0;
    }
  }
  if (any_json) {
    // Binary and shared-memory inputs' targets are null: DataPass writes only where a buffer is.
    DataPass data(json_targets);
    const bool parsed = json::sax_parse(json_text.begin(), json_text.end(), &data);
    PSWITCH_RETURN_IF_ERROR(data.error());
    if (!parsed) return absl::InvalidArgumentError("the infer request is not JSON");
    for (size_t i = 0; i < json_targets.size(); ++i) {
      if (json_targets[i] != nullptr && data.written(static_cast<int>(i)) != targets[i].size) {
        return absl::InvalidArgumentError("the infer request's data changed between passes");
      }
    }
  }
  for (const proto::HostTensor& t : out.inputs) {
    PSWITCH_RETURN_IF_ERROR(proto::ValidateHostTensor(t));
  }
  // Triton's request parameters: priority, and timeout in microseconds.
  if (auto p = request.find("parameters"); p != request.end() && p->is_object()) {
    if (auto priority = p->find("priority"); priority != p->end()) {
      if (!priority->is_number_integer()) {
        return absl::InvalidArgumentError("priority must be an integer");
      }
      out.priority =
          static_cast<int>(std::clamp<int64_t>(priority->get<int64_t>(), -1000000, 1000000));
    }
    if (auto timeout = p->find("timeout"); timeout != p->end()) {
      if (!timeout->is_number_unsigned()) {
        return absl::InvalidArgumentError("timeout must be microseconds");
      }
      const uint64_t us = std::min<uint64_t>(timeout->get<uint64_t>(), 86400ull * 1000000);
      if (us > 0) out.timeout_us = us;
    }
    if (auto slo = p->find("pswitch_online_slo_ms"); slo != p->end()) {
      if (!slo->is_number() || !(slo->get<double>() > 0) || !(slo->get<double>() < 1e12)) {
        return absl::InvalidArgumentError(
            "pswitch_online_slo_ms must be a positive number of milliseconds");
      }
      out.online_slo_us = std::max<uint64_t>(1, static_cast<uint64_t>(slo->get<double>() * 1000));
    }
    out.all_outputs_binary = IsTrue(*p, "binary_data_output");
  }
  if (auto outputs = request.find("outputs"); outputs != request.end() && outputs->is_array()) {
    for (const json& o : *outputs) {
      if (!o.is_object() || !o.contains("name") || !o["name"].is_string()) continue;
      auto p = o.find("parameters");
      if (p != o.end() && p->is_object() && IsTrue(*p, "binary_data")) {
        out.binary_outputs.push_back(o["name"].get<std::string>());
      }
      PSWITCH_ASSIGN_OR_RETURN(std::optional<ShmReference> shm, ShmParameters(o));
      if (shm) out.output_regions.emplace_back(o["name"].get<std::string>(), *std::move(shm));
    }
  }
  if (auto id = request.find("id"); id != request.end() && id->is_string()) {
    out.id = id->get<std::string>();
    if (!base::CheckText(out.id, "request id", 256).ok()) out.id.clear();
  }
  return out;
}

}  // namespace

absl::StatusOr<InferRequest> DecodeInferRequest(absl::string_view json_text,
                                                absl::string_view binary,
                                                const InferRequestLimits& limits,
                                                const ReserveBytes& reserve,
                                                const PlaceInputs& place) {
  // A non-null pointer even for no binary data: it says the data is here.
  static const uint8_t kNone = 0;
  const uint8_t* data = binary.empty() ? &kNone : reinterpret_cast<const uint8_t*>(binary.data());
  return Decode(json_text, data, binary.size(), limits, reserve, place, nullptr);
}

absl::StatusOr<InferRequest> DecodeInferHeader(absl::string_view json_text, uint64_t binary_bytes,
                                               const InferRequestLimits& limits,
                                               const ReserveBytes& reserve,
                                               const PlaceInputs& place,
                                               std::vector<BinaryPlacement>* binary_to) {
  binary_to->clear();
  absl::StatusOr<InferRequest> out =
      Decode(json_text, nullptr, binary_bytes, limits, reserve, place, binary_to);
  if (!out.ok()) binary_to->clear();
  return out;
}

EncodedInferResponse EncodeInferResponseParts(const std::string& model, const InferRequest& request,
                                              const std::vector<OutputView>& outputs) {
  // Names are checked text (model, request id, output names from the model's spec); dump()
  // escapes them.
  EncodedInferResponse out;
  std::string& body = out.json;
  body = "{\"model_name\":" + json(model).dump(-1, ' ', false, json::error_handler_t::replace) +
         ",\"model_version\":\"1\"";
  if (!request.id.empty())
    body += ",\"id\":" + json(request.id).dump(-1, ' ', false, json::error_handler_t::replace);
  body += ",\"outputs\":[";
  for (size_t i = 0; i < outputs.size(); ++i) {
    const proto::HostTensor& t = *outputs[i].head;
    if (i > 0) body.push_back(',');
    body += "{\"name\":" + json(t.name).dump(-1, ' ', false, json::error_handler_t::replace) +
            ",\"datatype\":\"" + KserveDTypeName(t.dtype) + "\",\"shape\":" + json(t.shape).dump();
    if (t.place == proto::Place::Region) {
      body += ",\"parameters\":{\"shared_memory_region\":" +
              json(OutputRegionName(request, t.name))
                  .dump(-1, ' ', false, json::error_handler_t::replace) +
              ",\"shared_memory_byte_size\":" + std::to_string(t.slice.length) +
              ",\"shared_memory_offset\":" + std::to_string(t.slice.offset) + "}}";
      continue;
    }
    if (request.WantsBinary(t.name)) {
      body +=
          ",\"parameters\":{\"binary_data_size\":" + std::to_string(outputs[i].bytes.size()) + "}}";
      out.binary.push_back(outputs[i].bytes);
      continue;
    }
    body += ",\"data\":";
    AppendNumbers(t.dtype, outputs[i].bytes, body);
    body.push_back('}');
  }
  body += "]}";
  return out;
}

std::string EncodeInferResponse(const std::string& model, const InferRequest& request,
                                const std::vector<proto::HostTensor>& outputs, size_t* json_bytes) {
  std::vector<OutputView> views;
  views.reserve(outputs.size());
  for (const proto::HostTensor& t : outputs) {
    views.push_back(OutputView{&t, absl::Span<const uint8_t>(t.data.data(), t.data.size())});
  }
  EncodedInferResponse parts = EncodeInferResponseParts(model, request, views);
  size_t binary_bytes = 0;
  for (absl::Span<const uint8_t> b : parts.binary) binary_bytes += b.size();
  *json_bytes = 0;
  if (binary_bytes == 0) return std::move(parts.json);
  *json_bytes = parts.json.size();
  std::string body = std::move(parts.json);
  body.reserve(body.size() + binary_bytes);
  for (absl::Span<const uint8_t> b : parts.binary) {
    body.append(reinterpret_cast<const char*>(b.data()), b.size());
  }
  return body;
}

}  // namespace pswitch::frontend
