#include "frontend/kserve_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pswitch::frontend {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

absl::StatusOr<InferRequest> Decode(const std::string& text, absl::string_view binary = {},
                                    size_t* reserved = nullptr) {
  return DecodeInferRequest(text, binary, InferRequestLimits{}, [reserved](size_t bytes) {
    if (reserved != nullptr) *reserved = bytes;
    return absl::OkStatus();
  });
}

template <typename T>
std::vector<T> Values(const proto::HostTensor& t) {
  std::vector<T> out(t.data.size() / sizeof(T));
  std::memcpy(out.data(), t.data.data(), t.data.size());
  return out;
}

TEST(KserveCodecTest, NestedDataIsWrittenRowMajorAsItsDtype) {
  size_t reserved = 0;
  auto r = Decode(R"({"id": "a", "inputs": [
      {"data": [[1.5, 2], [3, -4e1]], "name": "x", "shape": [2, 2], "datatype": "FP32"},
      {"name": "ids", "shape": [3], "datatype": "INT64", "data": [1, -2, 9007199254740993]},
      {"name": "m", "shape": [2], "datatype": "INT32", "data": [7, -7]},
      {"name": "b", "shape": [2], "datatype": "UINT8", "data": [0, 255]}]})",
                  {}, &reserved);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->inputs.size(), 4u);
  EXPECT_EQ(reserved, 16u + 24u + 8u + 2u);  // exactly the decoded bytes, before any is built
  EXPECT_EQ(Values<float>(r->inputs[0]), (std::vector<float>{1.5f, 2.f, 3.f, -40.f}));
  EXPECT_EQ(Values<int64_t>(r->inputs[1]), (std::vector<int64_t>{1, -2, 9007199254740993}));
  EXPECT_EQ(Values<int32_t>(r->inputs[2]), (std::vector<int32_t>{7, -7}));
  EXPECT_EQ(Values<uint8_t>(r->inputs[3]), (std::vector<uint8_t>{0, 255}));
  EXPECT_EQ(r->id, "a");
}

// Half-precision models (issue 28 item 5) take FP16 and BF16 tensors: JSON numbers rounded to
// nearest even as PyTorch rounds them, and back out as the exact float each one is.
TEST(KserveCodecTest, HalfPrecisionDataRoundToNearestEvenAndComeBackExactly) {
  auto r = Decode(R"({"inputs": [
      {"name": "h", "shape": [5], "datatype": "FP16", "data": [1, -2.5, 0.1, 65504, 1e6]},
      {"name": "b", "shape": [4], "datatype": "BF16", "data": [1, -2.5, 0.1, 1.00390625]}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  // float16: 0.1 is 0x2E66 (0.0999755859375), 65504 the largest finite, 1e6 overflows to inf.
  EXPECT_EQ(Values<uint16_t>(r->inputs[0]),
            (std::vector<uint16_t>{0x3C00, 0xC100, 0x2E66, 0x7BFF, 0x7C00}));
  // bfloat16: 0.1 is 0x3DCD; 1 + 2^-8 is a tie between 0x3F80 and 0x3F81: to the even 0x3F80.
  EXPECT_EQ(Values<uint16_t>(r->inputs[1]),
            (std::vector<uint16_t>{0x3F80, 0xC020, 0x3DCD, 0x3F80}));
  proto::HostTensor h = r->inputs[0], b = r->inputs[1];
  size_t json_bytes = 0;
  json j = json::parse(EncodeInferResponse("m", InferRequest{}, {h, b}, &json_bytes));
  EXPECT_EQ(j["outputs"][0]["datatype"], "FP16");
  // The shortest text of the float each one is (as FP32 outputs are written).
  EXPECT_EQ(j["outputs"][0]["data"][2].get<float>(), 0.0999755859375f);
  EXPECT_EQ(j["outputs"][0]["data"][3].get<float>(), 65504.f);
  EXPECT_TRUE(j["outputs"][0]["data"][4].is_null()) << "JSON has no infinity";
  EXPECT_EQ(j["outputs"][1]["datatype"], "BF16");
  EXPECT_EQ(j["outputs"][1]["data"][1].get<float>(), -2.5f);
  EXPECT_EQ(j["outputs"][1]["data"][2].get<float>(), 0.10009765625f);
}

TEST(KserveCodecTest, BinaryInputsComeFromTheBytesAfterTheHeader) {
  const float v[2] = {1.f, 2.f};
  const std::string binary(reinterpret_cast<const char*>(v), sizeof(v));
  size_t reserved = 0;
  auto r = Decode(R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",
                                  "parameters": {"binary_data_size": 8}}],
                      "outputs": [{"name": "y", "parameters": {"binary_data": true}}]})",
                  binary, &reserved);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(reserved, 8u) << "binary inputs are reserved before they are copied";
  EXPECT_EQ(Values<float>(r->inputs[0]), (std::vector<float>{1.f, 2.f}));
  EXPECT_TRUE(r->WantsBinary("y"));
  EXPECT_FALSE(r->WantsBinary("z"));
  // Bytes that belong to no input, and sizes past the end, are refused.
  EXPECT_FALSE(Decode(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                      "parameters": {"binary_data_size": 4}}]})",
                      binary)
                   .ok());
  EXPECT_FALSE(Decode(R"({"inputs": [{"name": "x", "shape": [4], "datatype": "FP32",
                                      "parameters": {"binary_data_size": 16}}]})",
                      binary)
                   .ok());
  auto wrong = Decode(R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",
                                      "parameters": {"binary_data_size": 4}},
                                     {"name": "z", "shape": [1], "datatype": "FP32",
                                      "parameters": {"binary_data_size": 4}}]})",
                      binary);
  EXPECT_THAT(wrong.status().message(), HasSubstr("binary_data_size is 4 bytes"));
}

TEST(KserveCodecTest, BadRequestsAreInvalidArgumentsThatSayWhy) {
  struct Case {
    std::string text, why;
  };
  const std::vector<Case> cases = {
      {"{not json", "not JSON"},
      {R"({"inputs": 3})", "needs \"inputs\""},
      {R"({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}]})",
       "shape holds 3 elements, data has 2"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1]}]})",
       "datatype must be"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1.5]}]})",
       "must be integers"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [3000000000]}]})",
       "out of range"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "UINT8", "data": [-1]}]})",
       "out of range"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ["1"]}]})",
       "must be numbers"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [{"a": 1}]}]})",
       "must be numbers"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
                        "data": [2]}]})",
       "appears twice"},
      {R"({"inputs": [], "inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                      "data": [1]}]})",
       "appears twice"},
      {R"({"inputs": [7]})", "must be an object"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]})", "needs \"data\""},
  };
  for (const Case& c : cases) {
    auto r = Decode(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(r.status().message(), HasSubstr(c.why)) << c.text;
  }
  std::string many = R"({"inputs": [)";
  for (int i = 0; i < 17; ++i) {
    many += std::string(i ? "," : "") +
            R"({"name": "x", "shape": [1], "datatype": "FP32", "data": [1]})";
  }
  EXPECT_THAT(Decode(many + "]}").status().message(), HasSubstr("at most 16"));
  EXPECT_FALSE(Decode(std::string(100, '[') + std::string(100, ']')).ok());  // too deep
}

// Before: everything but "data" was kept as a document, uncharged, and nlohmann's callback
// parser scans an object's parent as it closes (quadratic): a million "outputs" pinned a thread.
TEST(KserveCodecTest, ValuesBesidesTheTensorDataAreCapped) {
  std::string text =
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "outputs": [)";
  for (int i = 0; i < 5000; ++i) text += i ? ",{}" : "{}";
  text += "]}";
  auto r = Decode(text);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("at most 4096 values besides its tensor data"));
  // Tensor data does not count against it.
  std::string big = R"({"inputs": [{"name": "x", "shape": [100000], "datatype": "FP32", "data": [)";
  for (int i = 0; i < 100000; ++i) big += i ? ",1" : "1";
  EXPECT_TRUE(Decode(big + "]}]}").ok());
}

TEST(KserveCodecTest, ARefusedReservationBuildsNothing) {
  const std::string text =
      R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]})";
  auto r = DecodeInferRequest(text, {}, InferRequestLimits{},
                              [](size_t) { return absl::ResourceExhaustedError("full"); });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(KserveCodecTest, TheResponseRoundTripsThroughAJsonParser) {
  proto::HostTensor y{"y", proto::DType::F32, {2}, {}};
  const float v[2] = {0.1f, -3e-20f};
  y.data.assign(reinterpret_cast<const uint8_t*>(v), reinterpret_cast<const uint8_t*>(v) + 8);
  proto::HostTensor z{"z", proto::DType::I64, {1}, std::vector<uint8_t>(8, 0)};
  z.data[0] = 5;
  InferRequest request;
  request.id = "q\"1";
  size_t json_bytes = 99;
  std::string body = EncodeInferResponse("m", request, {y, z}, &json_bytes);
  EXPECT_EQ(json_bytes, 0u);
  json j = json::parse(body);
  EXPECT_EQ(j["id"], "q\"1");
  EXPECT_EQ(j["outputs"][0]["data"][0].get<float>(), 0.1f);  // shortest text, same float
  EXPECT_EQ(j["outputs"][0]["data"][1].get<float>(), -3e-20f);
  EXPECT_EQ(j["outputs"][1]["data"][0], 5);
  request.binary_outputs = {"y"};
  body = EncodeInferResponse("m", request, {y, z}, &json_bytes);
  ASSERT_GT(json_bytes, 0u);
  j = json::parse(body.substr(0, json_bytes));
  EXPECT_EQ(j["outputs"][0]["parameters"]["binary_data_size"], 8);
  EXPECT_EQ(body.substr(json_bytes), std::string(reinterpret_cast<const char*>(v), 8));
}

// Triton's shared-memory parameters (as tritonclient's set_shared_memory sends them): the input
// becomes a slice of the named region, its bytes never pass through the codec.
TEST(KserveCodecTest, SharedMemoryInputsAndOutputsAreSlicesNotData) {
  size_t reserved = 99;
  auto r = Decode(R"({"inputs": [
      {"name": "x", "shape": [2, 4], "datatype": "FP32",
       "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 32,
                      "shared_memory_offset": 64}},
      {"name": "m", "shape": [2], "datatype": "INT32", "data": [1, 2]}],
      "outputs": [{"name": "output", "parameters": {"shared_memory_region": "out",
                                                    "shared_memory_byte_size": 4096}}]})",
                  {}, &reserved);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(reserved, 8u) << "only the JSON input is decoded here";
  ASSERT_EQ(r->inputs.size(), 2u);
  EXPECT_EQ(r->inputs[0].place, proto::Place::Region);
  EXPECT_TRUE(r->inputs[0].data.empty());
  EXPECT_EQ(r->inputs[0].slice, (proto::ByteSlice{0, 64, 32}));
  ASSERT_TRUE(r->input_regions[0].has_value());
  EXPECT_EQ(r->input_regions[0]->region, "in");
  EXPECT_FALSE(r->input_regions[1].has_value());
  EXPECT_EQ(r->inputs[1].place, proto::Place::Inline);
  ASSERT_EQ(r->output_regions.size(), 1u);
  EXPECT_EQ(r->output_regions[0].first, "output");
  EXPECT_EQ(r->output_regions[0].second.region, "out");
  EXPECT_EQ(r->output_regions[0].second.offset, 0u);
  EXPECT_EQ(r->output_regions[0].second.bytes, 4096u);
}

TEST(KserveCodecTest, SharedMemoryParametersAreChecked) {
  const char* bad[] = {
      // byte size does not match the shape
      R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters":
          {"shared_memory_region": "in", "shared_memory_byte_size": 12}}]})",
      // no byte size
      R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters":
          {"shared_memory_region": "in"}}]})",
      // data as well
      R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2],
          "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 8}}]})",
      // offset + size overflows
      R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters":
          {"shared_memory_region": "in", "shared_memory_byte_size": 8,
           "shared_memory_offset": 18446744073709551615}}]})",
      // a region that is not a name
      R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters":
          {"shared_memory_region": 7, "shared_memory_byte_size": 8}}]})",
      R"({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}],
          "outputs": [{"name": "y", "parameters": {"shared_memory_region": "out",
                                                   "shared_memory_byte_size": -1}}]})",
  };
  for (const char* text : bad) {
    auto r = Decode(text);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << text << " -> " << r.status();
  }
}

TEST(KserveCodecTest, AnOutputInSharedMemoryIsListedWithoutData) {
  InferRequest request;
  request.all_outputs_binary = true;  // shared memory wins over binary data
  request.output_regions.emplace_back("output", ShmReference{"out", 0, 4096});
  proto::HostTensor t;
  t.name = "output";
  t.dtype = proto::DType::F32;
  t.shape = {1, 10};
  t.place = proto::Place::Region;
  t.slice = proto::ByteSlice{7, 0, 40};
  size_t json_bytes = 1;
  const std::string body = EncodeInferResponse("m", request, {t}, &json_bytes);
  EXPECT_EQ(json_bytes, 0u) << "no binary part";
  const json j = json::parse(body);
  const json& out = j["outputs"][0];
  EXPECT_EQ(out["name"], "output");
  EXPECT_EQ(out["shape"], json({1, 10}));
  EXPECT_FALSE(out.contains("data"));
  EXPECT_EQ(out["parameters"]["shared_memory_region"], "out");
  EXPECT_EQ(out["parameters"]["shared_memory_byte_size"], 40);
  EXPECT_EQ(out["parameters"]["shared_memory_offset"], 0);
}

// With a placement (the HTTP port's staging region), inputs are decoded straight into it, packed
// at 64-byte-aligned offsets, and become slices of it; shared-memory inputs stay where they are.
TEST(KserveCodecTest, PlacedInputsAreDecodedIntoTheGivenMemory) {
  const int32_t binary_values[3] = {5, 6, 7};
  const std::string binary(reinterpret_cast<const char*>(binary_values), sizeof(binary_values));
  std::vector<uint8_t> memory(256, 0xaa);
  size_t asked = 0;
  std::vector<std::string> heads;
  auto r = DecodeInferRequest(
      R"({"inputs": [
          {"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2.5, -3]},
          {"name": "s", "shape": [2], "datatype": "FP32", "parameters":
              {"shared_memory_region": "in", "shared_memory_byte_size": 8}},
          {"name": "b", "shape": [3], "datatype": "INT32", "parameters": {"binary_data_size": 12}}]})",
      binary, InferRequestLimits{}, [](size_t) { return absl::OkStatus(); },
      [&](size_t bytes, const std::vector<proto::HostTensor>& inputs) -> absl::StatusOr<uint8_t*> {
        asked = bytes;
        for (const proto::HostTensor& t : inputs) heads.push_back(t.name);
        return memory.data();
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(asked, 64u + 12u) << "x at 0, b at the next 64-byte boundary";
  EXPECT_EQ(heads, (std::vector<std::string>{"x", "s", "b"}));
  EXPECT_EQ(r->inputs[0].place, proto::Place::Region);
  EXPECT_EQ(r->inputs[0].slice, (proto::ByteSlice{0, 0, 12}));
  EXPECT_TRUE(r->inputs[0].data.empty());
  float x[3];
  std::memcpy(x, memory.data(), sizeof(x));
  EXPECT_EQ(x[0], 1.f);
  EXPECT_EQ(x[1], 2.5f);
  EXPECT_EQ(x[2], -3.f);
  EXPECT_EQ(r->inputs[1].slice, (proto::ByteSlice{0, 0, 8})) << "shared memory: not placed";
  ASSERT_TRUE(r->input_regions[1].has_value());
  EXPECT_EQ(r->inputs[2].slice, (proto::ByteSlice{0, 64, 12}));
  EXPECT_EQ(std::memcmp(memory.data() + 64, binary.data(), 12), 0);
  EXPECT_EQ(memory[76], 0xaa) << "nothing written past the inputs";

  // A placement that fails stops the decoding with its error.
  auto refused = DecodeInferRequest(
      R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]})", {},
      InferRequestLimits{}, nullptr,
      [](size_t, const std::vector<proto::HostTensor>&) -> absl::StatusOr<uint8_t*> {
        return absl::ResourceExhaustedError("no room");
      });
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
}

// A header decoded before its binary data arrives says where each binary input's bytes go (in
// the order they come, at their inputs' aligned places) instead of copying them; receiving the
// data there gives exactly what decoding the whole body into the same placement gives.
TEST(KserveCodecTest, AHeaderDecodedAheadOfItsBinaryDataPlacesItWhereTheWholeBodyWould) {
  const std::string header = R"({"inputs": [
      {"name": "a", "shape": [3], "datatype": "INT32", "parameters": {"binary_data_size": 12}},
      {"name": "x", "shape": [2], "datatype": "FP32", "data": [1.5, -2]},
      {"name": "b", "shape": [5], "datatype": "UINT8", "parameters": {"binary_data_size": 5}}],
      "outputs": [{"name": "y", "parameters": {"binary_data": true}}]})";
  std::string binary(17, '\0');
  for (size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<char>(3 * i + 1);
  auto placement = [](std::vector<uint8_t>& memory) {
    return
        [&memory](size_t bytes, const std::vector<proto::HostTensor>&) -> absl::StatusOr<uint8_t*> {
          memory.assign(bytes, 0xaa);
          return memory.data();
        };
  };
  std::vector<uint8_t> whole_memory, staged_memory;
  auto whole =
      DecodeInferRequest(header, binary, InferRequestLimits{}, nullptr, placement(whole_memory));
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<BinaryPlacement> parts;
  auto staged = DecodeInferHeader(header, binary.size(), InferRequestLimits{}, nullptr,
                                  placement(staged_memory), &parts);
  ASSERT_TRUE(staged.ok()) << staged.status();
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].offset, 0u);
  EXPECT_EQ(parts[0].bytes, 12u);
  EXPECT_EQ(parts[1].offset, 128u) << "a at 0, x at 64, b at 128";
  EXPECT_EQ(parts[1].bytes, 5u);
  EXPECT_EQ(staged_memory[0], 0xaa) << "no binary byte is written before it arrives";
  // What the kernel's reads would do: the data in order, into the parts.
  size_t at = 0;
  for (const BinaryPlacement& p : parts) {
    std::memcpy(staged_memory.data() + p.offset, binary.data() + at, p.bytes);
    at += p.bytes;
  }
  EXPECT_EQ(staged_memory, whole_memory);
  ASSERT_EQ(staged->inputs.size(), whole->inputs.size());
  for (size_t i = 0; i < whole->inputs.size(); ++i) {
    EXPECT_EQ(staged->inputs[i].slice, whole->inputs[i].slice) << i;
    EXPECT_EQ(staged->inputs[i].shape, whole->inputs[i].shape) << i;
  }
  EXPECT_EQ(staged->binary_outputs, whole->binary_outputs);

  // Sizes that do not add up are refused as the whole body's are, and nothing is placed.
  auto short_data = DecodeInferHeader(header, binary.size() - 1, InferRequestLimits{}, nullptr,
                                      placement(staged_memory), &parts);
  EXPECT_TRUE(absl::IsInvalidArgument(short_data.status())) << short_data.status();
  auto extra_data = DecodeInferHeader(header, binary.size() + 1, InferRequestLimits{}, nullptr,
                                      placement(staged_memory), &parts);
  EXPECT_TRUE(absl::IsInvalidArgument(extra_data.status())) << extra_data.status();
  EXPECT_TRUE(parts.empty());
  // Data that has not arrived needs somewhere to go.
  auto nowhere =
      DecodeInferHeader(header, binary.size(), InferRequestLimits{}, nullptr, nullptr, &parts);
  EXPECT_FALSE(nowhere.ok());
}

// The response in parts (JSON, then the binary outputs' bytes as views of where they lie) is the
// one-string response cut at its Inference-Header-Content-Length.
TEST(KserveCodecTest, AResponseInPartsIsTheWholeResponseUncopied) {
  proto::HostTensor y{"y", proto::DType::F32, {2}, {}};
  y.data.resize(8);
  const float yv[2] = {0.25f, -1};
  std::memcpy(y.data.data(), yv, 8);
  proto::HostTensor z{"z", proto::DType::I32, {1}, {}};
  z.data = {1, 0, 0, 0};
  InferRequest request;
  request.id = "r";
  request.binary_outputs = {"y"};
  size_t json_bytes = 0;
  const std::string whole = EncodeInferResponse("m", request, {y, z}, &json_bytes);
  const std::vector<uint8_t> elsewhere = y.data;  // y's bytes where a staging region has them
  EncodedInferResponse parts =
      EncodeInferResponseParts("m", request,
                               {OutputView{&y, absl::MakeConstSpan(elsewhere)},
                                OutputView{&z, absl::MakeConstSpan(z.data)}});
  ASSERT_EQ(parts.binary.size(), 1u);
  EXPECT_EQ(parts.binary[0].data(), elsewhere.data()) << "a view, not a copy";
  EXPECT_EQ(parts.json.size(), json_bytes);
  EXPECT_EQ(parts.json + std::string(elsewhere.begin(), elsewhere.end()), whole);
}

TEST(KserveCodecTest, AnOnlineObjectiveIsAPositiveNumberOfMilliseconds) {
  const std::string input =
      R"("inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [1]}])";
  auto online =
      Decode(absl::StrCat(R"({"parameters": {"pswitch_online_slo_ms": 2.5}, )", input, "}"));
  ASSERT_TRUE(online.ok()) << online.status();
  EXPECT_EQ(online->online_slo_us, 2500u);
  auto plain = Decode(absl::StrCat("{", input, "}"));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->online_slo_us);
  for (const char* bad : {"0", "-3", "\"5\"", "1e300"}) {
    auto refused = Decode(
        absl::StrCat(R"({"parameters": {"pswitch_online_slo_ms": )", bad, "}, ", input, "}"));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace pswitch::frontend
